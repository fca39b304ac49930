"""A project's repair policy: stored as JSON, read as ``PolicyConfig``; and the dry run."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus, Severity
from gpufleet.core.errors import InvalidInput
from gpufleet.core.rbac import Permission
from gpufleet.core.repair.models import (
    AutoApproveRule,
    DrainTimeoutAction,
    FindingFact,
    NodeFact,
    PolicyConfig,
    RepairFact,
    RepairKind,
    RepairSource,
)
from gpufleet.core.repair.replay import ReplayReport, replay
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow, RepairPolicyRow, RepairRow
from gpufleet.server.schemas.repairs import RepairPolicyRequest, ReplayRequest
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.projects import get_project_row_or_error


def policy_from_json(raw: dict[str, Any]) -> PolicyConfig:
    rules = tuple(
        AutoApproveRule(signature_id=str(r["signature_id"]), action=RepairAction(r["action"]))
        for r in raw.get("auto_approve", [])
    )
    fields = {k: v for k, v in raw.items() if k != "auto_approve"}
    if "drain_timeout_action" in fields:
        fields["drain_timeout_action"] = DrainTimeoutAction(fields["drain_timeout_action"])
    return PolicyConfig(**fields, auto_approve=rules)


def policy_to_json(config: PolicyConfig) -> dict[str, Any]:
    return {
        "ttl_s": config.ttl_s,
        "cooldown_s": config.cooldown_s,
        "ladder_window_s": config.ladder_window_s,
        "breaker_max_share": config.breaker_max_share,
        "incident_min_nodes": config.incident_min_nodes,
        "incident_window_s": config.incident_window_s,
        "drain_timeout_s": config.drain_timeout_s,
        "drain_timeout_action": config.drain_timeout_action.value,
        "verify_settle_s": config.verify_settle_s,
        "verify_timeout_s": config.verify_timeout_s,
        "auto_approve": [
            {"signature_id": r.signature_id, "action": r.action.value} for r in config.auto_approve
        ],
    }


def policy_from_request(request: RepairPolicyRequest) -> PolicyConfig:
    raw = request.model_dump(mode="json")
    return policy_from_json(raw)


async def load_policy(
    session: AsyncSession, *, project_id: str, default: PolicyConfig | None = None
) -> PolicyConfig:
    """The project's policy; ``default`` (the server's) when it never set one."""
    row = await session.get(RepairPolicyRow, project_id)
    if row is None:
        return default or PolicyConfig()
    return policy_from_json(row.config)


async def _project_or_error(session: AsyncSession, *, caller: Caller, project_id: str) -> str:
    row = await get_project_row_or_error(session, caller=caller, ref=project_id)
    return row.id


async def get_policy(
    session: AsyncSession, *, caller: Caller, project_id: str, default: PolicyConfig
) -> PolicyConfig:
    project_id = await _project_or_error(session, caller=caller, project_id=project_id)
    return await load_policy(session, project_id=project_id, default=default)


async def set_policy(
    session: AsyncSession,
    *,
    caller: Caller,
    project_id: str,
    request: RepairPolicyRequest,
    now: dt.datetime,
) -> PolicyConfig:
    project_id = await _project_or_error(session, caller=caller, project_id=project_id)
    require(caller, Permission.POLICY_MANAGE, project_id)
    policy = policy_from_request(request)
    config = policy_to_json(policy)
    row = await session.get(RepairPolicyRow, project_id)
    old = None if row is None else row.config
    if row is None:
        session.add(
            RepairPolicyRow(
                project_id=project_id, config=config, updated_by=caller.actor, updated_at=now
            )
        )
    else:
        row.config, row.updated_by, row.updated_at = config, caller.actor, now
    record_audit(
        session,
        actor=caller.actor,
        action="repair_policy.set",
        object_type="project",
        object_id=project_id,
        project_id=project_id,
        source_ip=caller.source_ip,
        detail={"old": old, "new": config},
    )
    return policy


def host_of(node: NodeRow) -> str:
    """The machine a node runs on now: its serial, else its instance, else the slot."""
    return node.serial or node.provider_instance_id or node.id


def node_fact(node: NodeRow) -> NodeFact:
    return NodeFact(
        id=node.id,
        name=node.name,
        state=NodeState(node.state),
        host=host_of(node),
        rack=node.rack,
        leaf_switch=node.leaf_switch,
        pdu=node.pdu,
    )


def finding_fact(row: FindingRow) -> FindingFact:
    return FindingFact(
        id=row.id,
        node_id=row.node_id,
        signature_id=row.signature_id,
        severity=Severity(row.severity),
        title=row.title,
        evidence=row.evidence,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        cleared_at=row.cleared_at,
        gpu_index=row.gpu_index,
        count=row.count,
    )


def repair_fact(row: RepairRow) -> RepairFact:
    return RepairFact(
        id=row.id,
        kind=RepairKind(row.kind),
        action=RepairAction(row.action),
        status=RepairStatus(row.status),
        signature_id=row.signature_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        node_id=row.node_id,
        host=row.host,
        finding_ids=tuple(row.finding_ids or ()),
        finished_at=row.finished_at,
        incident_key=row.incident_key,
        node_ids=tuple(row.node_ids or ()),
        source=RepairSource(row.source),
    )


async def replay_policy(
    session: AsyncSession,
    *,
    caller: Caller,
    project_id: str,
    request: ReplayRequest,
    default: PolicyConfig,
    now: dt.datetime,
) -> ReplayReport:
    """What a policy would have done over the stored findings of the last ``days``."""
    project_id = await _project_or_error(session, caller=caller, project_id=project_id)
    require(caller, Permission.REPAIR_READ, project_id)
    config = (
        policy_from_request(request.policy)
        if request.policy is not None
        else await load_policy(session, project_id=project_id, default=default)
    )
    start = now - dt.timedelta(days=request.days)
    clusters = select(ClusterRow.id).where(ClusterRow.project_id == project_id)
    if request.cluster_id is not None:
        owner = await session.scalar(
            select(ClusterRow.project_id).where(ClusterRow.id == request.cluster_id)
        )
        if owner != project_id:
            raise InvalidInput(
                f"cluster {request.cluster_id!r} is not in project {project_id}",
                field="cluster_id",
            )
        clusters = clusters.where(ClusterRow.id == request.cluster_id)
    nodes = list(await session.scalars(select(NodeRow).where(NodeRow.cluster_id.in_(clusters))))
    findings = list(
        await session.scalars(
            select(FindingRow).where(
                FindingRow.cluster_id.in_(clusters),
                FindingRow.first_seen <= now,
                or_(FindingRow.cleared_at.is_(None), FindingRow.cleared_at >= start),
            )
        )
    )
    history = list(
        await session.scalars(
            select(RepairRow).where(
                RepairRow.cluster_id.in_(clusters),
                RepairRow.finished_at.is_not(None),
                RepairRow.finished_at < start,
                RepairRow.finished_at >= start - dt.timedelta(seconds=config.ladder_window_s),
            )
        )
    )
    return replay(
        nodes=[node_fact(n) for n in nodes],
        findings=[finding_fact(f) for f in findings],
        history=[repair_fact(r) for r in history],
        config=config,
        start=start,
        end=now,
    )
