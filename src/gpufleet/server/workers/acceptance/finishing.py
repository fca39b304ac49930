"""The end of a run's checks, whichever stage it is in: the verdicts, the report (JSON +
SHA-256), the run's final status, then ``gating`` (or ``done`` for a repair's run and a
cancelled one). ``end_early``: the reasons a run ends before its checks do (the cluster
is going, acceptance tests were turned off, the suite's time is up)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpufleet.core.acceptance import AcceptanceStatus, AcceptanceTrigger, content_hash
from gpufleet.core.enums import AcceptanceStage, CheckStatus, ClusterStatus, EventKind
from gpufleet.server.db.tables import CheckRunRow, GpuRow, NodeRow
from gpufleet.server.services.acceptance import ACTOR
from gpufleet.server.services.acceptance_report import build_report, entries_of
from gpufleet.server.services.acceptance_status import (
    switch_acceptance_stage,
    switch_acceptance_status,
)
from gpufleet.server.services.checks import ENDED, switch_check_status
from gpufleet.server.services.events import record_event
from gpufleet.server.workers.acceptance.context import AcceptanceContext, Loaded
from gpufleet.server.workers.acceptance.planning import (
    FAILING,
    excluded_of,
    node_level,
    node_outcomes,
    node_steps,
)


async def end_early(ctx: AcceptanceContext, loaded: Loaded) -> bool:
    """End the run now if it must (True: it was, or its end was tried)."""
    run, cluster = loaded.run, loaded.cluster
    if cluster.status in (ClusterStatus.DELETING.value, ClusterStatus.DELETED.value):
        await finish(ctx, AcceptanceStatus.CANCELLED, "the cluster is being deleted")
        return True
    if run.trigger == AcceptanceTrigger.PROVISIONING.value and not cluster.acceptance_tests:
        await finish(ctx, AcceptanceStatus.CANCELLED, "acceptance tests were turned off")
        return True
    suite = loaded.suite
    now = ctx.clock.now()
    started = run.started_at or now
    if (now - started).total_seconds() > suite.timeout_s:
        await finish(
            ctx,
            AcceptanceStatus.ERROR,
            f"the suite did not finish within {suite.timeout_s:.0f} s; what had not finished fails",
        )
        return True
    return False


async def finish(
    ctx: AcceptanceContext,
    status: AcceptanceStatus | None,
    detail: str = "",
    *,
    note: str = "",
    outcomes: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Write the verdicts and the report; ``status`` None: passed or failed by the
    verdicts. Check runs still open (a timeout, a cancel) are cancelled."""
    async with ctx.locked() as tx:
        if tx is None:
            return
        session, run, cluster, now = tx.session, tx.run, tx.cluster, tx.now
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
            outcomes = node_outcomes(
                run.node_ids,
                node_level(entries),
                checks,
                excluded_of(run),
                node_steps(run),
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
                detail = f"failed on {len(failed)} of {len(run.node_ids)} node(s): " + ", ".join(
                    failed_names[:20]
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
            message=f"cluster {cluster.name}: acceptance ({run.trigger}) {status.value}: {detail}",
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
