"""The database: engine, sessions, dialect set-up and start-up migrations."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.util import await_

from gpufleet.server.db.migrate import upgrade_to_head
from gpufleet.server.db.sqlite_driver import BUSY_TIMEOUT_S, sqlite_connector

# Any constant works; it must only be the same across replicas of one deployment.
_MIGRATION_LOCK_KEY = 0x67707566  # "gpuf"
# The execution option that keeps an SQLite connection out of a transaction (reader()).
_NO_BEGIN = "gpufleet_no_begin"


class Database:
    """One engine per process. ``session()`` is the unit of work."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        kwargs: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            if self.url.database and self.url.database != ":memory:":
                Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["async_creator"] = sqlite_connector(self.url, {"timeout": BUSY_TIMEOUT_S})
        else:
            # No pre-ping: it costs a round trip per checkout on the hot ingest path; stale
            # connections are recycled instead and a failed group is retried by the writer.
            kwargs.update(pool_size=10, max_overflow=10, pool_recycle=300)
        self.engine = create_async_engine(url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine.sync_engine)
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        # How reader() runs statements outside a transaction. SQLite's own AUTOCOMMIT level
        # is not used: SQLAlchemy puts the connection back to its default level when it
        # returns to the pool, and that level lets the driver begin transactions itself.
        self._no_transaction: dict[str, Any] = (
            {_NO_BEGIN: True} if self.is_sqlite else {"isolation_level": "AUTOCOMMIT"}
        )

    def session(self) -> AsyncSession:
        return self._sessions()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction: committed on success, rolled back on any error."""
        async with self._sessions() as session, session.begin():
            yield session

    @asynccontextmanager
    async def reader(self) -> AsyncIterator[AsyncSession]:
        """A session for reads, with no transaction around them: each statement sees what
        was committed when it ran, and a write in it commits at once, alone (writes that
        belong together use ``transaction()``).

        PostgreSQL: the connection is in autocommit, so there is no BEGIN before the first
        statement and no ROLLBACK after the last (two of a list request's round trips).
        SQLite: no BEGIN either (the driver runs each statement as its own transaction):
        every transaction here takes the write lock up front (``BEGIN IMMEDIATE``), and a
        reader that took it too queued behind every write and every other reader, in all
        the server's processes (API reads on SQLite had a p99 of 0.7-0.8 s and did not
        grow with a second process); in WAL mode a statement alone reads without waiting.
        """
        async with self.engine.connect() as conn:
            await conn.execution_options(**self._no_transaction)
            # No autoflush: an object changed for display is not written by the next query
            # (a statement here commits at once); ``commit()`` still writes what was added.
            async with AsyncSession(bind=conn, expire_on_commit=False, autoflush=False) as session:
                yield session

    async def migrate(self) -> None:
        """Bring the schema to head. Safe when several replicas start at once."""
        if self.is_sqlite:
            await asyncio.to_thread(self._lock_sqlite_file, lock=True)
            try:
                async with self.engine.connect() as conn:
                    await conn.run_sync(upgrade_to_head)
                    await conn.commit()
            finally:
                await asyncio.to_thread(self._lock_sqlite_file, lock=False)
        else:
            async with self.engine.connect() as conn:
                # A session-level advisory lock: the second replica waits here, then finds
                # the schema at head and does nothing.
                await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                try:
                    await conn.run_sync(upgrade_to_head)
                    await conn.commit()
                finally:
                    await conn.execute(
                        text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY}
                    )
                    await conn.commit()

    _lock_fd: int | None = None

    def _lock_sqlite_file(self, *, lock: bool) -> None:
        database = self.url.database
        if not database or database == ":memory:":
            return
        if lock:
            fd = os.open(f"{database}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_fd = fd
        elif self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    async def check(self) -> None:
        """Raise if the database cannot answer a trivial query (readiness)."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()


def _configure_sqlite(sync_engine: Any) -> None:
    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy, not the driver, decide when a transaction begins (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(_NO_BEGIN):
            return  # Database.reader: each statement is a transaction of its own
        # BEGIN IMMEDIATE takes the write lock up front, so two writers queue for it
        # instead of one failing with "database is locked" on upgrade; the wait is the
        # driver's (short steps, not SQLite's busy handler: begin_immediate).
        try:
            await_(conn.connection.driver_connection.begin_immediate())
        except sqlite3.Error as exc:  # raised as a statement's error would be
            raise DBAPIError.instance("BEGIN IMMEDIATE", None, exc, sqlite3.Error) from exc


async def run_in_connection(conn: AsyncConnection, sql: str) -> None:
    await conn.execute(text(sql))
