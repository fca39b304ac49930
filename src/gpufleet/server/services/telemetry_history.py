"""GPU telemetry over time: what the console's utilization charts draw.

The GPU table holds only each GPU's latest sample. Here the ingest path also keeps, for
each node, its first report of every minute (``node_telemetry``: one row per node per
minute, every GPU's utilization, memory, power and temperature) and adds it into its
cluster's row for that minute (``cluster_telemetry``: sums, so a cluster chart reads one
row per minute however large the cluster). Both are written in the report batch's own
transaction; a loop deletes rows past their retention (``TelemetryPruneLoop``).

One sample a minute is a downsample of the 10 s reports, like a Prometheus scrape at a
60 s interval: enough to see a job start, a GPU idle or a node heat up, at ~34 row
writes a second for a 2,048-node fleet instead of ~200.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, case, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import GpuSample
from gpufleet.core.enums import NodeState
from gpufleet.server.db.tables import (
    ClusterTelemetryRow,
    GpuRow,
    NodeRow,
    NodeTelemetryRow,
)

HISTORY_WINDOWS: dict[str, dt.timedelta] = {
    "1h": dt.timedelta(hours=1),
    "6h": dt.timedelta(hours=6),
    "24h": dt.timedelta(hours=24),
    "7d": dt.timedelta(days=7),
}
# Index of each value in a node row's per-GPU entry.
UTIL, MEM_USED, POWER, TEMP = range(4)


def minute_of(ts: dt.datetime) -> dt.datetime:
    return ts.replace(second=0, microsecond=0)


def first_report_of_minute(*, last_report_at: dt.datetime | None, now: dt.datetime) -> bool:
    """True when a report stored at ``now`` is its node's first in this minute."""
    return last_report_at is None or minute_of(last_report_at) != minute_of(now)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One node's minute, ready to store."""

    node_id: str
    cluster_id: str
    gpus: list[list[int | None] | None]  # by slot: [util, mem used, power, temp] or None
    mem_total_mib: int

    @classmethod
    def from_report(
        cls, *, node_id: str, cluster_id: str, expected_gpus: int, gpus: Sequence[GpuSample]
    ) -> NodeSample:
        by_index = {g.index: g for g in gpus}
        slots = max([expected_gpus, *(i + 1 for i in by_index)])
        entries: list[list[int | None] | None] = []
        for i in range(slots):
            g = by_index.get(i)
            entries.append(
                None
                if g is None
                else [
                    _int(g.utilization_pct),
                    _int(g.memory_used_mib),
                    _int(g.power_w),
                    _int(g.temperature_c),
                ]
            )
        total = sum(round(g.memory_total_mib or 0) for g in gpus)
        return cls(node_id=node_id, cluster_id=cluster_id, gpus=entries, mem_total_mib=total)


async def write_history(
    session: AsyncSession, *, samples: Sequence[NodeSample], now: dt.datetime
) -> None:
    """Store the node minutes and add them into their clusters' minutes (one statement
    each). A node minute already stored (a second replica, a retried group) is kept, and
    then not added to its cluster again."""
    if not samples:
        return
    minute = minute_of(now)
    insert = sqlite_insert if session.get_bind().dialect.name == "sqlite" else pg_insert
    node_table = cast(Table, NodeTelemetryRow.__table__)
    stored = await session.execute(
        insert(node_table)
        .on_conflict_do_nothing(index_elements=["node_id", "minute"])
        .returning(node_table.c.node_id),
        [
            {"node_id": s.node_id, "minute": minute, "mem_total_mib": s.mem_total_mib,
             "gpus": s.gpus}
            for s in samples
        ],
    )  # fmt: skip
    fresh = {row[0] for row in stored}
    sums: dict[str, dict[str, Any]] = {}
    for s in samples:
        if s.node_id not in fresh:
            continue
        row = sums.setdefault(
            s.cluster_id,
            {"cluster_id": s.cluster_id, "minute": minute, "nodes": 0, "gpus": 0,
             "util_sum": 0.0, "mem_used_mib": 0.0, "mem_total_mib": 0.0, "power_w": 0.0,
             "temp_sum": 0.0, "temp_max": 0.0},
        )  # fmt: skip
        row["nodes"] += 1
        row["mem_total_mib"] += s.mem_total_mib
        for entry in s.gpus:
            if entry is None or entry[UTIL] is None:
                continue
            row["gpus"] += 1
            row["util_sum"] += entry[UTIL]
            row["mem_used_mib"] += entry[MEM_USED] or 0
            row["power_w"] += entry[POWER] or 0
            temp = entry[TEMP] or 0
            row["temp_sum"] += temp
            row["temp_max"] = max(row["temp_max"], temp)
    if not sums:
        return
    table = cast(Table, ClusterTelemetryRow.__table__)
    stmt = insert(table)
    added = {
        c: table.c[c] + stmt.excluded[c]
        for c in ("nodes", "gpus", "util_sum", "mem_used_mib", "mem_total_mib", "power_w",
                  "temp_sum")
    }  # fmt: skip
    stmt = stmt.on_conflict_do_update(
        index_elements=["cluster_id", "minute"],
        set_={
            **added,
            "temp_max": case(
                (stmt.excluded.temp_max > table.c.temp_max, stmt.excluded.temp_max),
                else_=table.c.temp_max,
            ),
        },
    )
    # Cluster rows in one order in every transaction, so two writers never deadlock.
    await session.execute(stmt, [sums[c] for c in sorted(sums)])


@dataclass(frozen=True, slots=True)
class NodeMinute:
    minute: dt.datetime
    mem_total_mib: int
    gpus: list[list[int | None] | None]


@dataclass(frozen=True, slots=True)
class ClusterMinute:
    minute: dt.datetime
    nodes: int
    gpus: int
    util_avg: float | None
    mem_used_pct: float | None
    power_kw: float
    temp_avg: float | None
    temp_max: float | None


async def load_node_history(
    session: AsyncSession, *, node_id: str, since: dt.datetime, until: dt.datetime
) -> list[NodeMinute]:
    rows = await session.execute(
        select(NodeTelemetryRow.minute, NodeTelemetryRow.mem_total_mib, NodeTelemetryRow.gpus)
        .where(
            NodeTelemetryRow.node_id == node_id,
            NodeTelemetryRow.minute >= minute_of(since),
            NodeTelemetryRow.minute <= until,
        )
        .order_by(NodeTelemetryRow.minute)
    )
    return [NodeMinute(minute=m, mem_total_mib=t, gpus=list(g)) for m, t, g in rows]


async def load_cluster_history(
    session: AsyncSession, *, cluster_id: str, since: dt.datetime, until: dt.datetime
) -> list[ClusterMinute]:
    rows = (
        await session.scalars(
            select(ClusterTelemetryRow)
            .where(
                ClusterTelemetryRow.cluster_id == cluster_id,
                ClusterTelemetryRow.minute >= minute_of(since),
                ClusterTelemetryRow.minute <= until,
            )
            .order_by(ClusterTelemetryRow.minute)
        )
    ).all()
    return [
        ClusterMinute(
            minute=r.minute,
            nodes=r.nodes,
            gpus=r.gpus,
            util_avg=r.util_sum / r.gpus if r.gpus else None,
            mem_used_pct=100.0 * r.mem_used_mib / r.mem_total_mib if r.mem_total_mib else None,
            power_kw=r.power_w / 1000.0,
            temp_avg=r.temp_sum / r.gpus if r.gpus else None,
            temp_max=r.temp_max if r.gpus else None,
        )
        for r in rows
    ]


async def prune_history(
    session: AsyncSession,
    *,
    now: dt.datetime,
    node_keep_s: float,
    cluster_keep_s: float,
) -> tuple[int, int]:
    """Delete minutes past their retention; returns (node rows, cluster rows) deleted."""
    nodes = await session.execute(
        delete(NodeTelemetryRow).where(
            NodeTelemetryRow.minute < now - dt.timedelta(seconds=node_keep_s)
        )
    )
    clusters = await session.execute(
        delete(ClusterTelemetryRow).where(
            ClusterTelemetryRow.minute < now - dt.timedelta(seconds=cluster_keep_s)
        )
    )
    return int(getattr(nodes, "rowcount", 0) or 0), int(getattr(clusters, "rowcount", 0) or 0)


@dataclass(frozen=True, slots=True)
class NodeNow:
    """A node's latest GPU samples, summed up."""

    node_id: str
    name: str
    gpus: int
    util_avg: float | None
    mem_used_mib: float
    mem_total_mib: float
    power_w: float
    temp_max: float | None


async def nodes_now(session: AsyncSession, *, cluster_id: str) -> list[NodeNow]:
    """Every live node of the cluster with its GPUs' latest samples (one grouped query)."""
    rows = await session.execute(
        select(
            NodeRow.id,
            NodeRow.name,
            func.count(GpuRow.id),
            func.avg(GpuRow.utilization_pct),
            func.coalesce(func.sum(GpuRow.memory_used_mib), 0.0),
            func.coalesce(func.sum(GpuRow.memory_total_mib), 0.0),
            func.coalesce(func.sum(GpuRow.power_w), 0.0),
            func.max(GpuRow.temperature_c),
        )
        .join(GpuRow, (GpuRow.node_id == NodeRow.id) & GpuRow.removed_at.is_(None))
        .where(NodeRow.cluster_id == cluster_id, NodeRow.state != NodeState.REMOVED.value)
        .group_by(NodeRow.id, NodeRow.name)
        .order_by(NodeRow.id)
    )
    return [
        NodeNow(
            node_id=node_id,
            name=name,
            gpus=int(n),
            util_avg=None if util is None else float(util),
            mem_used_mib=float(used),
            mem_total_mib=float(total),
            power_w=float(power),
            temp_max=None if temp is None else float(temp),
        )
        for node_id, name, n, util, used, total, power, temp in rows
    ]
