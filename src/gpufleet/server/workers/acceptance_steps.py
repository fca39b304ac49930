"""One acceptance run, one step at a time: checks → verdicts → report → gating.

Stages (``acceptance_run.stage``): ``node`` (node-level check runs, a batch per group of
nodes that arrived together) → ``cluster`` (the cluster-wide check runs over the nodes
that passed the node level) → ``gating`` (report written; nodes and cluster move) →
``done``. A repair's run ends at ``done`` right after its report: the repair's verifying
step reads the outcome and moves the node itself.

How a node's verdict is made: the worst of its node-level checks (pass, warn: passed;
skipped: it ran a job and the run was not forced; fail); then, at cluster level, a
failed cluster-wide run fails the nodes it (or its localisation) pinned. A failure
pinned on nobody (a slow fabric that bisecting could not narrow to a node) fails the run
without cordoning anyone: those nodes stay in acceptance and the cluster with them,
with the reason in its status detail, until an admin runs the suite again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.models import CheckKind
from gpufleet.core.acceptance import (
    AcceptanceScope,
    AcceptanceStatus,
    AcceptanceSuite,
    AcceptanceTrigger,
    SuiteCheck,
    content_hash,
)
from gpufleet.core.enums import AcceptanceStage, CheckStatus, ClusterStatus, EventKind, NodeState
from gpufleet.server.db.tables import AcceptanceRunRow, CheckRunRow, ClusterRow, GpuRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.acceptance import ACTOR, held_by_startup, settle_cluster_status
from gpufleet.server.services.acceptance_report import (
    CheckEntry,
    build_report,
    entries_of,
    localised,
    node_results,
    worst,
)
from gpufleet.server.services.acceptance_status import (
    switch_acceptance_stage,
    switch_acceptance_status,
)
from gpufleet.server.services.checks import (
    CHECKABLE_STATES,
    ENDED,
    create_check_run,
    switch_check_status,
)
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_holds import Release, record_release, release_in_scheduler
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)

PASSING = frozenset({"pass", "warn"})  # a node that passed goes in service
FAILING = "fail"  # a node that failed is cordoned (when the failure is pinned on it)


class AcceptanceSteps(LoopService):
    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        failpoints: Failpoints | None = None,
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.failpoints = failpoints or Failpoints()
        self.steps = 0

    def node_to(
        self,
        session: AsyncSession,
        node: NodeRow,
        cluster: ClusterRow,
        target: NodeState,
        reason: str,
        *,
        detail: str = "",
    ) -> None:
        switch_node_state(
            session,
            node=node,
            project_id=cluster.project_id,
            target=target,
            actor=ACTOR,
            reason=reason,
            now=self.clock.now(),
        )
        node.state_detail = detail[:4000]

    def release_node(
        self,
        session: AsyncSession,
        node: NodeRow,
        cluster: ClusterRow,
        release: Release,
        reason: str,
        *,
        kept_detail: str,
    ) -> None:
        """After ``release_in_scheduler``: in service, or cordoned with ``kept_detail``
        and whose drain keeps it out."""
        record_release(
            session, node=node, project_id=cluster.project_id, release=release, actor=ACTOR,
            reason=reason, now=self.clock.now(),
        )  # fmt: skip
        kept = release.kept_by
        node.state_detail = (
            "" if kept is None else f"{kept_detail}; drained by someone else ({kept!r})"
        )[:4000]

    async def step_run(self, run_id: str) -> None:
        """Take one run one step on. Safe to call again at any time."""
        async with self.db.session() as session:
            run = await session.get(AcceptanceRunRow, run_id)
            if run is None or run.stage == AcceptanceStage.DONE:
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            if cluster is None:
                return
        self.steps += 1
        if run.stage == AcceptanceStage.GATING:
            await self._gate(run.id)
            return
        if cluster.status in (ClusterStatus.DELETING.value, ClusterStatus.DELETED.value):
            await self._finish(run.id, AcceptanceStatus.CANCELLED, "the cluster is being deleted")
            return
        if run.trigger == AcceptanceTrigger.PROVISIONING.value and not cluster.acceptance_tests:
            await self._finish(
                run.id, AcceptanceStatus.CANCELLED, "acceptance tests were turned off"
            )
            return
        suite = AcceptanceSuite.model_validate(run.suite)
        now = self.clock.now()
        started = run.started_at or now
        if (now - started).total_seconds() > suite.timeout_s:
            await self._finish(
                run.id,
                AcceptanceStatus.ERROR,
                f"the suite did not finish within {suite.timeout_s:.0f} s; what had not "
                "finished fails",
            )
            return
        if run.stage == AcceptanceStage.NODE:
            await self._node_stage(run, cluster, suite)
        elif run.stage == AcceptanceStage.CLUSTER:
            await self._cluster_stage(run)

    # -- node level --------------------------------------------------------------------

    async def _node_stage(
        self, run: AcceptanceRunRow, cluster: ClusterRow, suite: AcceptanceSuite
    ) -> None:
        entries = entries_of(run)
        excluded = _excluded(run)
        node_entries = _node_level(entries)
        covered = {n for e in node_entries for n in e.node_ids} | set(excluded)
        new = [n for n in run.node_ids if n not in covered]
        checks = await self._check_rows(node_entries)
        steps = len(suite.node_checks())
        if (
            new
            or _next_steps(node_entries, checks, steps)
            or run.status == AcceptanceStatus.PENDING
        ):
            await self._start_node_checks(run.id, suite)
            self.failpoints.hit("acceptance.node.after_start")
            return
        outcomes = _node_outcomes(run.node_ids, node_entries, checks, excluded, steps)
        pending = [e for e in node_entries if not _ended(checks.get(e.check_run_id))]
        if pending:
            labels = ", ".join(sorted({e.label for e in pending}))
            await self._progress(run.id, outcomes, f"node-level checks running: {labels}")
            return
        if (
            run.trigger == AcceptanceTrigger.PROVISIONING.value
            and run.scope == AcceptanceScope.CLUSTER
        ):
            booting = await self._booting(cluster.id)
            if booting:
                await self._progress(
                    run.id,
                    outcomes,
                    f"node-level checks done on {len(run.node_ids)} node(s); waiting for "
                    f"{booting} machine(s) still coming up",
                )
                return
        cluster_checks = suite.cluster_checks() if run.scope == AcceptanceScope.CLUSTER else []
        passed = [n for n in run.node_ids if outcomes[n]["outcome"] in PASSING]
        if cluster_checks and len(passed) >= 2:
            await self._start_cluster_checks(run.id, cluster_checks, passed, suite, outcomes)
            self.failpoints.hit("acceptance.cluster.after_start")
            return
        note = ""
        if cluster_checks:
            note = f"; cluster-wide checks skipped: {len(passed)} node(s) passed, they need 2"
        await self._finish(run.id, None, note=note, outcomes=outcomes)

    async def _start_node_checks(self, run_id: str, suite: AcceptanceSuite) -> None:
        """New nodes get a batch and its first node-level check; a batch whose check
        ended gets its next one, for the nodes that passed so far."""
        async with self.db.transaction() as session:
            run = await session.get(AcceptanceRunRow, run_id, with_for_update=True)
            if run is None or run.stage != AcceptanceStage.NODE:
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            assert cluster is not None
            now = self.clock.now()
            entries = entries_of(run)
            excluded = _excluded(run)
            node_checks = suite.node_checks()
            covered = {n for e in _node_level(entries) for n in e.node_ids}
            covered |= set(excluded)
            rows = {
                r.id: r
                for r in await session.scalars(
                    select(NodeRow).where(NodeRow.id.in_(list(run.node_ids)))
                )
            }
            batch = []
            for node_id in run.node_ids:
                if node_id in covered:
                    continue
                node = rows.get(node_id)
                if node is None or NodeState(node.state) not in CHECKABLE_STATES:
                    state = node.state if node is not None else "gone"
                    excluded[node_id] = f"the node is {state}: no check can run on it"
                    continue
                batch.append(node_id)
            checks = {
                r.id: r
                for r in await session.scalars(
                    select(CheckRunRow).where(
                        CheckRunRow.id.in_([e.check_run_id for e in entries if e.check_run_id])
                    )
                )
            }
            todo = _next_steps(_node_level(entries), checks, len(node_checks))
            if batch:
                number = 1 + max((e.batch for e in _node_level(entries)), default=-1)
                todo.append((number, 0, batch))
            force = bool((run.results or {}).get("force"))
            fabric = suite.fabric_for(cluster.gpu_model)
            for number, step, node_ids in todo:
                if not node_checks:
                    # No node-level check in the suite: judged on the cluster-wide ones.
                    entries.append(
                        CheckEntry(
                            "", "none", "none", AcceptanceStage.NODE, tuple(node_ids), number
                        )
                    )
                    continue
                check = node_checks[step]
                row = await create_check_run(
                    session,
                    actor=ACTOR,
                    cluster=cluster,
                    kind=CheckKind(check.kind),
                    node_ids=node_ids,
                    params=_params(check, fabric),
                    force=force,
                    purpose="acceptance",
                    now=now,
                )
                entries.append(
                    CheckEntry(
                        row.id,
                        check.kind,
                        check.label,
                        AcceptanceStage.NODE,
                        tuple(node_ids),
                        number,
                        step,
                    )
                )
            run.results = {
                **(run.results or {}),
                "checks": [e.to_json() for e in entries],
                "excluded": excluded,
            }
            run.check_run_ids = [e.check_run_id for e in entries if e.check_run_id]
            labels = ", ".join(sorted({node_checks[s].label for _, s, _ in todo if node_checks}))
            run.detail = f"node-level checks running: {labels or 'none'}"
            run.updated_at = now
            switch_acceptance_status(
                session,
                run=run,
                project_id=cluster.project_id,
                target=AcceptanceStatus.RUNNING,
                actor=ACTOR,
                reason=run.detail,
                now=now,
            )

    async def _start_cluster_checks(
        self,
        run_id: str,
        checks: Sequence[SuiteCheck],
        node_ids: list[str],
        suite: AcceptanceSuite,
        outcomes: dict[str, dict[str, Any]],
    ) -> None:
        async with self.db.transaction() as session:
            run = await session.get(AcceptanceRunRow, run_id, with_for_update=True)
            if run is None or run.stage != AcceptanceStage.NODE:
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            assert cluster is not None
            now = self.clock.now()
            entries = entries_of(run)
            fabric = suite.fabric_for(cluster.gpu_model)
            for check in checks:
                row = await create_check_run(
                    session,
                    actor=ACTOR,
                    cluster=cluster,
                    kind=CheckKind(check.kind),
                    node_ids=node_ids,
                    params=_params(check, fabric),
                    force=bool((run.results or {}).get("force")),
                    purpose="acceptance",
                    now=now,
                )
                entries.append(
                    CheckEntry(
                        row.id, check.kind, check.label, AcceptanceStage.CLUSTER, tuple(node_ids)
                    )
                )
            run.results = {
                **(run.results or {}),
                "checks": [e.to_json() for e in entries],
                "nodes": outcomes,
            }
            run.check_run_ids = [e.check_run_id for e in entries if e.check_run_id]
            run.detail = f"cluster-wide checks running across {len(node_ids)} node(s)"
            run.updated_at = now
            switch_acceptance_stage(
                session,
                run=run,
                project_id=cluster.project_id,
                target=AcceptanceStage.CLUSTER,
                actor=ACTOR,
                reason=run.detail,
                now=now,
            )

    # -- cluster level -----------------------------------------------------------------

    async def _cluster_stage(self, run: AcceptanceRunRow) -> None:
        entries = entries_of(run)
        checks = await self._check_rows(entries)
        if any(not _ended(checks.get(e.check_run_id)) for e in entries if e.check_run_id):
            return
        steps = len(AcceptanceSuite.model_validate(run.suite).node_checks())
        outcomes = _node_outcomes(
            run.node_ids,
            _node_level(entries),
            checks,
            _excluded(run),
            steps,
        )
        names = await self._names(run.node_ids)
        retried: dict[str, str] = dict((run.results or {}).get("retried") or {})
        again = [
            e
            for e in entries
            if e.stage is AcceptanceStage.CLUSTER
            and e.check_run_id not in retried  # a retry is not retried
            and (row := checks.get(e.check_run_id)) is not None
            and CheckStatus(row.status) is not CheckStatus.PASSED
            and not localised(row, names)[2]
        ]
        if again:
            # Failed across the cluster and bisecting pinned nobody: often a transient
            # (a link that flapped, a neighbour's burst). Once more before it is called a
            # fabric problem that holds every node until an admin acts.
            await self._retry_cluster_checks(run.id, again, checks)
            return
        unpinned: list[str] = []
        for entry in (e for e in entries if e.stage is AcceptanceStage.CLUSTER):
            row = checks.get(entry.check_run_id)
            if row is None:
                continue
            if CheckStatus(row.status) is CheckStatus.PASSED:
                continue
            bad, _good, pinned = localised(row, names)
            results = node_results(row)
            if not pinned:
                why = _why(row)
                unpinned.append(f"{entry.label}: {why}")
                for node_id in entry.node_ids:
                    outcomes[node_id] = {
                        "outcome": "fail",
                        "reasons": [
                            *outcomes[node_id]["reasons"],
                            f"{entry.label} across {len(entry.node_ids)} nodes failed and no "
                            f"node was pinned: {why}",
                        ],
                        "unpinned": True,
                    }
                continue
            for node_id in bad:
                mine = results.get(node_id) or {"reasons": []}
                reasons = mine["reasons"] or [f"{entry.label}: localised to this node"]
                outcomes[node_id] = {
                    "outcome": "fail",
                    "reasons": [*outcomes[node_id]["reasons"], *reasons],
                }
        note = f"; not pinned on a node: {'; '.join(unpinned)}" if unpinned else ""
        await self._finish(run.id, None, note=note, outcomes=outcomes)

    async def _retry_cluster_checks(
        self, run_id: str, again: Sequence[CheckEntry], checks: dict[str, CheckRunRow]
    ) -> None:
        """Each entry's check run once more on the same nodes; the entry takes the new
        run (the report shows the final attempt), ``results.retried`` maps new → old."""
        async with self.db.transaction() as session:
            run = await session.get(AcceptanceRunRow, run_id, with_for_update=True)
            if run is None or run.stage != AcceptanceStage.CLUSTER:
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            assert cluster is not None
            now = self.clock.now()
            retried: dict[str, str] = dict((run.results or {}).get("retried") or {})
            replaced: dict[str, str] = {}
            for entry in again:
                old = checks[entry.check_run_id]
                row = await create_check_run(
                    session,
                    actor=ACTOR,
                    cluster=cluster,
                    kind=CheckKind(old.kind),
                    node_ids=list(entry.node_ids),
                    params=dict(old.params or {}),
                    force=bool((run.results or {}).get("force")),
                    purpose="acceptance",
                    now=now,
                )
                replaced[entry.check_run_id] = row.id
                retried[row.id] = entry.check_run_id
            entries = [
                dataclasses.replace(e, check_run_id=replaced.get(e.check_run_id, e.check_run_id))
                for e in entries_of(run)
            ]
            run.results = {
                **(run.results or {}),
                "checks": [e.to_json() for e in entries],
                "retried": retried,
            }
            run.check_run_ids = [e.check_run_id for e in entries if e.check_run_id]
            labels = ", ".join(sorted({e.label for e in again}))
            run.detail = f"{labels} failed and localisation pinned no node: running it again"
            run.updated_at = now

    # -- finishing ----------------------------------------------------------------------

    async def _finish(
        self,
        run_id: str,
        status: AcceptanceStatus | None,
        detail: str = "",
        *,
        note: str = "",
        outcomes: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Write the verdicts and the report; ``status`` None: passed or failed by the
        verdicts. Check runs still open (a timeout, a cancel) are cancelled."""
        async with self.db.transaction() as session:
            run = await session.get(AcceptanceRunRow, run_id, with_for_update=True)
            if run is None or run.stage not in (AcceptanceStage.NODE, AcceptanceStage.CLUSTER):
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            assert cluster is not None
            now = self.clock.now()
            entries = entries_of(run)
            ids = [e.check_run_id for e in entries if e.check_run_id]
            checks = {
                r.id: r
                for r in await session.scalars(select(CheckRunRow).where(CheckRunRow.id.in_(ids)))
            }
            for row in checks.values():
                if CheckStatus(row.status) not in ENDED:
                    switch_check_status(
                        session,
                        run=row,
                        project_id=cluster.project_id,
                        target=CheckStatus.CANCELLED,
                        actor=ACTOR,
                        reason=f"acceptance run {run.id} ended: {detail or 'done'}",
                        now=now,
                    )
                    if row.started_at is not None:
                        row.progress = {**(row.progress or {}), "cleanup": True}
            if outcomes is None:
                steps = len(AcceptanceSuite.model_validate(run.suite).node_checks())
                outcomes = _node_outcomes(
                    run.node_ids,
                    _node_level(entries),
                    checks,
                    _excluded(run),
                    steps,
                )
            for node_id in run.node_ids:
                mine = outcomes.get(node_id)
                if mine is None or mine.get("outcome") == "pending":
                    why = detail or "no verdict"
                    outcomes[node_id] = {"outcome": "fail", "reasons": [f"not judged: {why}"]}
                else:
                    outcomes[node_id] = mine
            failed = [n for n in run.node_ids if outcomes[n]["outcome"] == FAILING]
            if status is None:
                status = AcceptanceStatus.FAILED if failed else AcceptanceStatus.PASSED
            names = {
                n.id: n
                for n in await session.scalars(select(NodeRow).where(NodeRow.id.in_(run.node_ids)))
            }
            failed_names = sorted(names[n].name if n in names else n for n in failed)
            if not detail:
                if status is AcceptanceStatus.PASSED:
                    detail = f"passed on all {len(run.node_ids)} node(s)"
                else:
                    detail = (
                        f"failed on {len(failed)} of {len(run.node_ids)} node(s): "
                        + ", ".join(failed_names[:20])
                    )
            detail += note
            gpus: dict[str, list[GpuRow]] = {}
            for gpu in await session.scalars(
                select(GpuRow).where(GpuRow.node_id.in_(run.node_ids), GpuRow.removed_at.is_(None))
            ):
                gpus.setdefault(gpu.node_id, []).append(gpu)
            report = build_report(
                run=run,
                cluster=cluster,
                nodes=list(names.values()),
                gpus=gpus,
                checks=[(e, checks.get(e.check_run_id)) for e in entries if e.check_run_id],
                outcomes=outcomes,
                status=status.value,
                detail=detail,
            )
            run.report = report
            run.report_sha256 = content_hash(report)
            run.results = {**(run.results or {}), "nodes": outcomes}
            run.detail = detail[:4000]
            switch_acceptance_status(
                session,
                run=run,
                project_id=cluster.project_id,
                target=status,
                actor=ACTOR,
                reason=detail,
                now=now,
                kind=EventKind.ACCEPTANCE_FINISHED,
                message=f"cluster {cluster.name}: acceptance ({run.trigger}) {status.value}: "
                f"{detail}",
                data={
                    "status": status.value,
                    "failed_nodes": failed_names,
                    "report_sha256": run.report_sha256,
                    "repair_id": run.repair_id,
                },
            )
            # A repair's run is gated by the repair; a cancelled one gates nobody (an
            # opt-out puts its nodes in service, a deleted cluster takes them away).
            gated = run.trigger != AcceptanceTrigger.REPAIR.value
            switch_acceptance_stage(
                session,
                run=run,
                project_id=cluster.project_id,
                target=AcceptanceStage.GATING
                if gated and status is not AcceptanceStatus.CANCELLED
                else AcceptanceStage.DONE,
                actor=ACTOR,
                reason=f"report written ({status.value})",
                now=now,
            )
            for node_id in failed:
                node = names.get(node_id)
                if node is None:
                    continue
                record_event(
                    session,
                    kind=EventKind.ACCEPTANCE_FINISHED,
                    message=f"node {node.name}: acceptance failed: "
                    + "; ".join(outcomes[node_id]["reasons"][:5]),
                    project_id=cluster.project_id,
                    cluster_id=cluster.id,
                    node_id=node.id,
                    actor=ACTOR,
                    data={"acceptance_run_id": run.id, "reasons": outcomes[node_id]["reasons"]},
                    ts=now,
                )

    async def _gate(self, run_id: str) -> None:
        """Nodes of the finished run still in acceptance: passed → in service (gpufleet's
        acceptance drain undone); failed → cordoned (drain kept); failed on nobody in
        particular → left in acceptance. Then the cluster's status."""
        async with self.db.session() as session:
            run = await session.get(AcceptanceRunRow, run_id)
            if run is None or run.stage != AcceptanceStage.GATING:
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            assert cluster is not None
            nodes = list(
                await session.scalars(
                    select(NodeRow).where(
                        NodeRow.id.in_(run.node_ids), NodeRow.state == NodeState.ACCEPTANCE.value
                    )
                )
            )
        outcomes: dict[str, dict[str, Any]] = (run.results or {}).get("nodes") or {}
        scheduler = scheduler_for(self.drivers, cluster)
        released: dict[str, Release] = {}
        for node in nodes:
            if (outcomes.get(node.id) or {}).get("outcome") not in PASSING:
                continue
            release = await release_in_scheduler(scheduler, node.scheduler_name or node.name)
            if not release.settled:
                log.warning("acceptance: resume of %s failed: %s", node.name, release.error)
                continue  # next pass tries again
            released[node.id] = release
        self.failpoints.hit("acceptance.gating.after_resume")
        async with self.db.transaction() as session:
            locked = await session.get(AcceptanceRunRow, run_id, with_for_update=True)
            cluster_row = await session.get(ClusterRow, run.cluster_id, with_for_update=True)
            if locked is None or locked.stage != AcceptanceStage.GATING or cluster_row is None:
                return
            waiting = False
            for node in nodes:
                row = await session.get(NodeRow, node.id, with_for_update=True)
                if row is None or row.state != NodeState.ACCEPTANCE.value:
                    continue
                verdict = outcomes.get(row.id) or {"outcome": "fail", "reasons": []}
                reasons = "; ".join(str(r) for r in verdict.get("reasons", [])[:5])
                if verdict.get("outcome") in PASSING:
                    if row.id not in released:
                        waiting = True
                        continue
                    self.release_node(
                        session, row, cluster_row, released[row.id],
                        f"passed acceptance run {run.id}",
                        kept_detail="passed acceptance",
                    )  # fmt: skip
                elif verdict.get("outcome") != FAILING or verdict.get("unpinned"):
                    # Skipped, or a failure pinned on nobody: not passed, not to blame.
                    row.state_detail = f"acceptance run {run.id} did not pass it: {reasons}"[:4000]
                else:
                    self.node_to(
                        session,
                        row,
                        cluster_row,
                        NodeState.CORDONED,
                        f"failed acceptance run {run.id}: {reasons}",
                        detail=f"acceptance failed: {reasons}",
                    )
            if waiting:
                return
            switch_acceptance_stage(
                session,
                run=locked,
                project_id=cluster_row.project_id,
                target=AcceptanceStage.DONE,
                actor=ACTOR,
                reason="its nodes moved by their verdicts",
                now=self.clock.now(),
            )
            await session.flush()
            await settle_cluster_status(
                session, cluster=cluster_row, actor=ACTOR, now=self.clock.now()
            )

    # -- helpers ------------------------------------------------------------------------

    async def _progress(
        self, run_id: str, outcomes: dict[str, dict[str, Any]], detail: str
    ) -> None:
        async with self.db.transaction() as session:
            run = await session.get(AcceptanceRunRow, run_id, with_for_update=True)
            if run is None or run.stage == AcceptanceStage.DONE:
                return
            current = dict((run.results or {}).get("nodes") or {})
            merged = {**current, **{k: v for k, v in outcomes.items() if k in current}}
            if merged != current or run.detail != detail:
                run.results = {**(run.results or {}), "nodes": merged}
                run.detail = detail
                run.updated_at = self.clock.now()

    async def _check_rows(self, entries: Sequence[CheckEntry]) -> dict[str, CheckRunRow]:
        ids = [e.check_run_id for e in entries if e.check_run_id]
        if not ids:
            return {}
        async with self.db.session() as session:
            rows = {
                r.id: r
                for r in await session.scalars(select(CheckRunRow).where(CheckRunRow.id.in_(ids)))
            }
            # A localisation child that ended without writing back (cancelled, timed out):
            # its parent has said all it will; mark it so in this copy (not stored).
            children = {r.id: child for r in rows.values() if (child := _localising(r))}
            if children:
                ended = set(
                    await session.scalars(
                        select(CheckRunRow.id).where(
                            CheckRunRow.id.in_(list(children.values())),
                            CheckRunRow.status.in_([s.value for s in ENDED]),
                        )
                    )
                )
                for parent_id, child_id in children.items():
                    if child_id in ended:
                        row = rows[parent_id]
                        session.expunge(row)
                        loc = {**row.result["localisation"], "status": "ended"}
                        row.result = {**row.result, "localisation": loc}
            return rows

    async def _names(self, node_ids: Sequence[str]) -> dict[str, str]:
        async with self.db.session() as session:
            rows = await session.execute(
                select(NodeRow.id, NodeRow.name).where(NodeRow.id.in_(list(node_ids)))
            )
            return {node_id: name for node_id, name in rows}

    async def _booting(self, cluster_id: str) -> int:
        """Machines of the cluster still coming up (not counting starts held by a failed
        startup script: those are out of this run, named in the cluster's detail)."""
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(NodeRow.id).where(
                        NodeRow.cluster_id == cluster_id,
                        NodeRow.state == NodeState.PROVISIONING.value,
                    )
                )
            )
            held = await held_by_startup(session, node_ids=ids)
        return len([i for i in ids if i not in held])


def _node_level(entries: Sequence[CheckEntry]) -> list[CheckEntry]:
    return [e for e in entries if e.stage is AcceptanceStage.NODE]


def _ended(row: CheckRunRow | None) -> bool:
    """The check has its final say: it ended, and a localisation it started has ended
    too (``_check_rows`` looks at the child). Judging before that would blame nobody."""
    if row is None:
        return True
    return CheckStatus(row.status) in ENDED and _localising(row) is None


def _localising(row: CheckRunRow) -> str | None:
    """The id of the localisation run this failed multi-node NCCL run started, while its
    result still says it runs (the child writes what it pinned back when it ends)."""
    loc = (row.result or {}).get("localisation")
    if isinstance(loc, dict) and loc.get("status") in ("pending", "running"):
        return str(loc.get("run_id") or "") or None
    return None


def _params(check: SuiteCheck, fabric: str | None) -> dict[str, Any]:
    params: dict[str, Any] = dict(check.check_params())
    if fabric is not None and check.kind in ("nccl", "ib-write-bw"):
        params.setdefault("fabric", fabric)
    return params


def _excluded(run: AcceptanceRunRow) -> dict[str, str]:
    """Nodes of the run no check could run on (gone, in a state checks refuse): failed."""
    return {str(k): str(v) for k, v in ((run.results or {}).get("excluded") or {}).items()}


def _node_outcomes(
    node_ids: Sequence[str],
    entries: Sequence[CheckEntry],
    checks: dict[str, CheckRunRow],
    excluded: dict[str, str],
    steps: int,
) -> dict[str, dict[str, Any]]:
    """Each node's verdict over its node-level checks: the worst of them once it has
    been through all ``steps`` (or failed one: it gets no further check); pending while
    one runs or is still to come."""
    out: dict[str, dict[str, Any]] = {n: {"outcome": "pending", "reasons": []} for n in node_ids}
    for node_id, why in excluded.items():
        if node_id in out:
            out[node_id] = {"outcome": "fail", "reasons": [why]}
    seen: dict[str, list[str]] = {n: [] for n in node_ids}
    done_steps: dict[str, int] = dict.fromkeys(node_ids, 0)
    waiting: set[str] = set()
    for entry in entries:
        if not entry.check_run_id:
            for node_id in entry.node_ids:
                seen.setdefault(node_id, []).append("pass")
                done_steps[node_id] = steps
            continue
        row = checks.get(entry.check_run_id)
        if row is None or CheckStatus(row.status) not in ENDED:
            waiting.update(entry.node_ids)
            continue
        for node_id, result in node_results(row).items():
            if node_id not in out:
                continue
            seen[node_id].append(str(result["outcome"]))
            done_steps[node_id] = done_steps.get(node_id, 0) + 1
            out[node_id]["reasons"].extend(result["reasons"])
    for node_id in node_ids:
        if node_id in waiting or node_id in excluded or not seen.get(node_id):
            continue
        verdict = worst(seen[node_id])
        if verdict in PASSING and done_steps.get(node_id, 0) < steps:
            continue  # its next check is still to come
        out[node_id]["outcome"] = verdict
    return out


def _next_steps(
    entries: Sequence[CheckEntry], checks: dict[str, CheckRunRow], steps: int
) -> list[tuple[int, int, list[str]]]:
    """(batch, step, nodes) of the node-level checks due now: a batch's next check once
    its last one ended, for the nodes that passed every check so far."""
    batches: dict[int, list[CheckEntry]] = {}
    for entry in entries:
        batches.setdefault(entry.batch, []).append(entry)
    due = []
    for number, mine in sorted(batches.items()):
        last = max(mine, key=lambda e: e.step)
        if not last.check_run_id or last.step + 1 >= steps:
            continue
        row = checks.get(last.check_run_id)
        if row is None or CheckStatus(row.status) not in ENDED:
            continue
        results = node_results(row)
        passing = [n for n in last.node_ids if (results.get(n) or {}).get("outcome") in PASSING]
        if passing:
            due.append((number, last.step + 1, passing))
    return due


def _why(row: CheckRunRow) -> str:
    result = row.result or {}
    reasons = [
        str(r.get("message"))
        for r in result.get("reasons") or []
        if isinstance(r, dict) and r.get("outcome") == "fail"
    ]
    loc = result.get("localisation") or {}
    unresolved = loc.get("unresolved") if isinstance(loc, dict) else None
    parts = [*reasons[:3], *(str(u) for u in (unresolved or [])[:2])]
    return "; ".join(parts) or row.detail or f"the check run {row.status}"
