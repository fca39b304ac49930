"""``Database.reader``: reads with no transaction around them on PostgreSQL (no BEGIN and
ROLLBACK round trips per API read), a plain session on SQLite; writes in it still land."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ProjectRow


async def _in_transaction(session: AsyncSession, db: Database) -> bool:
    """Whether the session's database connection is inside a transaction right now."""
    conn = await session.connection()
    raw = (await conn.get_raw_connection()).driver_connection
    assert raw is not None
    return bool(raw.in_transaction if db.is_sqlite else raw.is_in_transaction())


async def test_a_reader_reads_outside_a_transaction_on_postgresql(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with db.session() as session:
            await session.execute(text("SELECT 1"))
            assert await _in_transaction(session, db)  # BEGIN went first: a round trip
        async with db.reader() as session:
            assert (await session.scalar(select(func.count()).select_from(ProjectRow))) == 0
            assert await _in_transaction(session, db) is db.is_sqlite
    finally:
        await db.dispose()


async def test_a_write_in_a_reader_is_kept(database_url: str) -> None:
    """What resolving a caller writes (a token's last use) lands once it commits."""
    db = Database(database_url)
    now = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    try:
        async with db.reader() as session:
            session.add(ProjectRow(id="p" * 26, name="ml", description="", created_at=now))
            await session.commit()
        async with db.reader() as session:
            names = (await session.scalars(select(ProjectRow.name))).all()
        assert names == ["ml"]
    finally:
        await db.dispose()
