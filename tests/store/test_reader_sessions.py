"""``Database.reader``: reads with no transaction around them (on PostgreSQL no BEGIN and
ROLLBACK round trips per API read; on SQLite no write lock taken up front, so reads do not
queue behind writes); writes in it still land."""

from __future__ import annotations

import asyncio
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


def _project(name: str) -> ProjectRow:
    now = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    return ProjectRow(id=name[0] * 26, name=name, description="", created_at=now)


async def test_a_reader_reads_outside_a_transaction(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with db.session() as session:
            await session.execute(text("SELECT 1"))
            assert await _in_transaction(session, db)  # BEGIN went first: a round trip
        async with db.reader() as session:
            assert (await session.scalar(select(func.count()).select_from(ProjectRow))) == 0
            assert not await _in_transaction(session, db)
    finally:
        await db.dispose()


async def test_a_write_in_a_reader_is_kept(database_url: str) -> None:
    """What resolving a caller writes (a token's last use) lands once it commits."""
    db = Database(database_url)
    try:
        async with db.reader() as session:
            session.add(_project("ml"))
            await session.commit()
        async with db.reader() as session:
            names = (await session.scalars(select(ProjectRow.name))).all()
        assert names == ["ml"]
    finally:
        await db.dispose()


async def test_a_reader_does_not_wait_for_an_open_write(database_url: str) -> None:
    """A write transaction holds SQLite's write lock from its start (BEGIN IMMEDIATE); a
    reader that took it too waited for every write (busy_timeout: 30 s)."""
    db = Database(database_url)
    try:
        async with db.transaction() as writer:
            writer.add(_project("ml"))
            await writer.flush()  # the write lock (SQLite), the new row's (PostgreSQL)
            async with asyncio.timeout(10), db.reader() as session:
                seen = (await session.scalars(select(ProjectRow.name))).all()
            assert seen == []  # what is committed, and nothing of the open write
        async with db.reader() as session:
            assert (await session.scalars(select(ProjectRow.name))).all() == ["ml"]
    finally:
        await db.dispose()


async def test_a_write_in_a_reader_waits_for_an_open_write_then_lands(database_url: str) -> None:
    """A reader's write (a token's last use) is a transaction of its own: behind an open
    write it waits for the lock, with no "database is locked" from a stale read."""
    db = Database(database_url)
    try:
        async with db.reader() as session:  # a read first: a snapshot, were it a transaction
            assert (await session.scalars(select(ProjectRow.name))).all() == []

            async def write_in_reader() -> None:
                session.add(_project("cv"))
                await session.commit()

            async with db.transaction() as writer:
                writer.add(_project("ml"))
                await writer.flush()
                pending = asyncio.create_task(write_in_reader())
                # real sleep: the reader's INSERT must be waiting on the lock when this commits
                await asyncio.sleep(0.3)
                if db.is_sqlite:  # the file's one write lock (PostgreSQL locks rows: no wait)
                    assert not pending.done()
            await asyncio.wait_for(pending, 10)
        async with db.reader() as session:
            names = sorted((await session.scalars(select(ProjectRow.name))).all())
        assert names == ["cv", "ml"]
    finally:
        await db.dispose()


async def test_a_reader_writes_only_what_it_commits(database_url: str) -> None:
    """A statement in a reader commits at once: an object changed in memory (as a page
    might change one for display) must not be written by the next query's autoflush."""
    db = Database(database_url)
    try:
        async with db.transaction() as writer:
            writer.add(_project("ml"))
        async with db.reader() as session:
            row = await session.scalar(select(ProjectRow))
            assert row is not None
            row.description = "changed for display, never committed"
            assert await session.scalar(select(func.count()).select_from(ProjectRow)) == 1
        async with db.reader() as session:
            assert (await session.scalars(select(ProjectRow.description))).all() == [""]
    finally:
        await db.dispose()
