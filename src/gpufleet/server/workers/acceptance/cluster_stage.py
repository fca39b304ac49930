"""The ``cluster`` stage: wait for the cluster-wide check runs (and the localisation a
failed one started), run once more a failure that bisecting pinned on no node, then end
the run: a failed cluster-wide run fails the nodes it pinned; one pinned on nobody fails
every node it ran on without blaming any (``unpinned``: they stay in acceptance)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpufleet.checks.models import CheckKind
from gpufleet.core.enums import AcceptanceStage, CheckStatus
from gpufleet.server.db.tables import CheckRunRow
from gpufleet.server.services.acceptance import ACTOR
from gpufleet.server.services.acceptance_report import (
    CheckEntry,
    entries_of,
    localised,
    node_results,
)
from gpufleet.server.services.checks import create_check_run
from gpufleet.server.workers.acceptance.context import AcceptanceContext, Loaded
from gpufleet.server.workers.acceptance.finishing import end_early, finish
from gpufleet.server.workers.acceptance.planning import (
    ended,
    excluded_of,
    node_level,
    node_outcomes,
    node_steps,
    why_failed,
)


async def cluster_stage(ctx: AcceptanceContext, loaded: Loaded) -> None:
    if await end_early(ctx, loaded):
        return
    run = loaded.run
    entries = entries_of(run)
    checks = await ctx.check_rows(entries)
    if any(not ended(checks.get(e.check_run_id)) for e in entries if e.check_run_id):
        return
    outcomes = node_outcomes(
        run.node_ids,
        node_level(entries),
        checks,
        excluded_of(run),
        node_steps(run),
    )
    names = await ctx.names(run.node_ids)
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
        await _retry_cluster_checks(ctx, again, checks)
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
            why = why_failed(row)
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
    await finish(ctx, None, note=note, outcomes=outcomes)


async def _retry_cluster_checks(
    ctx: AcceptanceContext, again: Sequence[CheckEntry], checks: dict[str, CheckRunRow]
) -> None:
    """Each entry's check run once more on the same nodes; the entry takes the new
    run (the report shows the final attempt), ``results.retried`` maps new → old."""
    async with ctx.locked() as tx:
        if tx is None:
            return
        session, run, now = tx.session, tx.run, tx.now
        retried: dict[str, str] = dict((run.results or {}).get("retried") or {})
        replaced: dict[str, str] = {}
        for entry in again:
            old = checks[entry.check_run_id]
            row = await create_check_run(
                session,
                actor=ACTOR,
                cluster=tx.cluster,
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
