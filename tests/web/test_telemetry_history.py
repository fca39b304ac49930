"""GPU telemetry history: one row per node per minute from the ingest path, summed per
cluster in the same transaction, drawn by the Utilization tab and node pages, pruned
past its retention."""

from __future__ import annotations

import datetime as dt

import httpx
from sqlalchemy import func, select

from gpufleet.server.db.tables import ClusterTelemetryRow, NodeTelemetryRow
from gpufleet.server.services.telemetry_history import load_cluster_history
from gpufleet.server.workers.base import LoopDeps
from gpufleet.server.workers.telemetry import TelemetryPruneLoop
from gpufleet.testing.fleet import SimFleet


async def _counts(fleet: SimFleet) -> tuple[int, int]:
    async with fleet.app.ctx.db.session() as session:
        nodes = await session.scalar(select(func.count()).select_from(NodeTelemetryRow))
        clusters = await session.scalar(select(func.count()).select_from(ClusterTelemetryRow))
    return int(nodes or 0), int(clusters or 0)


async def test_one_sample_per_node_per_minute_summed_per_cluster(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    start = await _counts(fleet)
    minute = fleet.clock.now().replace(second=0, microsecond=0)
    # Many reports within one minute add no rows; the next minute adds one per node.
    fleet.clock.advance((minute + dt.timedelta(minutes=1) - fleet.clock.now()).total_seconds())
    for _ in range(5):
        await fleet.tick(5)
    within = await _counts(fleet)
    assert within[0] == start[0] + 3 and within[1] == start[1] + 1
    await fleet.tick(60)
    assert (await _counts(fleet))[0] == within[0] + 3
    async with fleet.app.ctx.db.session() as session:
        history = await load_cluster_history(
            session,
            cluster_id=fleet.cluster_id,
            since=fleet.clock.now() - dt.timedelta(hours=1),
            until=fleet.clock.now(),
        )
        rows = list(await session.scalars(select(NodeTelemetryRow)))
    latest = history[-1]
    assert latest.nodes == 3 and latest.gpus == 24
    assert latest.util_avg is not None and 0 <= latest.util_avg <= 100
    assert latest.temp_max is not None and latest.temp_avg is not None
    assert latest.temp_max >= latest.temp_avg
    assert all(len(r.gpus) == 8 and all(len(g) == 4 for g in r.gpus) for r in rows)
    # The tabs draw them.
    page = await admin.get(f"/clusters/{fleet.cluster_id}/utilization")
    assert page.status_code == 200 and page.text.count('<svg class="chart"') == 4
    node = await admin.get(f"/clusters/{fleet.cluster_id}/nodes/{fleet.nodes['train-001']['id']}")
    assert node.text.count("<polyline") >= 8  # one line per GPU at least


async def test_the_prune_loop_deletes_past_retention(fleet: SimFleet) -> None:
    await fleet.tick(60)
    assert (await _counts(fleet))[0] > 0
    # No tick from here on: no report lands between a prune and the count that follows.
    loop = TelemetryPruneLoop(
        LoopDeps(db=fleet.app.ctx.db, clock=fleet.clock, owner="test", lease_ttl_s=5.0),
        interval_s=60,
        node_keep_s=3600,
        cluster_keep_s=86400,
    )
    await loop.run_once()
    kept = await _counts(fleet)
    assert loop.deleted == (0, 0) and kept[0] > 0
    fleet.clock.advance(2 * 3600)
    await loop.run_once()
    assert loop.deleted[0] == kept[0] and loop.deleted[1] == 0
    assert (await _counts(fleet)) == (0, kept[1])
    fleet.clock.advance(86400)
    await loop.run_once()
    assert (await _counts(fleet)) == (0, 0)
