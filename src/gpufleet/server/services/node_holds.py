"""Holding a node in its scheduler: gpufleet's drain, its undoing, and the node state
change that goes with each. Repairs, acceptance, provisioning and an admin's node
actions all hold nodes through here; no other module calls a scheduler's ``drain``,
``resume`` or ``down`` (tests/server/test_lifecycle_owners.py checks).

A hold is two steps, because no network call runs inside a DB transaction (STYLE §7):

1. the scheduler step, with no transaction open: ``hold_in_scheduler`` (drain with one
   of gpufleet's reasons, ``gpufleet.core.holds``), ``release_in_scheduler`` (undo
   gpufleet's drain), ``down_in_scheduler`` (a forced repair: the node down now);
2. the state step, inside the caller's guarded apply, after the first succeeded:
   ``record_hold`` / ``record_release`` change the node's state through
   ``switch_node_state`` (an event and an audit row each).

Fail closed. A release only ever undoes gpufleet's own drain: the driver refuses to clear
anyone else's, and then ``release_in_scheduler`` reads who holds the node. Someone else's
drain stays, and the node is recorded cordoned, never in service; a scheduler that
cannot be read leaves the node where it is, to be tried again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import NodeState
from gpufleet.core.errors import DriverError
from gpufleet.core.holds import HoldReason, is_gpufleet_reason
from gpufleet.schedulers.base import SchedNode, Scheduler, SupportsDown, SupportsDrain
from gpufleet.server.db.tables import NodeRow
from gpufleet.server.services.nodes import switch_node_state

# The states a held node is in: out of service, by gpufleet's drain.
HELD_STATES = frozenset(
    {NodeState.CORDONED, NodeState.DRAINING, NodeState.DRAINED, NodeState.ACCEPTANCE}
)


@dataclass(frozen=True, slots=True)
class Release:
    """What undoing gpufleet's hold in the scheduler came to."""

    error: str | None = None  # the scheduler refused or failed: the node is still held
    kept_by: str | None = None  # someone else's reason: their drain stays on the node

    @property
    def settled(self) -> bool:
        """Nothing is left to do in the scheduler: gpufleet's drain is gone, or the node
        is held by someone else, which gpufleet never undoes. False: try again later."""
        return self.error is None or self.kept_by is not None


def can_hold(scheduler: Scheduler) -> bool:
    """True when the scheduler can drain and resume nodes (``SupportsDrain``)."""
    return isinstance(scheduler, SupportsDrain)


async def hold_in_scheduler(scheduler: Scheduler, name: str, *, reason: HoldReason) -> bool:
    """Drain node ``name`` (its scheduler name) with one of gpufleet's reasons; running
    jobs finish. Idempotent; an existing drain keeps its reason (the driver's rule).

    Returns False, having done nothing, when the scheduler cannot drain. Raises
    ``DriverError`` when the call fails.
    """
    if not isinstance(scheduler, SupportsDrain):
        return False
    await scheduler.drain(name, reason=reason.text)
    return True


class NodeListing:
    """One read of a scheduler's node list, shared by the node steps of one pass.

    Holding a node for acceptance reads the whole list (``allocated_before_boot``); a
    pass that provisions 1,000 nodes of a cluster would otherwise ask slurmctld for all
    of them 1,000 times. The list is read once, by the first step that needs it (the
    others wait for that read), and read again when it is older than ``max_age_s`` (a
    long pass). A failed read stands for as long: a scheduler that does not answer is
    not asked again by each of the pass's steps in turn.
    """

    def __init__(self, scheduler: Callable[[], Scheduler], *, max_age_s: float = 5.0) -> None:
        self._make = scheduler  # built when first needed: a pass may hold no node at all
        self._scheduler: Scheduler | None = None
        self._max_age_s = max_age_s
        self._lock = asyncio.Lock()
        self._nodes: list[SchedNode] | None = None
        self._error: DriverError | None = None
        self._read_at = -math.inf

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            self._scheduler = self._make()
        return self._scheduler

    async def nodes(self) -> list[SchedNode]:
        """The scheduler's nodes; raises ``DriverError`` when they cannot be read (the
        steps waiting on that read get the same error: one failed read, not one each)."""
        async with self._lock:
            now = asyncio.get_running_loop().time()
            if now - self._read_at > self._max_age_s:
                self._read_at = now
                self._nodes, self._error = None, None
                try:
                    self._nodes = await self.scheduler.list_nodes()
                except DriverError as exc:
                    self._error = exc
            if self._error is not None:
                raise self._error
            assert self._nodes is not None
            return self._nodes


async def hold_for_acceptance(listing: NodeListing, name: str, *, reason: HoldReason) -> bool:
    """Hold a node to be tested, unless its scheduler already allocated it a job and
    waits for the machine (Slurm's power saving resumed it for that job): a drain then
    would requeue the job ("DRAIN/FAIL request for node which is allocated and being
    powered up. Requeuing jobs", seen in the lab). Such a node is held by its machine
    instead: acceptance runs through the agent and slurmd starts once it passed
    (``docs/slurm-power-saving.md``); a failed one gets the drain then, which hands its
    job back to the queue at once. Returns whether the drain was made (as
    ``hold_in_scheduler``); raises ``DriverError`` when it fails. ``listing``: the
    scheduler, with the pass's shared read of its nodes."""
    if await allocated_before_boot(listing, name):
        return False
    return await hold_in_scheduler(listing.scheduler, name, reason=reason)


async def allocated_before_boot(listing: NodeListing, name: str) -> bool:
    """The scheduler waits for node ``name``'s machine with work allocated to it. False
    when it cannot be read (the drain that follows says what is wrong)."""
    try:
        nodes = await listing.nodes()
    except DriverError:
        return False
    # Slurm says such a node is NOT_RESPONDING too (no slurmd yet): its jobs tell.
    return any(
        n.name == name and n.powered_down and (n.job_ids or n.gpus_allocated > 0) for n in nodes
    )


async def down_in_scheduler(scheduler: SupportsDown, name: str, *, reason: HoldReason) -> None:
    """Mark node ``name`` down now with one of gpufleet's reasons: its running jobs are
    killed (a repair an admin forced). Raises ``DriverError`` when the call fails."""
    await scheduler.down(name, reason=reason.text)


async def release_in_scheduler(scheduler: Scheduler, name: str) -> Release:
    """Undo gpufleet's drain (or down) of node ``name``. A scheduler that cannot drain
    holds nothing: released. Never raises for a driver failure; the ``Release`` says."""
    if not isinstance(scheduler, SupportsDrain):
        return Release()
    try:
        await scheduler.resume(name)
    except DriverError as exc:
        # The drivers refuse a reason that is not ours; see whether that is why.
        return Release(error=exc.message, kept_by=await foreign_hold_reason(scheduler, name))
    return Release()


async def foreign_hold_reason(scheduler: Scheduler, name: str) -> str | None:
    """The reason on node ``name`` when someone else set it (an operator, NHC, Slurm);
    None when it is gpufleet's, there is none, or the scheduler cannot be read."""
    try:
        nodes = await scheduler.list_nodes()
    except DriverError:
        return None
    for node in nodes:
        if node.name == name and node.reason and not is_gpufleet_reason(node.reason):
            return node.reason
    return None


def record_hold(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    targets: Sequence[NodeState],
    actor: str,
    reason: str,
    now: dt.datetime,
) -> None:
    """The state step of a hold, once the scheduler step succeeded: the node moves
    through ``targets`` (e.g. cordoned, then draining), each an event and an audit row."""
    for target in targets:
        if target not in HELD_STATES:
            raise ValueError(f"{target.value} is not a held state")
        switch_node_state(
            session, node=node, project_id=project_id, target=target, actor=actor,
            reason=reason, now=now,
        )  # fmt: skip


def record_release(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    release: Release,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> NodeState:
    """The state step of a release: in service, or cordoned when someone else's drain
    stays (the reason says whose). Returns the state the node is now in."""
    if not release.settled:
        raise ValueError(f"node {node.name} is still held in its scheduler: {release.error}")
    target = NodeState.IN_SERVICE
    if release.kept_by is not None:
        target = NodeState.CORDONED
        reason = f"{reason}; kept out by {release.kept_by!r}"
    switch_node_state(
        session, node=node, project_id=project_id, target=target, actor=actor, reason=reason,
        now=now,
    )  # fmt: skip
    return target
