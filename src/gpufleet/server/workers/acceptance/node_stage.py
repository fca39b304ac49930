"""The ``node`` stage: node-level check runs, a batch per group of nodes that arrived
together, each batch's checks one after the other; then, once every node has a verdict
and no machine of a cluster coming up is still booting, the cluster-wide check runs over
the nodes that passed (stage ``cluster``), or the end of the run when there are none.

Load → act → apply: the run and its check runs as loaded; no call leaves the server
here (the check runner carries the check runs out); each apply is ``ctx.locked()``, and
creates the check runs in the transaction that records their ids on the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from gpufleet.checks.models import CheckKind
from gpufleet.core.acceptance import (
    AcceptanceScope,
    AcceptanceStatus,
    AcceptanceSuite,
    AcceptanceTrigger,
    SuiteCheck,
)
from gpufleet.core.enums import AcceptanceStage, NodeState
from gpufleet.server.db.tables import CheckRunRow, NodeRow
from gpufleet.server.services.acceptance import ACTOR
from gpufleet.server.services.acceptance_report import CheckEntry, entries_of
from gpufleet.server.services.acceptance_status import (
    switch_acceptance_stage,
    switch_acceptance_status,
)
from gpufleet.server.services.checks import CHECKABLE_STATES, create_check_run
from gpufleet.server.workers.acceptance.context import AcceptanceContext, Loaded
from gpufleet.server.workers.acceptance.finishing import end_early, finish
from gpufleet.server.workers.acceptance.planning import (
    PASSING,
    ended,
    excluded_of,
    next_steps,
    node_level,
    node_outcomes,
    params_of,
)


async def node_stage(ctx: AcceptanceContext, loaded: Loaded) -> None:
    if await end_early(ctx, loaded):
        return
    run, cluster, suite = loaded.run, loaded.cluster, loaded.suite
    entries = entries_of(run)
    excluded = excluded_of(run)
    node_entries = node_level(entries)
    covered = {n for e in node_entries for n in e.node_ids} | set(excluded)
    new = [n for n in run.node_ids if n not in covered]
    checks = await ctx.check_rows(node_entries)
    steps = len(suite.node_checks())
    if new or next_steps(node_entries, checks, steps) or run.status == AcceptanceStatus.PENDING:
        await _start_node_checks(ctx, suite)
        ctx.failpoints.hit("acceptance.node.after_start")
        return
    outcomes = node_outcomes(run.node_ids, node_entries, checks, excluded, steps)
    pending = [e for e in node_entries if not ended(checks.get(e.check_run_id))]
    if pending:
        labels = ", ".join(sorted({e.label for e in pending}))
        await _progress(ctx, outcomes, f"node-level checks running: {labels}")
        return
    if run.trigger == AcceptanceTrigger.PROVISIONING.value and run.scope == AcceptanceScope.CLUSTER:
        booting = await ctx.booting(cluster.id)
        if booting:
            await _progress(
                ctx,
                outcomes,
                f"node-level checks done on {len(run.node_ids)} node(s); waiting for "
                f"{booting} machine(s) still coming up",
            )
            return
    cluster_checks = suite.cluster_checks() if run.scope == AcceptanceScope.CLUSTER else []
    passed = [n for n in run.node_ids if outcomes[n]["outcome"] in PASSING]
    if cluster_checks and len(passed) >= 2:
        await _start_cluster_checks(ctx, cluster_checks, passed, suite, outcomes)
        ctx.failpoints.hit("acceptance.cluster.after_start")
        return
    note = ""
    if cluster_checks:
        note = f"; cluster-wide checks skipped: {len(passed)} node(s) passed, they need 2"
    await finish(ctx, None, note=note, outcomes=outcomes)


async def _start_node_checks(ctx: AcceptanceContext, suite: AcceptanceSuite) -> None:
    """New nodes get a batch and its first node-level check; a batch whose check
    ended gets its next one, for the nodes that passed so far."""
    async with ctx.locked() as tx:
        if tx is None:
            return
        session, run, cluster, now = tx.session, tx.run, tx.cluster, tx.now
        entries = entries_of(run)
        excluded = excluded_of(run)
        node_checks = suite.node_checks()
        covered = {n for e in node_level(entries) for n in e.node_ids}
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
        todo = next_steps(node_level(entries), checks, len(node_checks))
        if batch:
            number = 1 + max((e.batch for e in node_level(entries)), default=-1)
            todo.append((number, 0, batch))
        force = bool((run.results or {}).get("force"))
        fabric = suite.fabric_for(cluster.gpu_model)
        for number, step, node_ids in todo:
            if not node_checks:
                # No node-level check in the suite: judged on the cluster-wide ones.
                entries.append(
                    CheckEntry("", "none", "none", AcceptanceStage.NODE, tuple(node_ids), number)
                )
                continue
            check = node_checks[step]
            row = await create_check_run(
                session,
                actor=ACTOR,
                cluster=cluster,
                kind=CheckKind(check.kind),
                node_ids=node_ids,
                params=params_of(check, fabric),
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
    ctx: AcceptanceContext,
    checks: Sequence[SuiteCheck],
    node_ids: list[str],
    suite: AcceptanceSuite,
    outcomes: dict[str, dict[str, Any]],
) -> None:
    async with ctx.locked() as tx:
        if tx is None:
            return
        session, run, cluster, now = tx.session, tx.run, tx.cluster, tx.now
        entries = entries_of(run)
        fabric = suite.fabric_for(cluster.gpu_model)
        for check in checks:
            row = await create_check_run(
                session,
                actor=ACTOR,
                cluster=cluster,
                kind=CheckKind(check.kind),
                node_ids=node_ids,
                params=params_of(check, fabric),
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


async def _progress(
    ctx: AcceptanceContext, outcomes: dict[str, dict[str, Any]], detail: str
) -> None:
    """The verdicts so far and where the run is, in words (written only when changed)."""
    async with ctx.apply() as applied:
        if applied is None:
            return
        run = applied.row
        current = dict((run.results or {}).get("nodes") or {})
        merged = {**current, **{k: v for k, v in outcomes.items() if k in current}}
        if merged != current or run.detail != detail:
            run.results = {**(run.results or {}), "nodes": merged}
            run.detail = detail
            run.updated_at = applied.now
