"""The fleet health summary, and the recomputation of cluster health."""

from __future__ import annotations

import datetime as dt
import itertools

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus, EventKind, Health, NodeState
from gpufleet.core.health import cluster_health, silenced
from gpufleet.core.models import HealthSummary
from gpufleet.server.db.tables import ClusterRow, FindingRow, GpuRow, NodeRow
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.events import record_event
from gpufleet.server.services.nodes import effective_health, gpu_health


async def health_summary(
    session: AsyncSession,
    *,
    caller: Caller,
    staleness_s: float,
    now: dt.datetime,
    cluster_id: str | None = None,
) -> HealthSummary:
    cq = select(ClusterRow.id).where(ClusterRow.status != ClusterStatus.DELETED.value)
    visible = caller.visible_project_ids()
    if visible is not None:
        cq = cq.where(ClusterRow.project_id.in_(visible))
    if cluster_id is not None:
        cq = cq.where(ClusterRow.id == cluster_id)
    cluster_ids = list((await session.scalars(cq)).all())
    nodes_by_health = {h.value: 0 for h in Health}
    gpus_by_health = {h.value: 0 for h in Health}
    severity_counts: dict[str, int] = {}
    stale = 0
    node_total = gpu_total = 0
    if cluster_ids:
        node_health_by_id: dict[str, Health] = {}
        for row in await session.scalars(
            select(NodeRow).where(
                NodeRow.cluster_id.in_(cluster_ids), NodeRow.state != NodeState.REMOVED.value
            )
        ):
            h = effective_health(row, now=now, staleness_s=staleness_s)
            node_health_by_id[row.id] = h
            nodes_by_health[h.value] += 1
            node_total += 1
            if h is Health.UNKNOWN:
                stale += 1
        for gpu in await session.scalars(
            select(GpuRow).where(
                GpuRow.node_id.in_(list(node_health_by_id)), GpuRow.removed_at.is_(None)
            )
        ):
            gh = gpu_health(gpu, node_health=node_health_by_id[gpu.node_id])
            gpus_by_health[gh.value] += 1
            gpu_total += 1
        for severity, n in await session.execute(
            select(FindingRow.severity, func.count(FindingRow.id))
            .where(FindingRow.cluster_id.in_(cluster_ids), FindingRow.cleared_at.is_(None))
            .group_by(FindingRow.severity)
        ):
            severity_counts[severity] = int(n)
    return HealthSummary(
        clusters=len(cluster_ids),
        nodes=node_total,
        gpus=gpu_total,
        nodes_by_health=nodes_by_health,
        gpus_by_health=gpus_by_health,
        open_findings_by_severity=severity_counts,
        stale_nodes=stale,
    )


async def refresh_cluster_health(
    session: AsyncSession, *, cluster: ClusterRow, staleness_s: float, now: dt.datetime
) -> bool:
    """Recompute one cluster's health from its nodes; event on change. True if changed.

    The nodes are counted in the database by stored health and silence (the health loop
    runs this for every cluster every pass: loading 20,000 node rows each time cost a
    core half the time), then shown as one node is (``core.health.silenced``)."""
    silent = or_(
        NodeRow.last_report_at.is_(None),
        NodeRow.last_report_at < now - dt.timedelta(seconds=staleness_s),
    )
    counted = await session.execute(
        select(NodeRow.health, silent, func.count())
        .where(
            NodeRow.cluster_id == cluster.id,
            NodeRow.state.not_in([NodeState.REMOVED.value, NodeState.PROVISIONING.value]),
        )
        .group_by(NodeRow.health, silent)
    )
    healths = itertools.chain.from_iterable(
        itertools.repeat(silenced(Health(stored), silent=bool(is_silent)), int(n))
        for stored, is_silent, n in counted
    )
    new = cluster_health(healths)
    if new.value == cluster.health:
        return False
    old = cluster.health
    cluster.health = new.value
    record_event(
        session,
        kind=EventKind.CLUSTER_HEALTH,
        message=f"cluster {cluster.name} health: {old} → {new.value}",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        actor="system:health",
        data={"health_from": old, "health_to": new.value},
        ts=now,
    )
    return True
