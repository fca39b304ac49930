"""The ``gating`` stage: the report is written; the run's nodes still in acceptance move
by their verdicts, then the cluster's status (``settle_cluster_status``).

- passed → in service: gpufleet's acceptance drain is undone in the scheduler first
  (act), then the node moves (apply); a node someone else drained meanwhile is cordoned
  with whose drain keeps it out. A resume that failed leaves the run in ``gating`` for
  the next pass.
- failed (pinned on the node) → cordoned, drained (a node Slurm resumed for a job was
  not drained before: its job goes back to the queue now).
- skipped, or a failure pinned on nobody → left in acceptance, the reason in its detail,
  until an admin runs the suite again.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from gpufleet.core.enums import AcceptanceStage, NodeState
from gpufleet.core.errors import DriverError
from gpufleet.core.holds import acceptance_hold
from gpufleet.schedulers.base import Scheduler
from gpufleet.server.db.tables import NodeRow
from gpufleet.server.services.acceptance import ACTOR, settle_cluster_status
from gpufleet.server.services.acceptance_status import switch_acceptance_stage
from gpufleet.server.services.node_holds import Release, hold_in_scheduler, release_in_scheduler
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.acceptance.context import AcceptanceContext, Loaded, release_node
from gpufleet.server.workers.acceptance.planning import FAILING, PASSING

log = logging.getLogger(__name__)


async def _hold_failed(scheduler: Scheduler, node: NodeRow) -> None:
    """Make sure a node that failed is drained. It is already, unless Slurm resumed it
    for a job (``hold_for_acceptance``): then this drain hands the job back to the queue
    at once, rather than at ResumeTimeout. Best effort: the node is cordoned either way."""
    try:
        name = node.scheduler_name or node.name
        await hold_in_scheduler(scheduler, name, reason=acceptance_hold())
    except DriverError as exc:
        log.warning("acceptance: drain of failed node %s: %s", node.name, exc.message)


async def gate(ctx: AcceptanceContext, loaded: Loaded) -> None:
    """Nodes of the finished run still in acceptance: passed → in service (gpufleet's
    acceptance drain undone); failed → cordoned (drain kept); failed on nobody in
    particular → left in acceptance. Then the cluster's status."""
    run = loaded.run
    async with ctx.db.session() as session:
        nodes = list(
            await session.scalars(
                select(NodeRow).where(
                    NodeRow.id.in_(run.node_ids), NodeRow.state == NodeState.ACCEPTANCE.value
                )
            )
        )
    outcomes: dict[str, dict[str, Any]] = (run.results or {}).get("nodes") or {}
    scheduler = scheduler_for(ctx.drivers, loaded.cluster)
    released: dict[str, Release] = {}
    for node in nodes:
        verdict = outcomes.get(node.id) or {}
        if verdict.get("outcome") == FAILING and not verdict.get("unpinned"):
            await _hold_failed(scheduler, node)
            continue
        if verdict.get("outcome") not in PASSING:
            continue
        release = await release_in_scheduler(scheduler, node.scheduler_name or node.name)
        if not release.settled:
            log.warning("acceptance: resume of %s failed: %s", node.name, release.error)
            continue  # next pass tries again
        released[node.id] = release
    ctx.failpoints.hit("acceptance.gating.after_resume")
    async with ctx.locked(lock_cluster=True) as tx:
        if tx is None:
            return
        session, cluster = tx.session, tx.cluster
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
                release_node(
                    session, row, cluster, released[row.id],
                    f"passed acceptance run {run.id}",
                    kept_detail="passed acceptance", now=tx.now,
                )  # fmt: skip
            elif verdict.get("outcome") != FAILING or verdict.get("unpinned"):
                # Skipped, or a failure pinned on nobody: not passed, not to blame.
                row.state_detail = f"acceptance run {run.id} did not pass it: {reasons}"[:4000]
            else:
                switch_node_state(
                    session,
                    node=row,
                    project_id=cluster.project_id,
                    target=NodeState.CORDONED,
                    actor=ACTOR,
                    reason=f"failed acceptance run {run.id}: {reasons}",
                    now=tx.now,
                )
                row.state_detail = f"acceptance failed: {reasons}"[:4000]
        if waiting:
            return
        switch_acceptance_stage(
            session,
            run=tx.run,
            project_id=cluster.project_id,
            target=AcceptanceStage.DONE,
            actor=ACTOR,
            reason="its nodes moved by their verdicts",
            now=tx.now,
        )
        await session.flush()
        await settle_cluster_status(session, cluster=cluster, actor=ACTOR, now=tx.now)
