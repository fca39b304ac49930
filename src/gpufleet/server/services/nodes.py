"""Nodes and their GPUs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import Health, NodeState
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.health import shown_health
from gpufleet.core.ids import is_id
from gpufleet.core.models import Gpu, Node, Page
from gpufleet.core.rbac import Permission
from gpufleet.core.stacks import NodeSoftware
from gpufleet.core.transitions import NODE
from gpufleet.server.db.tables import ClusterRow, GpuRow, NodeRow
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.stacks import node_skew
from gpufleet.server.services.transitions import Subject, transition

# States in which a node is expected to report; elsewhere silence is not news.
REPORTING_STATES = frozenset(
    {
        NodeState.ACCEPTANCE,
        NodeState.IN_SERVICE,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.DRAINED,
    }
)


def effective_health(row: NodeRow, *, now: dt.datetime, staleness_s: float) -> Health:
    """The stored health, except that a silent node reads as unknown at once
    (``core.health.shown_health``)."""
    return shown_health(
        Health(row.health), last_report_at=row.last_report_at, now=now, staleness_s=staleness_s
    )


def gpu_health(row: GpuRow, *, node_health: Health) -> Health:
    if node_health is Health.UNKNOWN:
        return Health.UNKNOWN
    return Health(row.health)


def gpu_row_to_gpu(row: GpuRow, *, node_health: Health) -> Gpu:
    return Gpu(
        id=row.id,
        node_id=row.node_id,
        index=row.index,
        uuid=row.uuid,
        serial=row.serial,
        model=row.model,
        health=gpu_health(row, node_health=node_health),
        utilization_pct=row.utilization_pct,
        memory_used_mib=row.memory_used_mib,
        memory_total_mib=row.memory_total_mib,
        temperature_c=row.temperature_c,
        power_w=row.power_w,
        sm_clock_mhz=row.sm_clock_mhz,
        ecc_sbe_volatile=row.ecc_sbe_volatile,
        ecc_dbe_volatile=row.ecc_dbe_volatile,
        ecc_sbe_aggregate=row.ecc_sbe_aggregate,
        ecc_dbe_aggregate=row.ecc_dbe_aggregate,
        sampled_at=row.sampled_at,
    )


def node_row_to_node(
    row: NodeRow,
    *,
    now: dt.datetime,
    staleness_s: float,
    gpus: Sequence[GpuRow] | None = None,
) -> Node:
    health = effective_health(row, now=now, staleness_s=staleness_s)
    return Node(
        id=row.id,
        cluster_id=row.cluster_id,
        name=row.name,
        hostname=row.hostname,
        scheduler_name=row.scheduler_name,
        serial=row.serial,
        provider_instance_id=row.provider_instance_id,
        state=NodeState(row.state),
        health=health,
        rack=row.rack,
        leaf_switch=row.leaf_switch,
        pdu=row.pdu,
        expected_gpus=row.expected_gpus,
        last_report_at=row.last_report_at,
        last_report_seq=row.last_report_seq,
        created_at=row.created_at,
        updated_at=row.updated_at,
        gpus=None
        if gpus is None
        else [gpu_row_to_gpu(g, node_health=health) for g in sorted(gpus, key=lambda g: g.index)],
        state_detail=row.state_detail or "",
        boot_id=row.boot_id,
        boot_seen_at=row.boot_seen_at,
        software=NodeSoftware.model_validate(row.software) if row.software else None,
    )


async def get_node_row_or_error(
    session: AsyncSession, *, caller: Caller, node_id: str
) -> tuple[NodeRow, ClusterRow]:
    if not is_id(node_id):
        raise NotFound(f"node {node_id!r} not found", field="node_id")
    result = (
        await session.execute(
            select(NodeRow, ClusterRow)
            .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
            .where(NodeRow.id == node_id)
        )
    ).first()
    if result is None or not caller.can(Permission.NODE_READ, result[1].project_id):
        raise NotFound(f"node {node_id!r} not found", field="node_id")
    return result[0], result[1]


async def find_node_id(session: AsyncSession, *, cluster_id: str, name: str) -> str | None:
    """The node of that name in a cluster the caller may already see, removed or not."""
    return await session.scalar(
        select(NodeRow.id).where(NodeRow.cluster_id == cluster_id, NodeRow.name == name)
    )


async def get_node(
    session: AsyncSession, *, caller: Caller, node_id: str, staleness_s: float, now: dt.datetime
) -> Node:
    row, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
    gpus = (
        await session.scalars(
            select(GpuRow).where(GpuRow.node_id == row.id, GpuRow.removed_at.is_(None))
        )
    ).all()
    node = node_row_to_node(row, now=now, staleness_s=staleness_s, gpus=gpus)
    return node.model_copy(update={"stack_skew": await node_skew(session, row, cluster)})


async def list_nodes(
    session: AsyncSession,
    *,
    caller: Caller,
    staleness_s: float,
    now: dt.datetime,
    cluster_id: str | None = None,
    state: NodeState | None = None,
    health: Health | None = None,
    cursor: str | None = None,
    limit: int = 100,
    with_gpus: bool = False,
) -> Page[Node]:
    """Nodes in creation order (slot order within a cluster). Removed nodes are left out
    unless ``state=removed`` is asked for."""
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[NodeRow] = select(NodeRow).join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
    visible = caller.visible_project_ids()
    if visible is not None:
        query = query.where(ClusterRow.project_id.in_(visible))
    if cluster_id is not None:
        query = query.where(NodeRow.cluster_id == cluster_id)
    if state is not None:
        query = query.where(NodeRow.state == state.value)
    else:
        query = query.where(NodeRow.state != NodeState.REMOVED.value)
    if cursor:
        query = query.where(NodeRow.id > cursor)
    # Health filtering happens after effective_health, so it matches what is shown.
    fetch = limit + 1 if health is None else None
    query = query.order_by(NodeRow.id)
    if fetch is not None:
        query = query.limit(fetch)
    rows = list((await session.scalars(query)).all())
    if health is not None:
        rows = [r for r in rows if effective_health(r, now=now, staleness_s=staleness_s) is health]
        rows = rows[: limit + 1]
    page_rows = rows[:limit]
    gpus_by_node: dict[str, list[GpuRow]] = {}
    if with_gpus and page_rows:
        for g in await session.scalars(
            select(GpuRow).where(
                GpuRow.node_id.in_([r.id for r in page_rows]), GpuRow.removed_at.is_(None)
            )
        ):
            gpus_by_node.setdefault(g.node_id, []).append(g)
    items = [
        node_row_to_node(
            r,
            now=now,
            staleness_s=staleness_s,
            gpus=gpus_by_node.get(r.id, []) if with_gpus else None,
        )
        for r in page_rows
    ]
    return Page[Node](items=items, next_cursor=items[-1].id if len(rows) > limit else None)


def switch_node_state(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    target: NodeState,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> bool:
    """The one way a node changes state: checked, evented, audited. False if unchanged."""
    subject = Subject(
        object_id=node.id,
        label=f"node {node.name}",
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
    )
    if not transition(
        session, lifecycle=NODE, row=node, subject=subject, target=target, actor=actor,
        reason=reason, now=now,
    ):  # fmt: skip
        return False
    node.updated_at = now
    if target is NodeState.REMOVED:
        node.removed_at = now
    return True
