"""Draining: draining → acting once no job runs on the node (``drain``); and admins'
drains with no repair behind them, draining → drained (``settle_manual_drains``).

The jobs are read each pass; a scheduler that cannot be read means wait, never kill
(fail closed). A scheduler whose drain moves the work away (Kubernetes' Eviction API,
``SupportsEviction``) is asked again each pass: a pod a disruption budget keeps, or one
still in its grace period, keeps the node draining like a job. At the drain timeout the
policy says wait or requeue (where the scheduler can requeue); jobs are killed only when
an admin forced the repair.
"""

from __future__ import annotations

from sqlalchemy import select

from gpufleet.core.clock import Clock
from gpufleet.core.enums import NodeState, RepairStatus
from gpufleet.core.errors import DriverError
from gpufleet.core.repair.models import ACTIVE_STATUSES, DrainTimeoutAction
from gpufleet.schedulers.base import (
    EvictionPass,
    SchedJob,
    SupportsDown,
    SupportsEviction,
    SupportsRequeue,
)
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.node_holds import (
    down_in_scheduler,
    record_release,
    release_in_scheduler,
)
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.rollouts import window_closed
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.repairs.context import (
    ACTOR,
    LoadedRepair,
    RepairContext,
    hold_reason,
)

# -- draining → acting ------------------------------------------------------------------


async def drain(ctx: RepairContext, loaded: LoadedRepair) -> None:
    scheduler = ctx.scheduler(loaded)
    name = loaded.scheduler_name
    evicting = EvictionPass()
    try:
        if isinstance(scheduler, SupportsEviction) and not loaded.progress.get("killed_at"):
            evicting = await scheduler.evict_pods(name)
        jobs = await scheduler.jobs_on_node(name)
    except DriverError as exc:
        # Fail closed: if we cannot see the jobs, we cannot know they are gone.
        await ctx.note(loaded, f"job state unreadable, waiting (nothing is killed): {exc.message}")
        return
    if evicting.evicted:
        await ctx.note(loaded, f"evicted {', '.join(evicting.evicted)}")
    leaving = evicting.blocked + evicting.terminating
    rollout = loaded.progress.get("rollout_id")
    closed = None
    if rollout:
        # A rollout's node is reinstalled inside its window only: once the window closed
        # it waits (drained, for the next opening) or is let go, as the rollout says.
        closed = await window_closed(ctx.db, rollout_id=str(rollout), now=ctx.clock.now())
        if closed is not None and closed.release:
            await release_for_window(ctx, loaded, closed.why)
            return
    if not jobs and not leaving and closed is not None:
        await ctx.note(loaded, closed.why)
        return
    if not jobs and not leaving:
        ctx.failpoints.hit("repair.draining.after_empty")
        await ctx.transition(
            loaded,
            RepairStatus.ACTING,
            "drained: no job runs on the node",
            node_target=NodeState.DRAINED,
        )
        return
    repair, policy = loaded.repair, loaded.policy
    now = ctx.clock.now()
    waited = (now - (repair.step_started_at or now)).total_seconds()
    listing = _listing(jobs) + _leaving(evicting)
    # A rollout never ends a job: its drain waits them out, whatever the policy's timeout.
    timed_out = waited >= policy.drain_timeout_s and not rollout
    if (loaded.progress.get("kill_now") or (repair.forced and timed_out)) and isinstance(
        scheduler, SupportsDown
    ):
        try:
            await down_in_scheduler(scheduler, name, reason=hold_reason(repair))
        except DriverError as exc:
            await ctx.note(loaded, f"force: kill failed, retrying: {exc.message}")
            return
        await ctx.note(
            loaded,
            f"forced by an admin: killed {len(jobs)} job(s): {listing}",
            killed_at=now.isoformat(),
            kill_now=False,
        )
    elif not timed_out or loaded.progress.get("requeued_at"):
        await ctx.note(loaded, f"waiting for {len(jobs)} job(s) to end: {listing}")
    elif policy.drain_timeout_action is DrainTimeoutAction.REQUEUE and isinstance(
        scheduler, SupportsRequeue
    ):
        try:
            requeued = await scheduler.requeue_jobs(name)
        except DriverError as exc:
            await ctx.note(loaded, f"requeue failed, waiting: {exc.message}")
            return
        await ctx.note(
            loaded,
            f"drain timeout ({policy.drain_timeout_s:.0f} s): requeued "
            f"{', '.join(requeued) or 'no job'}",
            requeued_at=now.isoformat(),
        )
    else:
        await ctx.note(
            loaded,
            f"drain timeout ({policy.drain_timeout_s:.0f} s) passed; still waiting for "
            f"{listing} (policy: wait; an admin may force)",
        )


async def release_for_window(ctx: RepairContext, loaded: LoadedRepair, why: str) -> None:
    """A rollout's repair let go at its window's close (policy release), before any
    reinstall: the node's hold is undone and it is back in service; the rollout puts it
    in line for the next opening."""
    release = await release_in_scheduler(ctx.scheduler(loaded), loaded.scheduler_name)
    if not release.settled:
        await ctx.note(loaded, f"window closed; resume failed, retrying: {release.error}")
        return
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        tx.node.state_detail = ""
        record_release(
            tx.session, node=tx.node, project_id=tx.project_id, release=release,
            actor=ACTOR, reason=why, now=tx.now,
        )  # fmt: skip
        tx.node_to(NodeState.IN_SERVICE, f"repair {tx.repair.id}: {why}")
        tx.repair.detail = why
        tx.repair_to(RepairStatus.RELEASED, why)


def _listing(jobs: list[SchedJob]) -> str:
    shown = ", ".join(f"{j.job_id} ({j.user}, {j.account})" for j in jobs[:5])
    return shown + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")


def _leaving(evicting: EvictionPass) -> str:
    """Pods that keep the node draining besides the jobs: a disruption budget's refusal
    (with its message), a grace period still running."""
    out = ""
    if evicting.blocked:
        more = len(evicting.blocked) - 3
        out += "; eviction refused for now: " + ", ".join(evicting.blocked[:3])
        out += f" and {more} more" if more > 0 else ""
    if evicting.terminating:
        more = len(evicting.terminating) - 3
        out += "; terminating: " + ", ".join(evicting.terminating[:3])
        out += f" and {more} more" if more > 0 else ""
    return out


# -- manual drains ----------------------------------------------------------------------


async def settle_manual_drains(db: Database, *, clock: Clock, drivers: DriverRegistry) -> None:
    """An admin's drain (no repair behind it): draining → drained once no job runs."""
    async with db.session() as session:
        active = select(RepairRow.node_id).where(
            RepairRow.status.in_([s.value for s in ACTIVE_STATUSES]),
            RepairRow.node_id.is_not(None),
        )
        rows = (
            await session.execute(
                select(NodeRow, ClusterRow)
                .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
                .where(NodeRow.state == NodeState.DRAINING.value, NodeRow.id.not_in(active))
            )
        ).all()
    for node, cluster in rows:
        try:
            jobs = await scheduler_for(drivers, cluster).jobs_on_node(
                node.scheduler_name or node.name
            )
        except DriverError:
            continue  # unreadable: stay draining
        if jobs:
            continue
        async with db.transaction() as session:
            row = await session.get(NodeRow, node.id, with_for_update=True)
            if row is None or row.state != NodeState.DRAINING.value:
                continue
            switch_node_state(
                session,
                node=row,
                project_id=cluster.project_id,
                target=NodeState.DRAINED,
                actor=ACTOR,
                reason="drained: no job runs on the node",
                now=clock.now(),
            )
