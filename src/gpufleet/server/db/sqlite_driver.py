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
"""

from __future__ import annotations

import sqlite3
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
