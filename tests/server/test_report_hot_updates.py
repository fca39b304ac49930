"""Every agent report rewrites its node row and its GPUs' rows. Those updates must stay
heap-only on PostgreSQL (no index entry written, the old row version pruned in its page
without a vacuum): no index covers a column a report writes, and the two tables leave
room in their pages. A report path that wrote an indexed column would make each of the
2,000 reports a second of a 20,000-node fleet write every index of both tables."""

from __future__ import annotations

from apihelpers import create_project, node_tokens, ready_cluster, report_batch, send_report
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import ReportAck, ReportBatch
from gpufleet.server.db.tables import HOT_FILLFACTOR
from gpufleet.server.services.agent_reports import (
    WRITTEN_BY_EVERY_REPORT,
    PendingBatch,
    apply_report_batches,
)
from gpufleet.server.services.node_callers import node_token_hash
from gpufleet.testing.app import RunningApp


def _indexed(conn: Connection) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    schema = inspect(conn)
    for table in WRITTEN_BY_EVERY_REPORT:
        columns: set[str] = set(schema.get_pk_constraint(table)["constrained_columns"])
        for index in schema.get_indexes(table):
            columns.update(c for c in index["column_names"] if c is not None)
        for unique in schema.get_unique_constraints(table):
            columns.update(unique["column_names"])
        found[table] = columns
    return found


async def test_no_index_covers_a_column_every_report_writes(app: RunningApp) -> None:
    async with app.ctx.db.engine.connect() as conn:
        indexed = await conn.run_sync(_indexed)
    for table, written in WRITTEN_BY_EVERY_REPORT.items():
        assert indexed[table], f"no index found on {table}: the inspection is wrong"
        assert not indexed[table] & set(written), (table, indexed[table] & set(written))


async def test_reports_update_their_rows_in_place_on_postgres(app: RunningApp) -> None:
    if app.ctx.db.is_sqlite:
        # SQLite rewrites a row in its b-tree page; the index half of this is shown above.
        return
    async with app.ctx.db.session() as session:
        options = dict(
            (await session.execute(text(
                "SELECT relname, reloptions FROM pg_class WHERE relname IN ('node', 'gpu')"
            ))).all()
        )  # fmt: skip
    assert options == {t: [f"fillfactor={HOT_FILLFACTOR}"] for t in ("node", "gpu")}

    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=4, gpus=8)
    tokens = await node_tokens(app, cluster["id"])
    for token in tokens.values():  # their GPUs are known from now on
        assert (await send_report(app, token, report_batch(1))).status_code == 200
    # Compacted as the fill factor says (VACUUM FULL rewrites the tables), so what follows
    # does not depend on when PostgreSQL prunes a page's dead row versions (opportunistic).
    async with app.ctx.db.engine.connect() as conn:
        auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await auto.execute(text("VACUUM FULL node, gpu"))
    token = next(iter(tokens.values()))
    batch = ReportBatch.model_validate(report_batch(2))
    async with app.ctx.db.transaction() as session:
        before = await _updates(session)
        acks = await apply_report_batches(
            session,
            items=[PendingBatch(token_hash=node_token_hash(token), batch=batch)],
            now=app.ctx.clock.now(),
            staleness_s=app.ctx.settings.staleness_s,
            report_interval_s=app.ctx.settings.report_interval_s,
        )
        after = await _updates(session)
    assert isinstance(acks[0], ReportAck) and acks[0].accepted == 1, acks
    updated = {t: (n - before[t][0], hot - before[t][1]) for t, (n, hot) in after.items()}
    # The node's row and its eight GPUs' rows, each rewritten in its own page. Before
    # migration 0021: (1, 0) and (8, 0) (an indexed column written; full pages).
    assert updated == {"node": (1, 1), "gpu": (8, 8)}, updated


async def _updates(session: AsyncSession) -> dict[str, tuple[int, int]]:
    """Rows this backend updated in each table, and how many of those were heap-only
    (PostgreSQL's counts not yet flushed to its statistics: this transaction's and
    possibly earlier ones', hence the difference around the report)."""
    out: dict[str, tuple[int, int]] = {}
    for table in ("node", "gpu"):
        n, hot = (await session.execute(text(
            "SELECT pg_stat_get_xact_tuples_updated(CAST(:t AS regclass)), "
            "pg_stat_get_xact_tuples_hot_updated(CAST(:t AS regclass))"
        ), {"t": table})).one()  # fmt: skip
        out[table] = (int(n), int(hot))
    return out
