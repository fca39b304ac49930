"""SQLite's write lock: a transaction takes it at BEGIN (``BEGIN IMMEDIATE``) and, while
another connection (another server process) holds it, tries again in short steps
(``sqlite_driver._begin_immediate``) instead of SQLite's busy handler, whose sleeps grow to
100 ms and left some writers of two ingesting processes waiting over a second. The wait
keeps its deadline and its error; the connection's busy_timeout is put back after it."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError

from gpufleet.server.db import sqlite_driver
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ProjectRow
from gpufleet.testing.databases import SqliteTemplate


def _project(name: str) -> ProjectRow:
    now = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    return ProjectRow(id=name[0] * 26, name=name, description="", created_at=now)


async def _add(db: Database, name: str) -> int:
    """Add a project in a transaction; the connection's busy_timeout (ms) inside it."""
    async with db.transaction() as session:
        session.add(_project(name))
        busy = await session.scalar(text("PRAGMA busy_timeout"))
    return int(busy)


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def _db_file(url: str) -> Path:
    return Path(url.split(":///", 1)[1])


async def test_a_writer_waits_for_another_process_lock_then_goes_in(
    sqlite_template: SqliteTemplate, tmp_path: Path
) -> None:
    url = sqlite_template.clone(tmp_path / "db")
    first, second = Database(url), Database(url)  # two engines: two server processes
    try:
        async with first.transaction() as holder:
            holder.add(_project("ml"))
            await holder.flush()
            waiter = asyncio.create_task(_add(second, "cv"))
            # The waiter's BEGIN retries on its connection's thread; this loop runs on.
            await asyncio.sleep(0.3)  # real sleep: the waiter must try while the lock is held
            assert not waiter.done()
        async with asyncio.timeout(10):
            busy = await waiter
        assert busy == int(sqlite_driver.BUSY_TIMEOUT_S * 1000)  # put back after the wait
        async with first.reader() as session:
            assert sorted((await session.scalars(select(ProjectRow.name))).all()) == ["cv", "ml"]
    finally:
        await first.dispose()
        await second.dispose()


async def test_a_writer_gives_up_at_the_busy_timeout_with_the_usual_error(
    sqlite_template: SqliteTemplate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_driver, "BUSY_TIMEOUT_S", 0.3)
    url = sqlite_template.clone(tmp_path / "db")
    first, second = Database(url), Database(url)
    try:
        async with first.transaction() as holder:
            holder.add(_project("ml"))
            await holder.flush()
            with pytest.raises(OperationalError, match="database is locked"):
                async with asyncio.timeout(10):
                    await _add(second, "cv")
        await _add(second, "cv")  # the lock is free: the same engine goes in
        async with second.reader() as session:
            assert sorted((await session.scalars(select(ProjectRow.name))).all()) == ["cv", "ml"]
    finally:
        await first.dispose()
        await second.dispose()


def test_begin_immediate_retries_until_the_lock_is_released(
    sqlite_template: SqliteTemplate, tmp_path: Path
) -> None:
    path = _db_file(sqlite_template.clone(tmp_path / "db"))
    holder, waiter = _raw(path), _raw(path)
    try:
        holder.execute("BEGIN IMMEDIATE")
        released = threading.Event()

        def release() -> None:
            released.wait(0.2)  # real sleep: the waiter must find the lock taken and retry
            holder.execute("COMMIT")
            released.set()

        thread = threading.Thread(target=release)
        thread.start()
        sqlite_driver._begin_immediate(waiter)
        assert released.is_set()  # it went in only once the holder had committed
        assert waiter.in_transaction
        assert waiter.execute("PRAGMA busy_timeout").fetchone() == (
            int(sqlite_driver.BUSY_TIMEOUT_S * 1000),
        )
        waiter.execute("ROLLBACK")
        thread.join()
    finally:
        holder.close()
        waiter.close()


def test_begin_immediate_puts_the_busy_timeout_back_when_it_gives_up(
    sqlite_template: SqliteTemplate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_driver, "BUSY_TIMEOUT_S", 0.2)
    path = _db_file(sqlite_template.clone(tmp_path / "db"))
    holder, waiter = _raw(path), _raw(path)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            sqlite_driver._begin_immediate(waiter)
        assert caught.value.sqlite_errorcode == sqlite3.SQLITE_BUSY
        assert not waiter.in_transaction
        assert waiter.execute("PRAGMA busy_timeout").fetchone() == (200,)
    finally:
        holder.close()
        waiter.close()
