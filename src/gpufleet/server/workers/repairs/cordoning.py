"""The first steps of an approved repair: approved → cordoning (``begin``), cordoning →
draining (``cordon``).

Cordoning is a scheduler drain with gpufleet's reason (``core.holds``), idempotent: a
server killed between the drain and the store write drains again, to the same effect,
and records the hold then.
"""

from __future__ import annotations

from gpufleet.core.enums import NodeState, RepairStatus
from gpufleet.core.errors import DriverError
from gpufleet.server.services.node_holds import can_hold, hold_in_scheduler, record_hold
from gpufleet.server.workers.repairs.context import (
    ACTOR,
    LoadedRepair,
    RepairContext,
    hold_reason,
)

# -- approved → cordoning ---------------------------------------------------------------


async def begin(ctx: RepairContext, loaded: LoadedRepair) -> None:
    await ctx.transition(loaded, RepairStatus.CORDONING, "cordoning the node")


# -- cordoning → draining ---------------------------------------------------------------


async def cordon(ctx: RepairContext, loaded: LoadedRepair) -> None:
    scheduler = ctx.scheduler(loaded)
    if not can_hold(scheduler):
        await ctx.fail(loaded, f"scheduler {scheduler.kind} cannot drain nodes")
        return
    reason = hold_reason(loaded.repair)
    try:
        await hold_in_scheduler(scheduler, loaded.scheduler_name, reason=reason)
    except DriverError as exc:
        await ctx.note(loaded, f"cordon failed, retrying: {exc.message}")
        return
    ctx.failpoints.hit("repair.cordoning.after_drain")
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        record_hold(
            tx.session,
            node=tx.node,
            project_id=tx.project_id,
            targets=(NodeState.CORDONED, NodeState.DRAINING),
            actor=ACTOR,
            reason=f"repair {tx.repair.id}: {reason.text}",
            now=tx.now,
        )
        tx.repair.detail = "waiting for the node's jobs to end"
        tx.repair_to(
            RepairStatus.DRAINING, f"cordoned in {scheduler.kind} ({reason.text}); draining"
        )
