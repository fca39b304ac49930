"""Stack rollouts: a cluster migrated to another stack inside an admin's maintenance
windows, node by node (DESIGN "Stacks and maintenance windows"). The one owner of the
rollout and rollout-node lifecycles: every status change goes through
``switch_rollout_status`` / ``switch_rollout_node_status`` (an event and an audit row).

A node's migration is one repair (``RepairSource.ROLLOUT``, action ``reprovision``,
approved by the rollout's author when it starts): cordon → drain (jobs end; never killed
or requeued) → reinstall with the node's new stack → re-acceptance → in service. A node
with any open repair is never started (a rollout never overlaps a repair), and a
rollout's repair reinstalls only while the window is open (``window_closed``): a node
drained after the window closed waits drained for the next opening. The reconciler is
``workers/rollouts.py``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus, EventKind, RepairAction, RepairStatus, WindowClose
from gpufleet.core.enums import RolloutNodeStatus as NS
from gpufleet.core.enums import RolloutStatus as RS
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.rbac import Permission
from gpufleet.core.repair.models import RepairKind, RepairSource
from gpufleet.core.transitions import ROLLOUT, ROLLOUT_NODE
from gpufleet.core.windows import Window, parse_max_unavailable, parse_window
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow, RolloutNodeRow, RolloutRow
from gpufleet.server.schemas.rollouts import (
    CreateRolloutRequest,
    Opening,
    RollbackRequest,
    Rollout,
    RolloutActionRequest,
    RolloutNode,
)
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_callers import REFUSED_NODE_STATES
from gpufleet.server.services.repairs import create_repair, switch_repair_status
from gpufleet.server.services.stacks import get_stack_row
from gpufleet.server.services.transitions import Subject, transition

ACTOR = "system:rollouts"
ACTIVE = frozenset({RS.SCHEDULED, RS.RUNNING, RS.PAUSED, RS.ABORTING})
FINAL = frozenset({RS.SUCCEEDED, RS.ABORTED})
# Nodes whose repair is under way (counted against max unavailable).
IN_FLIGHT = frozenset({NS.MIGRATING, NS.ROLLING_BACK})
_NODE_FINAL = frozenset({NS.DONE, NS.ROLLED_BACK})
_GONE = REFUSED_NODE_STATES  # removing or removed: out of the cluster


# -- the two lifecycles ------------------------------------------------------------------


def switch_rollout_status(
    session: AsyncSession,
    *,
    rollout: RolloutRow,
    cluster: ClusterRow,
    target: RS,
    actor: str,
    reason: str,
    now: dt.datetime,
    source_ip: str | None = None,
) -> bool:
    """The one way a rollout's status changes. False, nothing written, if unchanged."""
    changed = transition(
        session,
        lifecycle=ROLLOUT,
        row=rollout,
        subject=Subject(
            object_id=rollout.id,
            label=f"cluster {cluster.name}: rollout {rollout.id[-8:]} to {rollout.to_stack}",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=None,
            ids={"rollout_id": rollout.id},
        ),
        target=target,
        actor=actor,
        reason=reason,
        now=now,
        source_ip=source_ip,
    )
    if changed:
        rollout.detail = reason
        rollout.updated_at = now
        if target in FINAL:
            rollout.finished_at = now
    return changed


def switch_rollout_node_status(
    session: AsyncSession,
    *,
    entry: RolloutNodeRow,
    rollout: RolloutRow,
    cluster: ClusterRow,
    node_name: str,
    target: NS,
    actor: str,
    reason: str,
    now: dt.datetime,
    source_ip: str | None = None,
) -> bool:
    """The one way a rollout's node changes status."""
    changed = transition(
        session,
        lifecycle=ROLLOUT_NODE,
        row=entry,
        subject=Subject(
            object_id=entry.id,
            label=f"node {node_name} (rollout {rollout.id[-8:]} to {rollout.to_stack})",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=entry.node_id,
            ids={"rollout_id": rollout.id},
        ),
        target=target,
        actor=actor,
        reason=reason,
        now=now,
        source_ip=source_ip,
        data={"repair_id": entry.repair_id} if entry.repair_id else None,
    )
    if changed:
        entry.detail = reason
        entry.updated_at = now
        if target is NS.MIGRATING:
            entry.started_at, entry.finished_at = now, None
        elif target is NS.ROLLING_BACK:  # begins when the reconciler starts it
            entry.started_at, entry.finished_at = None, None
        elif target in (NS.DONE, NS.FAILED, NS.ROLLED_BACK):
            entry.finished_at = now
    return changed


# -- an admin's requests -----------------------------------------------------------------


async def create_rollout(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    request: CreateRolloutRequest,
    now: dt.datetime,
) -> Rollout:
    """Schedule the cluster's migration (admins: node.action). Checked whole first: a
    stack that exists and is not the one every node runs already, a window that opens
    again, a budget; one unfinished rollout per cluster."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.NODE_ACTION, cluster.project_id)
    await session.refresh(cluster, with_for_update=True)
    if ClusterStatus(cluster.status) in (ClusterStatus.DELETING, ClusterStatus.DELETED):
        raise Conflict(f"cluster {cluster.name} is {cluster.status}; nothing to migrate")
    stack = await get_stack_row(session, request.to_stack)
    window = parse_window(request.window, tz=request.tz)
    if window.next_opening(now) is None:
        raise InvalidInput(f"window {window.describe()} never opens again", field="window")
    max_unavailable = parse_max_unavailable(request.max_unavailable)
    running = await session.scalar(
        select(RolloutRow.id).where(
            RolloutRow.cluster_id == cluster.id,
            RolloutRow.status.in_([s.value for s in ACTIVE]),
        )
    )
    if running is not None:
        raise Conflict(
            f"cluster {cluster.name} has rollout {running} under way; abort it or wait for its end",
            field="cluster_id",
        )
    nodes = list(
        await session.scalars(
            select(NodeRow)
            .where(NodeRow.cluster_id == cluster.id, NodeRow.state.not_in(_GONE))
            .order_by(NodeRow.name)
        )
    )
    moving = [n for n in nodes if (n.stack or cluster.stack) != stack.name]
    if not moving:
        raise Conflict(
            f"every node of cluster {cluster.name} is on stack {stack.name} already",
            field="to_stack",
        )
    rollout = RolloutRow(
        id=new_id(),
        cluster_id=cluster.id,
        from_stack=cluster.stack,
        to_stack=stack.name,
        status=RS.SCHEDULED.value,
        window=window.model_dump(mode="json"),
        max_unavailable=max_unavailable,
        failure_budget=request.failure_budget,
        failures=0,
        on_window_close=request.on_window_close.value,
        reservation="",
        reserved_for="",
        detail=f"waiting for the window: {window.describe()}",
        created_by=caller.actor,
        created_at=now,
        updated_at=now,
    )
    session.add(rollout)
    await session.flush()  # the rollout's row before its nodes' (no ORM relationship)
    for position, node in enumerate(moving):
        session.add(
            RolloutNodeRow(
                id=new_id(),
                rollout_id=rollout.id,
                node_id=node.id,
                position=position,
                status=NS.PENDING.value,
                from_stack=node.stack or cluster.stack,
                attempts=0,
                detail="",
                updated_at=now,
            )
        )
    what = (
        f"cluster {cluster.name}: {len(moving)} node(s) to move from "
        f"{cluster.stack or 'no stack'} to {stack.name} in {window.describe()}, at most "
        f"{max_unavailable} at once, paused after {request.failure_budget} failure(s); at "
        f"the window's close a node not yet reinstalled will {request.on_window_close.value}"
    )
    data = {
        "rollout_id": rollout.id,
        "to_stack": stack.name,
        "from_stack": cluster.stack,
        "window": rollout.window,
        "max_unavailable": max_unavailable,
        "failure_budget": request.failure_budget,
        "on_window_close": request.on_window_close.value,
        "nodes": [n.name for n in moving],
        "reason": request.reason,
    }
    record_event(
        session, kind=EventKind.ROLLOUT_CREATED, message=f"{what} (by {caller.actor})",
        project_id=cluster.project_id, cluster_id=cluster.id, actor=caller.actor, data=data,
        ts=now,
    )  # fmt: skip
    record_audit(
        session, actor=caller.actor, action="rollout.create", object_type="rollout",
        object_id=rollout.id, project_id=cluster.project_id, source_ip=caller.source_ip,
        detail=data, ts=now,
    )  # fmt: skip
    await session.flush()
    return await rollout_view(session, rollout, cluster, now=now)


async def _visible(
    session: AsyncSession, *, caller: Caller, rollout_id: str
) -> tuple[RolloutRow, ClusterRow]:
    """The rollout and its cluster, if the caller may see them (else NotFound)."""
    rollout = await session.get(RolloutRow, rollout_id) if is_id(rollout_id) else None
    cluster = None if rollout is None else await session.get(ClusterRow, rollout.cluster_id)
    if (
        rollout is None
        or cluster is None
        or not caller.can(Permission.CLUSTER_READ, cluster.project_id)
    ):
        raise NotFound(f"rollout {rollout_id!r} not found", field="rollout_id")
    return rollout, cluster


async def _for_admin(
    session: AsyncSession, *, caller: Caller, rollout_id: str
) -> tuple[RolloutRow, ClusterRow]:
    """The rollout, locked, for an admin's change (Forbidden for a member)."""
    rollout, cluster = await _visible(session, caller=caller, rollout_id=rollout_id)
    require(caller, Permission.NODE_ACTION, cluster.project_id)
    await session.refresh(rollout, with_for_update=True)
    return rollout, cluster


async def pause_rollout(
    session: AsyncSession, *, caller: Caller, rollout_id: str, request: RolloutActionRequest,
    now: dt.datetime,
) -> Rollout:  # fmt: skip
    """No node starts until resumed; those under way finish."""
    rollout, cluster = await _for_admin(session, caller=caller, rollout_id=rollout_id)
    if RS(rollout.status) not in (RS.SCHEDULED, RS.RUNNING):
        raise Conflict(f"rollout {rollout.id} is {rollout.status}; it cannot be paused")
    switch_rollout_status(
        session, rollout=rollout, cluster=cluster, target=RS.PAUSED, actor=caller.actor,
        reason=f"paused by {caller.actor}" + (f": {request.reason}" if request.reason else ""),
        now=now, source_ip=caller.source_ip,
    )  # fmt: skip
    return await rollout_view(session, rollout, cluster, now=now)


async def resume_rollout(
    session: AsyncSession, *, caller: Caller, rollout_id: str, request: RolloutActionRequest,
    now: dt.datetime,
) -> Rollout:  # fmt: skip
    """Back to waiting for (or working in) the window; ``retry_failed`` puts failed nodes
    back in line and forgives their failures."""
    rollout, cluster = await _for_admin(session, caller=caller, rollout_id=rollout_id)
    if RS(rollout.status) is not RS.PAUSED:
        raise Conflict(f"rollout {rollout.id} is {rollout.status}; only a paused one resumes")
    failed = [e for e in await _entries(session, rollout.id) if NS(e.status) is NS.FAILED]
    if request.retry_failed:
        for entry in failed:
            entry.repair_id = None  # a failed node without a repair is one to try again
        rollout.failures = 0
    elif rollout.failures >= rollout.failure_budget:
        raise Conflict(
            f"rollout {rollout.id} is at its failure budget ({rollout.failures} of "
            f"{rollout.failure_budget}): resume with retry_failed, roll the failed nodes "
            "back, or abort",
            field="retry_failed",
        )
    reason = f"resumed by {caller.actor}" + (f": {request.reason}" if request.reason else "")
    switch_rollout_status(
        session, rollout=rollout, cluster=cluster, target=RS.SCHEDULED, actor=caller.actor,
        reason=reason, now=now, source_ip=caller.source_ip,
    )  # fmt: skip
    return await rollout_view(session, rollout, cluster, now=now)


async def abort_rollout(
    session: AsyncSession, *, caller: Caller, rollout_id: str, request: RolloutActionRequest,
    now: dt.datetime,
) -> Rollout:  # fmt: skip
    """No node starts any more; those under way finish (their repair brings them back
    into service), then the rollout is aborted. Nodes already moved stay moved."""
    rollout, cluster = await _for_admin(session, caller=caller, rollout_id=rollout_id)
    if RS(rollout.status) not in ACTIVE - {RS.ABORTING}:
        raise Conflict(f"rollout {rollout.id} is {rollout.status}; nothing to abort")
    reason = f"aborted by {caller.actor}" + (f": {request.reason}" if request.reason else "")
    switch_rollout_status(
        session, rollout=rollout, cluster=cluster, target=RS.ABORTING, actor=caller.actor,
        reason=reason, now=now, source_ip=caller.source_ip,
    )  # fmt: skip
    return await rollout_view(session, rollout, cluster, now=now)


async def rollback_node(
    session: AsyncSession, *, caller: Caller, rollout_id: str, node_id: str,
    request: RollbackRequest, now: dt.datetime,
) -> Rollout:  # fmt: skip
    """Put one node back on the stack it came from: one more migration, in the window,
    counted against max unavailable like the others."""
    rollout, cluster = await _for_admin(session, caller=caller, rollout_id=rollout_id)
    entry = await session.scalar(
        select(RolloutNodeRow)
        .where(RolloutNodeRow.rollout_id == rollout.id, RolloutNodeRow.node_id == node_id)
        .with_for_update()
    )
    node = None if entry is None else await session.get(NodeRow, entry.node_id)
    if entry is None or node is None:
        raise NotFound(f"node {node_id!r} is not in rollout {rollout.id}", field="node_id")
    if NS(entry.status) not in (NS.DONE, NS.FAILED):
        raise Conflict(
            f"node {node.name} is {entry.status} in rollout {rollout.id}; only a node done "
            "or failed can be rolled back",
            field="node_id",
        )
    if RS(rollout.status) in FINAL:
        raise Conflict(f"rollout {rollout.id} is {rollout.status}; start a new one instead")
    entry.repair_id = None
    reason = f"rollback to {entry.from_stack or 'no stack'} asked by {caller.actor}" + (
        f": {request.reason}" if request.reason else ""
    )
    switch_rollout_node_status(
        session, entry=entry, rollout=rollout, cluster=cluster, node_name=node.name,
        target=NS.ROLLING_BACK, actor=caller.actor, reason=reason, now=now,
        source_ip=caller.source_ip,
    )  # fmt: skip
    return await rollout_view(session, rollout, cluster, now=now)


# -- what the reconciler does ------------------------------------------------------------


def start_migration(
    session: AsyncSession,
    *,
    rollout: RolloutRow,
    cluster: ClusterRow,
    entry: RolloutNodeRow,
    node: NodeRow,
    now: dt.datetime,
) -> RepairRow:
    """The node's migration (or rollback) begins: the node's stack is set, and its
    repair is made and approved in the author's name (the rollout was their approval).
    The caller holds the node's row and checked it has no open repair."""
    back = NS(entry.status) is NS.ROLLING_BACK
    target = entry.from_stack if back else rollout.to_stack
    node.stack = target
    verb = "roll back" if back else "migrate"
    repair = create_repair(
        session,
        cluster=cluster,
        node=node,
        kind=RepairKind.NODE,
        source=RepairSource.ROLLOUT,
        action=RepairAction.REPROVISION,
        signature_id="stack-rollout",
        reason=f"rollout {rollout.id}: {verb} {node.name} to stack {target or 'none'}",
        rule=f"rollout: at most {rollout.max_unavailable} node(s) at once, in "
        f"{Window.model_validate(rollout.window).describe()}",
        evidence={
            "rollout_id": rollout.id,
            "from_stack": entry.from_stack,
            "to_stack": rollout.to_stack,
            "stack": target,
        },
        finding_ids=[],
        actor=ACTOR,
        now=now,
        requested_by=rollout.created_by,
    )
    repair.progress = {"rollout_id": rollout.id}
    repair.decided_by = rollout.created_by
    repair.decision_reason = f"rollout {rollout.id}"
    repair.approved_at = now
    repair.detail = f"approved by rollout {rollout.id}; starting"
    switch_repair_status(
        session, repair=repair, project_id=cluster.project_id, node_name=node.name,
        target=RepairStatus.APPROVED, actor=ACTOR, reason=f"rollout {rollout.id}", now=now,
    )  # fmt: skip
    entry.repair_id = repair.id
    entry.attempts += 1
    if not back:
        switch_rollout_node_status(
            session, entry=entry, rollout=rollout, cluster=cluster, node_name=node.name,
            target=NS.MIGRATING, actor=ACTOR, reason=f"{verb}: repair {repair.id}", now=now,
        )  # fmt: skip
    else:
        entry.started_at = now
        entry.detail = f"{verb}: repair {repair.id}"
    return repair


@dataclass(frozen=True)
class WindowClosed:
    """A rollout's window is closed: what to do with a node not reinstalled yet."""

    release: bool  # the rollout's policy: let it go (else it waits, cordoned)
    why: str


async def window_closed(db: Database, *, rollout_id: str, now: dt.datetime) -> WindowClosed | None:
    """Why a rollout's node may not be reinstalled now (its window is closed), or None."""
    async with db.session() as session:
        rollout = await session.get(RolloutRow, rollout_id)
    if rollout is None or RS(rollout.status) is RS.ABORTING:
        return None  # an abort lets the nodes under way finish
    window = Window.model_validate(rollout.window)
    if window.open_at(now) is not None:
        return None
    nxt = window.next_opening(now)
    when = f" (next opening {nxt[0].isoformat()})" if nxt else ""
    release = rollout.on_window_close == WindowClose.RELEASE.value
    what = "released, back in service" if release else "waits cordoned for the next opening"
    return WindowClosed(
        release=release,
        why=f"the maintenance window ({window.describe()}) closed before the reinstall: "
        f"the node {what}{when}",
    )


# -- reads -------------------------------------------------------------------------------


async def _entries(session: AsyncSession, rollout_id: str) -> list[RolloutNodeRow]:
    return list(
        await session.scalars(
            select(RolloutNodeRow)
            .where(RolloutNodeRow.rollout_id == rollout_id)
            .order_by(RolloutNodeRow.position)
        )
    )


async def rollout_view(
    session: AsyncSession, rollout: RolloutRow, cluster: ClusterRow, *, now: dt.datetime
) -> Rollout:
    entries = await _entries(session, rollout.id)
    names = dict(
        (await session.execute(
            select(NodeRow.id, NodeRow.name).where(NodeRow.cluster_id == cluster.id)
        )).all()
    )  # fmt: skip
    repair_ids = [e.repair_id for e in entries if e.repair_id]
    statuses = dict(
        (await session.execute(
            select(RepairRow.id, RepairRow.status).where(RepairRow.id.in_(repair_ids))
        )).all()
    ) if repair_ids else {}  # fmt: skip
    window = Window.model_validate(rollout.window)
    nxt = window.next_opening(now) if RS(rollout.status) in ACTIVE else None
    return Rollout(
        id=rollout.id,
        cluster_id=cluster.id,
        cluster_name=cluster.name,
        from_stack=rollout.from_stack,
        to_stack=rollout.to_stack,
        status=RS(rollout.status),
        window=window,
        window_text=window.describe(),
        open_now=window.open_at(now) is not None,
        next_opening=Opening(start=nxt[0], end=nxt[1]) if nxt else None,
        max_unavailable=rollout.max_unavailable,
        failure_budget=rollout.failure_budget,
        failures=rollout.failures,
        on_window_close=WindowClose(rollout.on_window_close),
        reservation=rollout.reservation,
        counts=dict(Counter(e.status for e in entries)),
        detail=rollout.detail,
        created_by=rollout.created_by,
        created_at=rollout.created_at,
        updated_at=rollout.updated_at,
        finished_at=rollout.finished_at,
        nodes=[
            RolloutNode(
                node_id=e.node_id,
                node_name=names.get(e.node_id, e.node_id),
                position=e.position,
                status=NS(e.status),
                from_stack=e.from_stack,
                repair_id=e.repair_id,
                repair_status=statuses.get(e.repair_id) if e.repair_id else None,
                attempts=e.attempts,
                detail=e.detail,
                started_at=e.started_at,
                finished_at=e.finished_at,
            )
            for e in entries
        ],
    )


async def get_rollout(
    session: AsyncSession, *, caller: Caller, rollout_id: str, now: dt.datetime
) -> Rollout:
    rollout, cluster = await _visible(session, caller=caller, rollout_id=rollout_id)
    return await rollout_view(session, rollout, cluster, now=now)


async def list_rollouts(
    session: AsyncSession, *, caller: Caller, cluster_id: str, now: dt.datetime
) -> list[Rollout]:
    """The cluster's rollouts, newest first."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    rows = await session.scalars(
        select(RolloutRow)
        .where(RolloutRow.cluster_id == cluster.id)
        .order_by(RolloutRow.created_at.desc(), RolloutRow.id.desc())
    )
    return [await rollout_view(session, r, cluster, now=now) for r in rows]
