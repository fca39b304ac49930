"""The rollout reconciler: takes each unfinished stack rollout (``services/rollouts.py``)
one step further each pass. Level-triggered and crash-safe: a pass reads the rollout,
its nodes and their repairs under the rollout's row lock and writes what follows from
them, so a server killed anywhere re-reads the same state and starts no node twice (a
node's migration is recorded in the transaction that makes its repair).

Per pass, per rollout:

1. **follow** the nodes under way: their repair succeeded → done (rolled back); failed,
   or the node left → failed (one more against the failure budget);
2. **decide**: aborting with nothing under way → aborted; every node done → succeeded
   (the cluster's stack becomes the new one); only failed nodes left, or the budget
   reached → paused; the window closed → scheduled (waiting); open → running;
3. **start** nodes while running, in order, so that nodes under way plus nodes already
   out of service for other reasons stay within max unavailable; never a node with an
   open repair, never while the cluster's repair breaker is tripped;
4. **reserve** on a scheduler that has reservations (Slurm): a MAINT reservation for the
   current or next opening on the nodes still to move, made once per opening, so that
   jobs whose time limit would cross into the window do not start there; dropped when
   the rollout ends or pauses.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, NodeState, RepairStatus
from gpufleet.core.enums import RolloutNodeStatus as NS
from gpufleet.core.enums import RolloutStatus as RS
from gpufleet.core.errors import DriverError
from gpufleet.core.repair.models import OPEN_STATUSES
from gpufleet.core.windows import Window, max_unavailable_count, next_batch
from gpufleet.schedulers.base import SupportsReservations
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow, RolloutNodeRow, RolloutRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_callers import REFUSED_NODE_STATES
from gpufleet.server.services.rollouts import (
    ACTIVE,
    ACTOR,
    FINAL,
    start_migration,
    switch_rollout_node_status,
    switch_rollout_status,
)
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)

_GONE = REFUSED_NODE_STATES  # removing or removed: out of the cluster
# A reservation is made this long before its opening at most (Slurm plans jobs by their
# time limits; a week covers any limit a GPU cluster sets).
RESERVE_AHEAD = dt.timedelta(days=7)
_DONE = {NS.MIGRATING: NS.DONE, NS.ROLLING_BACK: NS.ROLLED_BACK}


def _under_way(entry: RolloutNodeRow) -> bool:
    return NS(entry.status) in _DONE and entry.repair_id is not None


def _startable(entry: RolloutNodeRow) -> frozenset[str]:
    """The node states a node may start its migration from: in service; or, for a retry
    or a rollback of a failed migration, cordoned (where that failure left it)."""
    if NS(entry.status) in (NS.FAILED, NS.ROLLING_BACK):
        return frozenset({NodeState.IN_SERVICE.value, NodeState.CORDONED.value})
    return frozenset({NodeState.IN_SERVICE.value})


def _to_start(entry: RolloutNodeRow) -> bool:
    status = NS(entry.status)
    if status is NS.PENDING:
        return True
    # A failed node put back in line (resume with retry), or a rollback not begun.
    return status in (NS.FAILED, NS.ROLLING_BACK) and entry.repair_id is None


@dataclass(frozen=True)
class _Booking:
    """What a pass read for the rollout's maintenance reservation, inside its transaction."""

    scheduler: SupportsReservations
    status: RS
    reservation: str  # the one booked, "" for none
    covered: str  # the opening it was booked for (UTC ISO start)
    want: tuple[dt.datetime, dt.datetime] | None  # the opening to cover now
    nodes: list[str]  # scheduler names of the nodes still to move


@dataclass
class _Pass:
    """What one pass over a rollout did (for the crash tests' failpoints)."""

    ended: int = 0  # nodes whose migration ended
    started: int = 0  # nodes whose migration began


class RolloutLoop(LoopService):
    name = "rollouts"

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

    async def run_once(self) -> None:
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(RolloutRow.id)
                    .where(RolloutRow.status.in_([s.value for s in ACTIVE]))
                    .order_by(RolloutRow.id)
                )
            )
        for rollout_id in ids:
            try:
                await self.step(rollout_id)
            except Exception:  # one rollout's trouble never stalls the others
                log.exception("rollouts: step of %s failed", rollout_id)

    async def step(self, rollout_id: str) -> None:
        now = self.clock.now()
        booking: _Booking | None = None
        async with self.db.transaction() as session:
            rollout = await session.get(RolloutRow, rollout_id, with_for_update=True)
            if rollout is None or RS(rollout.status) not in ACTIVE:
                return
            cluster = await session.get(ClusterRow, rollout.cluster_id)
            if cluster is None:
                return
            seen = _Pass()
            await _advance(session, rollout, cluster, now=now, seen=seen)
            scheduler = self._reserving(cluster)
            if scheduler is not None:
                booking = _Booking(
                    scheduler=scheduler,
                    status=RS(rollout.status),
                    reservation=rollout.reservation,
                    covered=rollout.reserved_for,
                    want=_wanted_opening(rollout, now),
                    nodes=await _scheduler_names(session, rollout_id),
                )
        # Committed: a crash from here on must neither start a node again nor lose an end.
        if seen.started:
            self.failpoints.hit("rollout.after_start")
        if seen.ended:
            self.failpoints.hit("rollout.after_node_end")
        if booking is not None:
            await self._reserve(rollout_id, booking, now=now)

    def _reserving(self, cluster: ClusterRow) -> SupportsReservations | None:
        """The cluster's scheduler, where it takes maintenance reservations (Slurm)."""
        try:
            scheduler = scheduler_for(self.drivers, cluster)
        except DriverError:
            return None
        return scheduler if isinstance(scheduler, SupportsReservations) else None

    async def _reserve(self, rollout_id: str, booking: _Booking, *, now: dt.datetime) -> None:
        """Keep the scheduler's MAINT reservation in step with the rollout (act: no
        transaction open), then record it."""
        scheduler, want, reservation = booking.scheduler, booking.want, booking.reservation
        name = f"gpufleet-maint-{rollout_id[:8]}"
        if (
            booking.status in FINAL
            or booking.status is RS.PAUSED
            or want is None
            or not (booking.nodes)
        ):
            if reservation:
                await scheduler.delete_reservation(reservation)
                await self._record(rollout_id, reservation="", reserved_for="", now=now)
            return
        start, end = want
        if booking.covered == start.isoformat() or start - now > RESERVE_AHEAD:
            return
        nodes = booking.nodes
        begin = max(start, now)
        await scheduler.delete_reservation(name)  # an earlier opening's, if any
        await scheduler.create_reservation(
            name,
            nodes=tuple(nodes),
            duration_s=(end - begin).total_seconds(),
            users=("root",),
            ignore_jobs=True,
            start=None if begin <= now else begin,
        )
        await self._record(rollout_id, reservation=name, reserved_for=start.isoformat(), now=now)

    async def _record(
        self, rollout_id: str, *, reservation: str, reserved_for: str, now: dt.datetime
    ) -> None:
        async with self.db.transaction() as session:
            rollout = await session.get(RolloutRow, rollout_id, with_for_update=True)
            if rollout is None:
                return
            cluster = await session.get(ClusterRow, rollout.cluster_id)
            rollout.reservation, rollout.reserved_for = reservation, reserved_for
            rollout.updated_at = now
            if cluster is not None:
                message = (
                    f"cluster {cluster.name}: maintenance reservation {reservation} for the "
                    f"opening at {reserved_for}"
                    if reservation
                    else f"cluster {cluster.name}: maintenance reservation dropped"
                )
                record_event(
                    session, kind=EventKind.ROLLOUT_STEP, message=message,
                    project_id=cluster.project_id, cluster_id=cluster.id, actor=ACTOR, ts=now,
                    data={"rollout_id": rollout_id, "reservation": reservation,
                          "reserved_for": reserved_for},
                )  # fmt: skip


def _wanted_opening(
    rollout: RolloutRow, now: dt.datetime
) -> tuple[dt.datetime, dt.datetime] | None:
    if RS(rollout.status) not in (RS.SCHEDULED, RS.RUNNING):
        return None
    return Window.model_validate(rollout.window).next_opening(now)


async def _scheduler_names(session: AsyncSession, rollout_id: str) -> list[str]:
    """The scheduler names of the rollout's nodes still to move or under way."""
    rows = (
        await session.execute(
            select(NodeRow.scheduler_name, NodeRow.name, RolloutNodeRow.status)
            .join(RolloutNodeRow, RolloutNodeRow.node_id == NodeRow.id)
            .where(RolloutNodeRow.rollout_id == rollout_id, NodeRow.state.not_in(_GONE))
            .order_by(RolloutNodeRow.position)
        )
    ).all()
    final = {NS.DONE.value, NS.ROLLED_BACK.value, NS.SKIPPED.value}
    return [sched or name for sched, name, status in rows if status not in final]


async def _advance(
    session: AsyncSession,
    rollout: RolloutRow,
    cluster: ClusterRow,
    *,
    now: dt.datetime,
    seen: _Pass,
) -> None:
    entries = list(
        await session.scalars(
            select(RolloutNodeRow)
            .where(RolloutNodeRow.rollout_id == rollout.id)
            .order_by(RolloutNodeRow.position)
            .with_for_update()
        )
    )
    nodes = {
        n.id: n
        for n in await session.scalars(
            select(NodeRow).where(NodeRow.id.in_([e.node_id for e in entries]))
        )
    }
    seen.ended = _follow(
        session, rollout, cluster, entries, nodes, await _repairs(session, entries), now
    )
    status = RS(rollout.status)

    def change(target: RS, reason: str) -> None:
        switch_rollout_status(
            session, rollout=rollout, cluster=cluster, target=target, actor=ACTOR,
            reason=reason, now=now,
        )  # fmt: skip

    under_way = [e for e in entries if _under_way(e)]
    waiting = [e for e in entries if _to_start(e)]
    if status is RS.ABORTING:
        if not under_way:
            moved = sum(1 for e in entries if NS(e.status) is NS.DONE)
            change(RS.ABORTED, f"aborted: {moved} of {len(entries)} node(s) moved")
        return
    if not waiting and not under_way:
        failed = [e for e in entries if NS(e.status) is NS.FAILED]
        if failed:
            if status is not RS.PAUSED:
                change(RS.PAUSED, f"{len(failed)} node(s) failed: resume with retry, roll "
                                  "them back, or abort")  # fmt: skip
            return
        cluster.stack = rollout.to_stack
        cluster.updated_at = now
        moved = sum(1 for e in entries if NS(e.status) is NS.DONE)
        change(RS.SUCCEEDED, f"{moved} node(s) on stack {rollout.to_stack}; the cluster's "
                             f"stack is {rollout.to_stack}")  # fmt: skip
        return
    if status is RS.PAUSED:
        # Paused: the rollout goes no further, but an admin's rollback still runs (in
        # the window, within max unavailable).
        window = Window.model_validate(rollout.window)
        if window.open_at(now) is not None and cluster.repair_breaker_tripped_at is None:
            seen.started = await _start(
                session, rollout, cluster, entries, nodes, now=now, rollbacks_only=True
            )
        return
    if rollout.failures >= rollout.failure_budget:
        change(RS.PAUSED, f"failure budget reached: {rollout.failures} node(s) failed of "
                          f"{rollout.failure_budget} allowed")  # fmt: skip
        return
    window = Window.model_validate(rollout.window)
    opening = window.open_at(now)
    if opening is None:
        nxt = window.next_opening(now)
        when = f"; next opening {nxt[0].isoformat()}" if nxt else "; it never opens again"
        if status is RS.RUNNING:
            change(RS.SCHEDULED, f"window closed{when}")
        return
    if status is RS.SCHEDULED:
        change(RS.RUNNING, f"window open until {opening[1].isoformat()}")
    if cluster.repair_breaker_tripped_at is not None:
        rollout.detail = f"waiting: the repair breaker is tripped ({cluster.repair_breaker_reason})"
        return
    seen.started = await _start(session, rollout, cluster, entries, nodes, now=now)


async def _repairs(session: AsyncSession, entries: list[RolloutNodeRow]) -> dict[str, RepairRow]:
    ids = [e.repair_id for e in entries if e.repair_id]
    if not ids:
        return {}
    return {r.id: r for r in await session.scalars(select(RepairRow).where(RepairRow.id.in_(ids)))}


def _follow(
    session: AsyncSession,
    rollout: RolloutRow,
    cluster: ClusterRow,
    entries: list[RolloutNodeRow],
    nodes: dict[str, NodeRow],
    repairs: dict[str, RepairRow],
    now: dt.datetime,
) -> int:
    """Nodes under way end with their repair; nodes gone before their turn are skipped.
    Returns how many ended."""
    ended = 0
    for entry in entries:
        node = nodes.get(entry.node_id)
        name = node.name if node is not None else entry.node_id

        def to(target: NS, reason: str, entry: RolloutNodeRow = entry, name: str = name) -> None:
            switch_rollout_node_status(
                session, entry=entry, rollout=rollout, cluster=cluster, node_name=name,
                target=target, actor=ACTOR, reason=reason, now=now,
            )  # fmt: skip

        if NS(entry.status) is NS.PENDING and (node is None or node.state in _GONE):
            to(NS.SKIPPED, "the node left the cluster before its turn")
            continue
        if not _under_way(entry):
            continue
        repair = repairs.get(entry.repair_id or "")
        done = _DONE[NS(entry.status)]
        if repair is not None and RepairStatus(repair.status) is RepairStatus.RELEASED:
            # Let go at the window's close: in line again, on the stack it still runs.
            back = NS(entry.status) is NS.ROLLING_BACK
            if node is not None:
                node.stack = rollout.to_stack if back else entry.from_stack
            reason = f"released at the window's close (repair {repair.id}); in line again"
            entry.repair_id = None
            if back:
                entry.detail, entry.updated_at, entry.started_at = reason, now, None
            else:
                to(NS.PENDING, reason)
        elif repair is not None and RepairStatus(repair.status) is RepairStatus.SUCCEEDED:
            ended += 1
            to(done, f"on stack {node.stack if node else '?'}: repair {repair.id} succeeded")
        elif repair is None or repair.status not in {s.value for s in OPEN_STATUSES}:
            why = repair.detail if repair is not None else "its repair is gone"
            rollout.failures += 1
            ended += 1
            to(NS.FAILED, f"repair {entry.repair_id} {repair.status if repair else ''}: {why}"[
                :2000])  # fmt: skip
        elif repair.detail and entry.detail != repair.detail:
            entry.detail, entry.updated_at = repair.detail, now
    return ended


async def _start(
    session: AsyncSession,
    rollout: RolloutRow,
    cluster: ClusterRow,
    entries: list[RolloutNodeRow],
    nodes: dict[str, NodeRow],
    *,
    now: dt.datetime,
    rollbacks_only: bool = False,
) -> int:
    """Start what max unavailable allows now; returns how many started. A node out of
    service already (cordoned by its failed migration) takes no room when it starts
    again (a retry, a rollback): it is counted as out either way."""
    total = await session.scalar(
        select(func.count()).where(NodeRow.cluster_id == cluster.id, NodeRow.state.not_in(_GONE))
    )
    limit = max_unavailable_count(rollout.max_unavailable, int(total or 0))
    under_way = {e.node_id for e in entries if _under_way(e)}
    out_other = await session.scalar(
        select(func.count()).where(
            NodeRow.cluster_id == cluster.id,
            NodeRow.state.not_in(_GONE | {NodeState.IN_SERVICE.value}),
            NodeRow.id.not_in(under_way) if under_way else NodeRow.id.is_not(None),
        )
    )
    waiting = [
        e
        for e in entries
        if _to_start(e) and (not rollbacks_only or NS(e.status) is NS.ROLLING_BACK)
    ]
    busy = set(
        await session.scalars(
            select(RepairRow.node_id).where(
                RepairRow.node_id.in_([e.node_id for e in waiting]),
                RepairRow.status.in_([s.value for s in OPEN_STATUSES]),
            )
        )
    )
    ready = [
        e
        for e in waiting
        if e.node_id not in busy
        and (n := nodes.get(e.node_id)) is not None
        and n.state in _startable(e)
    ]
    in_service = [e.id for e in ready if nodes[e.node_id].state == NodeState.IN_SERVICE.value]
    chosen = set(
        next_batch(
            in_service,
            in_flight=len(under_way),
            unavailable_other=int(out_other or 0),
            limit=limit,
        )
    ) | {e.id for e in ready if e.id not in in_service}
    started = 0
    for entry in ready:
        if entry.id not in chosen:
            continue
        node = await session.get(NodeRow, entry.node_id, with_for_update=True)
        if node is None or node.state not in _startable(entry):
            continue
        start_migration(session, rollout=rollout, cluster=cluster, entry=entry, node=node, now=now)
        started += 1
    left = sum(1 for e in entries if _to_start(e))
    rollout.detail = f"{len(under_way) + started} node(s) under way (at most {limit}), {left} to go"
    return started
