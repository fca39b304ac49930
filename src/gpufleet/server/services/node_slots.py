"""Names for a cluster's new nodes."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.services.clusters import node_name


async def free_slots(session: AsyncSession, cluster: ClusterRow, count: int) -> list[int]:
    """``count`` slots whose names no node of the cluster ever had (a removed node keeps
    its row, and its name with it), lowest first."""
    used = set(await session.scalars(select(NodeRow.name).where(NodeRow.cluster_id == cluster.id)))
    slots: list[int] = []
    slot = 0
    while len(slots) < count:
        if node_name(cluster, slot) not in used:
            slots.append(slot)
        slot += 1
    return slots
