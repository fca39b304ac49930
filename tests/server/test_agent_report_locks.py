"""Agent reports lock their nodes (PostgreSQL ``FOR UPDATE``): a retry that races a slow
replica's write of the same batch waits for it, then finds the batch stored (duplicates),
so the batch's events are staged once."""

from __future__ import annotations

import asyncio

import pytest
from apihelpers import (
    create_project,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    send_report,
)
from sqlalchemy import func, select, text

from gpufleet.core.agent_protocol import ReportAck, ReportBatch
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import GpufleetError
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import EventRow
from gpufleet.server.services.agent_reports import PendingBatch, apply_report_batches
from gpufleet.server.services.node_callers import node_token_hash
from gpufleet.testing.app import RunningApp


async def _apply(app: RunningApp, pending: PendingBatch) -> list[ReportAck | GpufleetError]:
    async with app.ctx.db.transaction() as session:
        return await apply_report_batches(
            session,
            items=[pending],
            now=app.ctx.clock.now(),
            staleness_s=app.ctx.settings.staleness_s,
            report_interval_s=app.ctx.settings.report_interval_s,
        )


async def _until_a_session_waits_on_a_lock(db: Database) -> None:
    for _ in range(2000):
        async with db.session() as session:
            waiting = await session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
        if waiting:
            return
        # real sleep: another connection's lock wait is what we wait for
        await asyncio.sleep(0.01)
    raise AssertionError("the second write never waited on the node's lock")


async def test_a_retry_racing_a_slow_write_stages_its_events_once(app: RunningApp) -> None:
    if app.ctx.db.is_sqlite:
        pytest.skip("SQLite has one writer: the transaction itself is the lock")
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=1, gpus=8)
    node = (await nodes_of(app, cluster["id"]))[0]
    token = (await node_tokens(app, cluster["id"]))[node["name"]]
    stored = await send_report(app, token, report_batch(1))  # its GPUs are known now
    assert stored.status_code == 200, stored.text
    # One GPU of eight: the node's health changes (an event) with this batch.
    batch = ReportBatch.model_validate(report_batch(2, gpus=1))
    pending = PendingBatch(token_hash=node_token_hash(token), batch=batch)

    async with app.ctx.db.transaction() as slow:  # the slow replica, not committed yet
        first = await apply_report_batches(
            slow,
            items=[pending],
            now=app.ctx.clock.now(),
            staleness_s=app.ctx.settings.staleness_s,
            report_interval_s=app.ctx.settings.report_interval_s,
        )
        retry = asyncio.create_task(_apply(app, pending))
        await _until_a_session_waits_on_a_lock(app.ctx.db)
        assert not retry.done()
    again = await retry

    assert isinstance(first[0], ReportAck) and first[0].accepted == 1
    assert isinstance(again[0], ReportAck)
    assert (again[0].accepted, again[0].duplicates, again[0].last_seq) == (0, 1, 2)
    async with app.ctx.db.session() as session:
        health_events = await session.scalar(
            select(func.count())
            .select_from(EventRow)
            .where(
                EventRow.node_id == node["id"],
                EventRow.kind == EventKind.NODE_HEALTH.value,
                EventRow.message.contains("unhealthy"),
            )
        )
    assert health_events == 1
