"""The SQLite connection the engine opens: aiosqlite's, with a close that cannot hang.

aiosqlite (0.22) runs each connection on a worker thread fed by a queue; ``stop()`` queues
"close and exit" and the worker leaves. Its ``close()`` queues a close, then in ``finally``
calls ``stop()`` again and waits for that answer. When a stop is already queued, that
second request sits behind the worker's exit and is never answered.

SQLAlchemy gets there whenever a task is cancelled while a connection is being terminated
(an invalidated connection, e.g. a request cancelled mid-query): it shields a graceful
``close()``, and if the outer task is cancelled again it force-closes with ``stop()``. At
event-loop shutdown both are cancelled in one round, so the graceful close waits forever
and shutdown with it. Here a close that finds the worker already told to stop returns: the
worker closes the SQLite handle itself on its way out.

Its ``begin_immediate()`` is how the engine begins a transaction: on the worker thread,
trying for the write lock again in steps of at most 2 ms rather than through SQLite's busy
handler (:func:`_begin_immediate` says why).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import dialect as aiosqlite_dialect
from sqlalchemy.engine import URL


class StoppableConnection(aiosqlite.Connection):
    """An aiosqlite connection whose ``close()`` never waits on a stopped worker."""

    async def close(self) -> None:
        if self._connection is None or not self._running:
            return  # closed, or a stop is queued: the worker closes the handle and exits
        try:
            await self._execute(self._conn.close)  # type: ignore[no-untyped-call]
        finally:
            self._connection = None
            # Someone else may have stopped the worker while the close was queued (the
            # force-close of a cancelled terminate): its answer is the last one coming.
            if self._running:
                stopped = self.stop()
                if stopped is not None:
                    await stopped

    async def begin_immediate(self) -> None:
        """``BEGIN IMMEDIATE``, waiting for the write lock in short steps
        (:func:`_begin_immediate`), on the connection's worker thread."""
        await self._execute(_begin_immediate, self._conn)  # type: ignore[no-untyped-call]


# How long a connection waits for the database's write lock (or any lock), as SQLite's
# busy_timeout; and the longest sleep between two tries for the write lock at BEGIN.
BUSY_TIMEOUT_S = 30.0
_BEGIN_POLL_MAX_S = 0.002


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE`` on ``conn``, retried after 0.2 ms, doubling to 2 ms, while
    another connection holds the write lock, up to :data:`BUSY_TIMEOUT_S`.

    SQLite's own busy handler sleeps 1, 2, 5, 10 ... then 100 ms between tries: a writer
    that has waited a while sleeps long while newcomers try every millisecond, so under
    steady contention (two server processes ingesting) the unlucky ones waited a second
    and more. Here every waiter tries again within 2 ms of the lock's release. Only the
    BEGIN waits this way; the connection's busy_timeout is put back for what follows.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.0002
    conn.execute("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # The primary code (an extended one, SQLITE_BUSY_RECOVERY, is busy too).
                busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, _BEGIN_POLL_MAX_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")


def sqlite_connector(
    url: URL, connect_args: dict[str, Any]
) -> Callable[[], Awaitable[StoppableConnection]]:
    """An ``async_creator`` for the engine: the arguments SQLAlchemy's aiosqlite dialect
    would pass for ``url`` (plus ``connect_args``), opened as a ``StoppableConnection``."""
    args, params = aiosqlite_dialect().create_connect_args(url)
    params = {**params, **connect_args}

    async def connect() -> StoppableConnection:
        conn = StoppableConnection(partial(sqlite3.connect, *args, **params), 64)
        # As SQLAlchemy does for the connections it opens itself: an abandoned connection's
        # worker must not keep the process alive at exit.
        conn._thread.daemon = True
        await conn  # starts the worker and opens the handle
        return conn

    return connect
