"""What an admin does to repairs and nodes: approve, dismiss, force; cordon, uncordon,
drain, retry_startup, and the node actions that run as a repair ("three clicks").

Every action runs the same pipeline and writes the same events and audit rows as a
recommended repair; the executor carries it out.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from gpufleet.core.enums import EventKind, NodeState, RepairStatus
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.core.holds import manual_hold
from gpufleet.core.models import Breaker, Node, NodeAction, NodeActionResult, Repair
from gpufleet.core.rbac import Permission
from gpufleet.core.repair.models import (
    ACTIVE_STATUSES,
    PolicyConfig,
    RepairKind,
    RepairSource,
)
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.schemas.repairs import (
    REPAIR_NODE_ACTIONS,
    ApproveRepairRequest,
    DismissRepairRequest,
    ForceRepairRequest,
    NodeActionRequest,
    ResetBreakerRequest,
)
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_holds import (
    Release,
    can_hold,
    hold_in_scheduler,
    record_hold,
    record_release,
    release_in_scheduler,
)
from gpufleet.server.services.nodes import (
    get_node_row_or_error,
    node_row_to_node,
)
from gpufleet.server.services.repair_policy import load_policy
from gpufleet.server.services.repairs import (
    approve_repair_row,
    breaker_refusal,
    create_repair,
    get_breaker,
    get_repair_row_or_error,
    jobs_on_node,
    open_repair_on_node,
    repair_row_to_repair,
    reset_breaker,
    switch_repair_status,
)
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.services.startup_scripts import retry_startup


async def approve_repair(
    db: Database,
    *,
    caller: Caller,
    repair_id: str,
    request: ApproveRepairRequest,
    default_policy: PolicyConfig,
    now: dt.datetime,
) -> Repair:
    async with db.transaction() as session:
        repair, cluster, node = await get_repair_row_or_error(
            session, caller=caller, repair_id=repair_id
        )
        require(caller, Permission.REPAIR_APPROVE, cluster.project_id)
        await session.refresh(cluster, with_for_update=True)
        policy = await load_policy(session, project_id=cluster.project_id, default=default_policy)
        refusal = await approve_repair_row(
            session,
            repair=repair,
            cluster=cluster,
            node=node,
            policy=policy,
            actor=caller.actor,
            reason=request.reason,
            force=request.force,
            now=now,
            source_ip=caller.source_ip,
        )
        out = repair_row_to_repair(repair, node_name=node.name if node else None)
    if refusal is not None:  # the trip is committed; the approval is not
        raise Conflict(refusal, field="breaker")
    return out


async def dismiss_repair(
    db: Database, *, caller: Caller, repair_id: str, request: DismissRepairRequest, now: dt.datetime
) -> Repair:
    async with db.transaction() as session:
        repair, cluster, node = await get_repair_row_or_error(
            session, caller=caller, repair_id=repair_id
        )
        require(caller, Permission.REPAIR_APPROVE, cluster.project_id)
        if repair.status != RepairStatus.PROPOSED.value:
            raise Conflict(
                f"repair {repair.id} is {repair.status}; only a proposed repair can be dismissed",
                field="status",
            )
        repair.decided_by = caller.actor
        repair.decision_reason = request.reason
        repair.detail = f"dismissed: {request.reason}"
        switch_repair_status(
            session,
            repair=repair,
            project_id=cluster.project_id,
            node_name=node.name if node else None,
            target=RepairStatus.REJECTED,
            actor=caller.actor,
            reason=request.reason,
            now=now,
            source_ip=caller.source_ip,
        )
        return repair_row_to_repair(repair, node_name=node.name if node else None)


async def force_repair(
    db: Database, *, caller: Caller, repair_id: str, request: ForceRepairRequest, now: dt.datetime
) -> Repair:
    """Let a draining repair kill the jobs still on its node, now. An explicit admin act."""
    async with db.transaction() as session:
        repair, cluster, node = await get_repair_row_or_error(
            session, caller=caller, repair_id=repair_id
        )
        require(caller, Permission.REPAIR_APPROVE, cluster.project_id)
        if repair.status not in (RepairStatus.APPROVED.value, RepairStatus.CORDONING.value,
                                 RepairStatus.DRAINING.value):  # fmt: skip
            raise Conflict(
                f"repair {repair.id} is {repair.status}; force applies while it drains",
                field="status",
            )
        repair.forced = True
        repair.progress = {**(repair.progress or {}), "kill_now": True}
        repair.updated_at = now
        record_audit(
            session,
            actor=caller.actor,
            action="repair.force",
            object_type="repair",
            object_id=repair.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={"reason": request.reason},
            ts=now,
        )
        record_event(
            session,
            kind=EventKind.REPAIR_STEP,
            message=f"repair {repair.id}: forced by {caller.actor}: jobs on "
            f"{node.name if node else '?'} will be killed: {request.reason}",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=repair.node_id,
            actor=caller.actor,
            data={"reason": request.reason},
            ts=now,
        )
        return repair_row_to_repair(repair, node_name=node.name if node else None)


async def node_action(
    db: Database,
    *,
    caller: Caller,
    node_id: str,
    request: NodeActionRequest,
    drivers: DriverRegistry,
    default_policy: PolicyConfig,
    staleness_s: float,
    now: dt.datetime,
) -> NodeActionResult:
    """Run one admin action on a node: the node after it, and the repair it started."""
    async with db.session() as session:
        node, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
    require(caller, Permission.NODE_ACTION, cluster.project_id)
    if request.action is NodeAction.RETRY_STARTUP:
        await retry_startup(db, caller=caller, node_id=node.id, reason=request.reason, now=now)
        return NodeActionResult(node=await _node(db, node.id, staleness_s, now), repair=None)
    if request.action in REPAIR_NODE_ACTIONS:
        repair = await _manual_repair(
            db, caller=caller, node=node, cluster=cluster, request=request,
            drivers=drivers, default_policy=default_policy, now=now,
        )  # fmt: skip
        return NodeActionResult(node=await _node(db, node.id, staleness_s, now), repair=repair)
    await _hold_action(db, caller=caller, node=node, cluster=cluster, request=request,
                       drivers=drivers, now=now)  # fmt: skip
    return NodeActionResult(node=await _node(db, node.id, staleness_s, now), repair=None)


async def _node(db: Database, node_id: str, staleness_s: float, now: dt.datetime) -> Node:
    async with db.session() as session:
        row = await session.get(NodeRow, node_id)
        assert row is not None
        return node_row_to_node(row, now=now, staleness_s=staleness_s)


async def _manual_repair(
    db: Database,
    *,
    caller: Caller,
    node: NodeRow,
    cluster: ClusterRow,
    request: NodeActionRequest,
    drivers: DriverRegistry,
    default_policy: PolicyConfig,
    now: dt.datetime,
) -> Repair:
    if NodeState(node.state) not in _ACTIONABLE:
        raise Conflict(f"node {node.name} is {node.state}; nothing to {request.action.value}")
    action = REPAIR_NODE_ACTIONS[request.action]
    if action in drivers.unsupported_actions(cluster):
        raise InvalidInput(
            f"cluster {cluster.name}'s provider {cluster.provider!r} cannot {action.value} a "
            f"machine; choose another action (reboot, replace or remove where it can)",
            field="action",
        )
    jobs = await jobs_on_node(drivers, cluster=cluster, node=node)
    async with db.transaction() as session:
        cluster_row = await session.get(ClusterRow, cluster.id, with_for_update=True)
        node_row = await session.get(NodeRow, node.id, with_for_update=True)
        assert cluster_row is not None and node_row is not None
        existing = await open_repair_on_node(session, node_id=node.id)
        if existing is not None and existing.status != RepairStatus.PROPOSED.value:
            raise Conflict(
                f"node {node.name} already has repair {existing.id} ({existing.action}, "
                f"{existing.status}); wait for it to end",
                field="node_id",
            )
        policy = await load_policy(session, project_id=cluster.project_id, default=default_policy)
        refusal = await breaker_refusal(
            session, cluster=cluster_row, policy=policy, now=now, actor=caller.actor,
            node_id=node.id,
        )  # fmt: skip
        if refusal is None:
            if existing is not None:
                switch_repair_status(
                    session, repair=existing, project_id=cluster.project_id,
                    node_name=node.name, target=RepairStatus.SUPERSEDED, actor=caller.actor,
                    reason=f"replaced by {caller.actor}'s {action.value}", now=now,
                )  # fmt: skip
            findings = list(
                await session.scalars(
                    select(FindingRow).where(
                        FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None)
                    )
                )
            )
            repair = create_repair(
                session,
                cluster=cluster_row,
                node=node_row,
                kind=RepairKind.NODE,
                source=RepairSource.MANUAL,
                action=action,
                signature_id="manual",
                gpu_index=request.gpu_index,
                finding_ids=[f.id for f in findings],
                reason=f"{caller.actor}: {request.action.value} {node.name}: {request.reason}",
                rule=f"manual: {request.action.value} by an admin",
                evidence={
                    "findings": [
                        {
                            "id": f.id,
                            "signature_id": f.signature_id,
                            "title": f.title,
                            "severity": f.severity,
                            "evidence": f.evidence,
                        }
                        for f in findings
                    ],
                    "jobs": jobs,
                },
                requested_by=caller.actor,
                actor=caller.actor,
                now=now,
                source_ip=caller.source_ip,
            )
            await session.flush()
            await approve_repair_row(
                session, repair=repair, cluster=cluster_row, node=node_row, policy=policy,
                actor=caller.actor, reason=request.reason, force=request.force, now=now,
                source_ip=caller.source_ip,
            )  # fmt: skip
            out = repair_row_to_repair(repair, node_name=node.name)
    if refusal is not None:
        raise Conflict(refusal, field="breaker")
    return out


_ACTIONABLE = frozenset(
    {
        NodeState.IN_SERVICE,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.DRAINED,
        NodeState.ACCEPTANCE,
    }
)


async def _hold_action(
    db: Database,
    *,
    caller: Caller,
    node: NodeRow,
    cluster: ClusterRow,
    request: NodeActionRequest,
    drivers: DriverRegistry,
    now: dt.datetime,
) -> None:
    """cordon, uncordon, drain: the scheduler first, then the node's state."""
    async with db.session() as session:
        active = await open_repair_on_node(session, node_id=node.id)
    if active is not None and RepairStatus(active.status) in ACTIVE_STATUSES:
        raise Conflict(
            f"node {node.name} is under repair {active.id} ({active.status}); "
            "it returns to service when the repair ends",
            field="node_id",
        )
    state = NodeState(node.state)
    kind = request.action
    targets: list[NodeState] = []  # uncordon: in service, through record_release
    if kind is NodeAction.CORDON:
        targets = [] if state is NodeState.CORDONED else [NodeState.CORDONED]
    elif kind is NodeAction.DRAIN:
        targets = [] if state in (NodeState.DRAINING, NodeState.DRAINED) else [NodeState.DRAINING]
        if state is NodeState.IN_SERVICE:
            targets = [NodeState.CORDONED, NodeState.DRAINING]
    if state not in _ACTIONABLE:
        raise Conflict(f"node {node.name} is {node.state}; it cannot be {kind.value}ed")
    scheduler = scheduler_for(drivers, cluster)
    name = node.scheduler_name or node.name
    if not can_hold(scheduler):
        raise Conflict(f"scheduler {scheduler.kind} cannot {kind.value} nodes")
    release: Release | None = None
    if kind is NodeAction.UNCORDON:
        # Only gpufleet's drain is undone; the driver's refusal names whose it is.
        release = await release_in_scheduler(scheduler, name)
        if release.error is not None:
            raise Conflict(release.error, field="node_id")
    else:
        reason = manual_hold(action=kind.value, actor=caller.actor, note=request.reason)
        await hold_in_scheduler(scheduler, name, reason=reason)
    async with db.transaction() as session:
        row = await session.get(NodeRow, node.id, with_for_update=True)
        assert row is not None
        why = f"{kind.value}: {request.reason}"
        if release is not None:  # in service (nobody else's drain: the release succeeded)
            record_release(
                session, node=row, project_id=cluster.project_id, release=release,
                actor=caller.actor, reason=why, now=now,
            )  # fmt: skip
        else:
            record_hold(
                session, node=row, project_id=cluster.project_id, targets=targets,
                actor=caller.actor, reason=why, now=now,
            )  # fmt: skip
        record_event(
            session,
            kind=EventKind.NODE_ACTION,
            message=f"node {node.name}: {kind.value} by {caller.actor}: {request.reason}",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=node.id,
            actor=caller.actor,
            data={"action": kind.value, "reason": request.reason},
            ts=now,
        )
        record_audit(
            session,
            actor=caller.actor,
            action=f"node.{kind.value}",
            object_type="node",
            object_id=node.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={"reason": request.reason, "from": state.value},
            ts=now,
        )


async def show_breaker(
    db: Database, *, caller: Caller, cluster_id: str, default_policy: PolicyConfig
) -> Breaker:
    async with db.session() as session:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        policy = await load_policy(session, project_id=cluster.project_id, default=default_policy)
        return await get_breaker(session, cluster=cluster, policy=policy)


async def reset_cluster_breaker(
    db: Database,
    *,
    caller: Caller,
    cluster_id: str,
    request: ResetBreakerRequest,
    default_policy: PolicyConfig,
    now: dt.datetime,
) -> Breaker:
    async with db.transaction() as session:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        await session.refresh(cluster, with_for_update=True)
        reset_breaker(session, cluster=cluster, caller=caller, reason=request.reason, now=now)
        policy = await load_policy(session, project_id=cluster.project_id, default=default_policy)
        return await get_breaker(session, cluster=cluster, policy=policy)
