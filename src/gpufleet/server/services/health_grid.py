"""The health grid: every live node of a cluster and the health of each of its GPUs.

Built for a 2,048-node × 8-GPU cluster read every few seconds by the console: one query
per kind (nodes, GPUs, open findings, open repairs), columns only, no ORM objects and no
per-node query. GPU health is one letter per GPU slot, so a node's row is a short string.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import Health, NodeState
from gpufleet.core.health import is_stale
from gpufleet.core.models import Cluster
from gpufleet.core.repair.models import OPEN_STATUSES
from gpufleet.server.db.tables import ClusterRow, FindingRow, GpuRow, NodeRow, RepairRow

# One letter per GPU slot. "m": the node expects a GPU in this slot and none reports.
CELL_OF_HEALTH = {
    Health.HEALTHY: "h",
    Health.DEGRADED: "d",
    Health.UNHEALTHY: "u",
    Health.UNKNOWN: "n",
}
MISSING = "m"
HEALTH_OF_CELL = {v: k for k, v in CELL_OF_HEALTH.items()} | {MISSING: Health.UNHEALTHY}


@dataclass(frozen=True, slots=True)
class GridNode:
    id: str
    name: str
    state: NodeState
    health: Health  # effective: a silent node reads unknown at once
    cells: str  # one letter per GPU slot, index order
    findings: int  # open findings on the node
    repair: str | None  # status of the node's open repair, if any

    def signature(self) -> str:
        return f"{self.state}|{self.health}|{self.cells}|{self.findings}|{self.repair}"


@dataclass(frozen=True, slots=True)
class HealthGrid:
    cluster_id: str
    gpus_per_node: int
    nodes: tuple[GridNode, ...]
    etag: str  # changes whenever anything shown changes
    order: str  # changes when nodes come or go (the grid's layout)

    def counts(self) -> dict[str, int]:
        """GPU cells by health (a missing GPU counts as unhealthy)."""
        cells = "".join(n.cells for n in self.nodes)
        out = {h.value: cells.count(c) for h, c in CELL_OF_HEALTH.items()}
        out[Health.UNHEALTHY.value] += cells.count(MISSING)
        return out

    def node_counts(self) -> dict[str, int]:
        out = {h.value: 0 for h in Health}
        for node in self.nodes:
            out[node.health] += 1
        return out


async def load_health_grid(
    session: AsyncSession, *, cluster: Cluster | ClusterRow, staleness_s: float, now: dt.datetime
) -> HealthGrid:
    """The grid of a cluster the caller may already see (``get_cluster_row_or_error``;
    the console passes the domain ``Cluster`` it built from that row).

    Most GPUs are healthy, so GPUs are not read one row each: the node query counts each
    node's GPUs and their highest index, and only the GPUs that are not healthy (and the
    slots of nodes with a gap) are read one by one.
    """
    node_rows = (
        await session.execute(
            select(
                NodeRow.id,
                NodeRow.name,
                NodeRow.state,
                NodeRow.health,
                NodeRow.last_report_at,
                NodeRow.expected_gpus,
                func.count(GpuRow.id),
                func.max(GpuRow.index),
            )
            .outerjoin(GpuRow, (GpuRow.node_id == NodeRow.id) & GpuRow.removed_at.is_(None))
            .where(NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value)
            .group_by(NodeRow.id)
            .order_by(NodeRow.id)  # slot order: ids are time-ordered
        )
    ).all()
    unwell = (
        await session.execute(
            select(GpuRow.node_id, GpuRow.index, GpuRow.health)
            .join(NodeRow, NodeRow.id == GpuRow.node_id)
            .where(
                NodeRow.cluster_id == cluster.id,
                GpuRow.removed_at.is_(None),
                GpuRow.health != Health.HEALTHY.value,
            )
        )
    ).all()
    # Nodes whose GPU indices have a gap (a GPU gone from the middle): read their slots.
    gappy = [row[0] for row in node_rows if row[6] and row[7] is not None and row[6] != row[7] + 1]
    present: dict[str, set[int]] = {}
    if gappy:
        for node_id, index in await session.execute(
            select(GpuRow.node_id, GpuRow.index).where(
                GpuRow.node_id.in_(gappy), GpuRow.removed_at.is_(None)
            )
        ):
            present.setdefault(node_id, set()).add(index)
    finding_rows = (
        await session.execute(
            select(FindingRow.node_id).where(
                FindingRow.cluster_id == cluster.id, FindingRow.cleared_at.is_(None)
            )
        )
    ).all()
    repair_rows = (
        await session.execute(
            select(RepairRow.node_id, RepairRow.status).where(
                RepairRow.cluster_id == cluster.id,
                RepairRow.status.in_([s.value for s in OPEN_STATUSES]),
                RepairRow.node_id.is_not(None),
            )
        )
    ).all()
    not_healthy: dict[str, dict[int, str]] = {}
    for node_id, index, health in unwell:
        not_healthy.setdefault(node_id, {})[index] = health
    findings: dict[str, int] = {}
    for (node_id,) in finding_rows:
        findings[node_id] = findings.get(node_id, 0) + 1
    repairs = {node_id: status for node_id, status in repair_rows}
    nodes: list[GridNode] = []
    for node_id, name, state, stored, last_report_at, expected, count, top in node_rows:
        health = Health(stored)
        if health is not Health.UNHEALTHY and is_stale(
            last_report_at=last_report_at, now=now, staleness_s=staleness_s
        ):
            health = Health.UNKNOWN
        if (
            count
            and top == count - 1
            and node_id not in not_healthy
            and health is not Health.UNKNOWN
        ):
            # GPUs 0..top all there and healthy (most nodes): no per-GPU work.
            cells = "h" * count + MISSING * (expected - count)
        else:
            indices = present.get(node_id) or (range(top + 1) if count else range(0))
            by_index = dict.fromkeys(indices, Health.HEALTHY.value)
            by_index.update(not_healthy.get(node_id, {}))
            cells = _cells(by_index, expected=expected, node_health=health)
        nodes.append(
            GridNode(
                id=node_id,
                name=name,
                state=NodeState(state),
                health=health,
                cells=cells,
                findings=findings.get(node_id, 0),
                repair=repairs.get(node_id),
            )
        )
    order = hashlib.blake2b("\n".join(n.id for n in nodes).encode(), digest_size=8).hexdigest()
    digest = hashlib.blake2b(order.encode(), digest_size=12)
    for node in nodes:
        digest.update(node.signature().encode())
    return HealthGrid(
        cluster_id=cluster.id,
        gpus_per_node=cluster.gpus_per_node,
        nodes=tuple(nodes),
        etag=digest.hexdigest(),
        order=order,
    )


_LETTER = {h.value: c for h, c in CELL_OF_HEALTH.items()}


def _cells(by_index: dict[int, str], *, expected: int, node_health: Health) -> str:
    """One letter per GPU slot from the GPUs' stored health by index."""
    if node_health is Health.UNKNOWN:
        # Nothing fresh from the node: its GPUs are unknown too, never shown healthy.
        return CELL_OF_HEALTH[Health.UNKNOWN] * max(expected, len(by_index))
    if not by_index:
        return CELL_OF_HEALTH[Health.UNKNOWN] * expected
    slots = max(expected, max(by_index) + 1)
    return "".join(_LETTER[by_index[i]] if i in by_index else MISSING for i in range(slots))
