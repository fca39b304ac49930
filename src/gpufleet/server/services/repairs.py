"""Repairs: the queue, approval and dismissal, the one function that changes a repair's
status, and the circuit breaker.

Approval is a transition that needs the admin permission (STYLE §6). Auto-approval by a
project's policy goes through the same ``approve_repair_row`` with a system actor, so it
is recorded the same way and meets the same breaker.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, NodeState, RepairAction, RepairStatus
from gpufleet.core.errors import Conflict, DriverError, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Breaker, Cluster, Node, Page, Repair
from gpufleet.core.rbac import Permission
from gpufleet.core.repair.models import (
    ACTIVE_STATUSES,
    ENDED_STATUSES,
    OPEN_STATUSES,
    PolicyConfig,
    RepairKind,
    RepairSource,
)
from gpufleet.core.repair.policy import breaker_would_trip
from gpufleet.core.transitions import REPAIR
from gpufleet.schedulers.base import SchedJob, jobs_on_nodes
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.metrics import observe_repair_step
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.events import record_event
from gpufleet.server.services.repair_policy import host_of
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.services.transitions import Subject, transition

# Node states that count as "out" for the breaker (besides nodes with an active repair).
OUT_STATES = frozenset(
    {NodeState.CORDONED, NodeState.DRAINING, NodeState.DRAINED, NodeState.REPAIRING}
)
_TERMINAL = ENDED_STATUSES | {
    RepairStatus.REJECTED,
    RepairStatus.SUPERSEDED,
    RepairStatus.RESOLVED,
    RepairStatus.RELEASED,
}


def repair_row_to_repair(
    row: RepairRow, *, node_name: str | None, jobs: list[dict[str, Any]] | None = None
) -> Repair:
    return Repair(
        id=row.id,
        cluster_id=row.cluster_id,
        node_id=row.node_id,
        node_name=node_name,
        kind=row.kind,
        source=row.source,
        action=RepairAction(row.action),
        status=RepairStatus(row.status),
        signature_id=row.signature_id,
        host=row.host,
        gpu_index=row.gpu_index,
        reason=row.reason,
        rule=row.rule,
        evidence=row.evidence or {},
        finding_ids=list(row.finding_ids or []),
        incident_key=row.incident_key,
        node_ids=list(row.node_ids or []),
        escalated_from=RepairAction(row.escalated_from) if row.escalated_from else None,
        auto_approved=row.auto_approved,
        forced=row.forced,
        requested_by=row.requested_by,
        decided_by=row.decided_by,
        decision_reason=row.decision_reason,
        detail=row.detail,
        jobs=jobs,
        created_at=row.created_at,
        updated_at=row.updated_at,
        approved_at=row.approved_at,
        finished_at=row.finished_at,
    )


def _label(row: RepairRow, node_name: str | None) -> str:
    if row.kind == RepairKind.INCIDENT.value:
        return f"incident {row.incident_key}"
    return f"repair {row.id} ({row.action} on {node_name or row.node_id})"


def switch_repair_status(
    session: AsyncSession,
    *,
    repair: RepairRow,
    project_id: str,
    node_name: str | None,
    target: RepairStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
    source_ip: str | None = None,
) -> bool:
    """The one way a repair changes status: checked, evented, audited. False if unchanged."""
    subject = Subject(
        object_id=repair.id,
        label=_label(repair, node_name),
        project_id=project_id,
        cluster_id=repair.cluster_id,
        node_id=repair.node_id,
        ids={"repair_id": repair.id},
    )
    left, entered = repair.status, repair.step_started_at or repair.created_at
    if not transition(
        session, lifecycle=REPAIR, row=repair, subject=subject, target=target, actor=actor,
        reason=reason, now=now, source_ip=source_ip,
    ):  # fmt: skip
        return False
    observe_repair_step(step=left, action=repair.action, seconds=(now - entered).total_seconds())
    repair.updated_at = now
    repair.step_started_at = now
    if target in _TERMINAL:
        repair.finished_at = now
    return True


def create_repair(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    node: NodeRow | None,
    kind: RepairKind,
    source: RepairSource,
    action: RepairAction,
    signature_id: str,
    reason: str,
    rule: str,
    evidence: dict[str, Any],
    finding_ids: Sequence[str],
    actor: str,
    now: dt.datetime,
    node_ids: Sequence[str] = (),
    incident_key: str | None = None,
    gpu_index: int | None = None,
    requested_by: str | None = None,
    detail: str = "",
    source_ip: str | None = None,
) -> RepairRow:
    """A new repair, ``proposed``: the row, its ``repair.propose`` audit row and its event
    (``repair.proposed`` for a node, ``incident.opened`` for an incident), all at ``now``.
    The one place a repair is made: the planner's recommendations and an admin's action.
    The caller checks it is not a duplicate (one open repair per node)."""
    repair = RepairRow(
        id=new_id(),
        cluster_id=cluster.id,
        node_id=node.id if node is not None else None,
        kind=kind.value,
        source=source.value,
        action=action.value,
        status=RepairStatus.PROPOSED.value,
        signature_id=signature_id,
        host=host_of(node) if node is not None else None,
        gpu_index=gpu_index,
        finding_ids=list(finding_ids),
        node_ids=list(node_ids),
        incident_key=incident_key,
        reason=reason,
        rule=rule,
        evidence=evidence,
        requested_by=requested_by,
        progress={},
        detail=detail,
        created_at=now,
        updated_at=now,
    )
    session.add(repair)
    record_audit(
        session,
        actor=actor,
        action="repair.propose",
        object_type="repair",
        object_id=repair.id,
        project_id=cluster.project_id,
        source_ip=source_ip,
        detail={
            "to": RepairStatus.PROPOSED.value,
            "action": action.value,
            "signature": signature_id,
            "rule": rule,
            "reason": reason,
        },
        ts=now,
    )
    if kind is RepairKind.INCIDENT:
        record_event(
            session,
            kind=EventKind.INCIDENT_OPENED,
            message=f"cluster {cluster.name}: {len(repair.node_ids)} nodes behind "
            f"{incident_key} failing together: {reason}",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            actor=actor,
            data={
                "repair_id": repair.id,
                "incident_key": incident_key,
                "node_ids": list(repair.node_ids),
            },
            ts=now,
        )
        return repair
    how = "recommended" if source is RepairSource.POLICY else f"requested by {actor}"
    record_event(
        session,
        kind=EventKind.REPAIR_PROPOSED,
        message=f"node {node.name if node else repair.node_id}: {action.value} {how}: {reason}",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        node_id=repair.node_id,
        actor=actor,
        data={
            "repair_id": repair.id,
            "action": action.value,
            "signature": signature_id,
            "rule": rule,
        },
        ts=now,
    )
    return repair


async def get_repair_row_or_error(
    session: AsyncSession, *, caller: Caller, repair_id: str
) -> tuple[RepairRow, ClusterRow, NodeRow | None]:
    found = (
        (
            await session.execute(
                select(RepairRow, ClusterRow)
                .join(ClusterRow, ClusterRow.id == RepairRow.cluster_id)
                .where(RepairRow.id == repair_id)
            )
        ).first()
        if is_id(repair_id)
        else None
    )
    if found is None or not caller.can(Permission.REPAIR_READ, found[1].project_id):
        raise NotFound(f"repair {repair_id!r} not found", field="repair_id")
    repair, cluster = found
    node = await session.get(NodeRow, repair.node_id) if repair.node_id else None
    return repair, cluster, node


async def list_repairs(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str | None = None,
    node_id: str | None = None,
    status: list[RepairStatus] | None = None,
    kind: RepairKind | None = None,
    open_only: bool = False,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[Repair]:
    """Repairs, newest first."""
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[RepairRow, str] = (
        select(RepairRow, NodeRow.name)
        .join(ClusterRow, ClusterRow.id == RepairRow.cluster_id)
        .outerjoin(NodeRow, NodeRow.id == RepairRow.node_id)
    )
    visible = caller.visible_project_ids()
    if visible is not None:
        allowed = [p for p in visible if caller.can(Permission.REPAIR_READ, p)]
        query = query.where(ClusterRow.project_id.in_(allowed))
    if cluster_id is not None:
        query = query.where(RepairRow.cluster_id == cluster_id)
    if node_id is not None:
        query = query.where(RepairRow.node_id == node_id)
    if status:
        query = query.where(RepairRow.status.in_([s.value for s in status]))
    elif open_only:
        query = query.where(RepairRow.status.in_([s.value for s in OPEN_STATUSES]))
    if kind is not None:
        query = query.where(RepairRow.kind == kind.value)
    if cursor:
        query = query.where(RepairRow.id < cursor)
    rows = (await session.execute(query.order_by(RepairRow.id.desc()).limit(limit + 1))).all()
    items = [repair_row_to_repair(r, node_name=name) for r, name in rows[:limit]]
    return Page[Repair](items=items, next_cursor=items[-1].id if len(rows) > limit else None)


async def get_repair(
    session: AsyncSession, *, caller: Caller, repair_id: str, drivers: DriverRegistry
) -> Repair:
    """One repair, with the jobs on its node read live from the scheduler (the stored
    evidence keeps what ran there when it was recommended).

    The scheduler is asked after this read-only session's transaction has ended (its
    rows stay loaded): no network call inside a transaction, and on SQLite a driver that
    reads the store itself (a kubernetes cluster's, for its kubeconfig) would otherwise
    wait on this session's lock."""
    repair, cluster, node = await get_repair_row_or_error(
        session, caller=caller, repair_id=repair_id
    )
    jobs: list[dict[str, Any]] | None = None
    if node is not None and RepairStatus(repair.status) in OPEN_STATUSES:
        await session.commit()  # nothing written; ends the transaction, rows kept
        jobs = await jobs_on_node(drivers, cluster=cluster, node=node)
    return repair_row_to_repair(repair, node_name=node.name if node else None, jobs=jobs)


async def jobs_on_node(
    drivers: DriverRegistry, *, cluster: Cluster | ClusterRow, node: Node | NodeRow
) -> list[dict[str, Any]]:
    """The jobs, users and projects (accounts) on a node, for a human; an unreadable
    scheduler is said so, never shown as "no jobs"."""
    try:
        scheduler = scheduler_for(drivers, cluster)
        jobs = await scheduler.jobs_on_node(node.scheduler_name or node.name)
    except (DriverError, InvalidInput) as exc:
        return _unreadable(exc)
    return _job_rows(jobs)


async def jobs_on_nodes_for_humans(
    drivers: DriverRegistry, *, cluster: Cluster | ClusterRow, nodes: Sequence[Node | NodeRow]
) -> list[list[dict[str, Any]]]:
    """:func:`jobs_on_node` of each of ``nodes`` (of one cluster), in order, from one
    read of the scheduler where it can answer for many (``schedulers.base.jobs_on_nodes``)."""
    try:
        scheduler = scheduler_for(drivers, cluster)
    except InvalidInput as exc:
        return [_unreadable(exc) for _ in nodes]
    names = [n.scheduler_name or n.name for n in nodes]
    found = await jobs_on_nodes(scheduler, names)
    return [
        _unreadable(jobs) if isinstance(jobs := found[name], DriverError) else _job_rows(jobs)
        for name in names
    ]


def _unreadable(exc: DriverError | InvalidInput) -> list[dict[str, Any]]:
    return [{"error": f"job state unreadable: {exc.message}"}]


def _job_rows(jobs: list[SchedJob]) -> list[dict[str, Any]]:
    return [
        {
            "job_id": j.job_id,
            "name": j.name,
            "user": j.user,
            "account": j.account,
            "state": j.state,
            "gpus": j.gpus,
            "started_at": j.started_at.isoformat() if j.started_at else None,
        }
        for j in jobs
    ]


# -- approval -------------------------------------------------------------------------


async def approve_repair_row(
    session: AsyncSession,
    *,
    repair: RepairRow,
    cluster: ClusterRow,
    node: NodeRow | None,
    policy: PolicyConfig,
    actor: str,
    reason: str,
    force: bool = False,
    now: dt.datetime,
    source_ip: str | None = None,
) -> str | None:
    """PROPOSED → APPROVED. Returns None when approved, or why the breaker refused it (it
    trips here, recorded in this transaction; the caller commits, then says no)."""
    if RepairStatus(repair.status) is not RepairStatus.PROPOSED:
        raise Conflict(
            f"repair {repair.id} is {repair.status}; only a proposed repair can be approved",
            field="status",
        )
    if repair.kind == RepairKind.INCIDENT.value:
        raise Conflict(
            f"incident {repair.incident_key} is an infrastructure fault with no node action: "
            "fix the shared component, then dismiss it with a reason (dismissing it lets "
            "each node's own repair be recommended)",
            field="kind",
        )
    refusal = await breaker_refusal(
        session, cluster=cluster, policy=policy, now=now, actor=actor, node_id=repair.node_id
    )
    if refusal is not None:
        return refusal
    repair.decided_by = actor
    repair.decision_reason = reason or None
    repair.approved_at = now
    repair.detail = f"approved by {actor}; starting"
    repair.forced = repair.forced or force
    switch_repair_status(
        session,
        repair=repair,
        project_id=cluster.project_id,
        node_name=node.name if node else None,
        target=RepairStatus.APPROVED,
        actor=actor,
        reason=reason or "approved",
        now=now,
        source_ip=source_ip,
    )
    return None


async def breaker_refusal(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    policy: PolicyConfig,
    now: dt.datetime,
    actor: str,
    node_id: str | None = None,
) -> str | None:
    """Why no repair may start now: the breaker is tripped, or one more repair would put
    more than the policy's share of the cluster out of service (then it trips, here).
    ``node_id``: the node the repair is for, which never counts against itself (a node a
    failed repair left cordoned takes its next rung)."""
    if cluster.repair_breaker_tripped_at is not None:
        return (
            f"the repair breaker of cluster {cluster.name} is tripped "
            f"({cluster.repair_breaker_reason}); an admin must reset it "
            f"(gpufleet clusters breaker-reset {cluster.name} --reason ...)"
        )
    affected, total = await count_out_nodes(session, cluster_id=cluster.id, exclude=node_id)
    if not breaker_would_trip(total_nodes=total, affected_nodes=affected, config=policy):
        return None
    why = (
        f"{affected} of {total} nodes already cordoned or repairing; one more would exceed "
        f"{policy.breaker_max_share:.0%}"
    )
    cluster.repair_breaker_tripped_at = now
    cluster.repair_breaker_reason = why
    record_event(
        session,
        kind=EventKind.BREAKER_TRIPPED,
        message=f"cluster {cluster.name}: repair breaker tripped: {why}",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        actor=actor,
        data={"affected": affected, "total": total, "max_share": policy.breaker_max_share},
        ts=now,
    )
    return (
        f"the repair breaker of cluster {cluster.name} tripped: {why}; no repair starts "
        "until an admin resets it"
    )


async def count_out_nodes(
    session: AsyncSession, *, cluster_id: str, exclude: str | None = None
) -> tuple[int, int]:
    """(nodes cordoned, draining, repairing or with an active repair, but ``exclude``;
    live nodes)."""
    nodes = (
        await session.execute(
            select(NodeRow.id, NodeRow.state).where(
                NodeRow.cluster_id == cluster_id,
                NodeRow.state.not_in([NodeState.REMOVED.value, NodeState.REMOVING.value]),
            )
        )
    ).all()
    active = set(
        await session.scalars(
            select(RepairRow.node_id).where(
                RepairRow.cluster_id == cluster_id,
                RepairRow.status.in_([s.value for s in ACTIVE_STATUSES]),
            )
        )
    )
    out = sum(
        1
        for node_id, state in nodes
        if node_id != exclude and (NodeState(state) in OUT_STATES or node_id in active)
    )
    return out, len(nodes)


async def get_breaker(
    session: AsyncSession, *, cluster: ClusterRow, policy: PolicyConfig
) -> Breaker:
    affected, total = await count_out_nodes(session, cluster_id=cluster.id)
    return Breaker(
        cluster_id=cluster.id,
        tripped=cluster.repair_breaker_tripped_at is not None,
        tripped_at=cluster.repair_breaker_tripped_at,
        reason=cluster.repair_breaker_reason,
        max_share=policy.breaker_max_share,
        affected_nodes=affected,
        total_nodes=total,
    )


def reset_breaker(
    session: AsyncSession, *, cluster: ClusterRow, caller: Caller, reason: str, now: dt.datetime
) -> bool:
    require(caller, Permission.POLICY_MANAGE, cluster.project_id)
    if cluster.repair_breaker_tripped_at is None:
        record_audit(  # not tripped: nothing changes, but the ask is on record
            session,
            actor=caller.actor,
            action="cluster.breaker_reset",
            object_type="cluster",
            object_id=cluster.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={"reason": reason, "changed": False},
            ts=now,
        )
        return False
    record_event(
        session,
        kind=EventKind.BREAKER_RESET,
        message=f"cluster {cluster.name}: repair breaker reset: {reason}",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        actor=caller.actor,
        data={"was": cluster.repair_breaker_reason, "reason": reason},
        ts=now,
    )
    record_audit(
        session,
        actor=caller.actor,
        action="cluster.breaker_reset",
        object_type="cluster",
        object_id=cluster.id,
        project_id=cluster.project_id,
        source_ip=caller.source_ip,
        detail={"reason": reason, "was": cluster.repair_breaker_reason},
        ts=now,
    )
    cluster.repair_breaker_tripped_at = None
    cluster.repair_breaker_reason = None
    cluster.updated_at = now
    return True


async def open_repair_on_node(session: AsyncSession, *, node_id: str) -> RepairRow | None:
    return (
        await session.scalars(
            select(RepairRow)
            .where(
                RepairRow.node_id == node_id,
                RepairRow.status.in_([s.value for s in OPEN_STATUSES]),
            )
            .order_by(RepairRow.id.desc())
            .limit(1)
        )
    ).first()
