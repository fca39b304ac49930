"""A SQLite connection closes even when SQLAlchemy's terminate is cancelled half-way.

The sequence is the one SQLAlchemy runs when a task holding an invalidated connection is
cancelled twice (what event-loop shutdown does to every task at once): a shielded graceful
``close()`` is under way, the outer task's cancel makes it force-close with ``stop()``, and
then the graceful close is cancelled too. With aiosqlite's own ``Connection`` the graceful
close then waits forever for an answer queued behind the worker's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from gpufleet.server.db.engine import Database
from gpufleet.server.db.sqlite_driver import StoppableConnection, sqlite_connector


async def test_a_graceful_close_cancelled_after_a_force_stop_returns(tmp_path: Path) -> None:
    url = make_url(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    conn = await sqlite_connector(url, {"timeout": 30})()
    await conn.execute("CREATE TABLE t (x INTEGER)")
    graceful = asyncio.create_task(conn.close())
    await asyncio.sleep(0)  # the graceful close is queued on the worker
    conn.stop()  # the force-close of a cancelled terminate
    graceful.cancel()  # then the loop's shutdown cancels the graceful close as well
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(graceful, timeout=10)
    conn._thread.join(timeout=10)
    assert not conn._thread.is_alive()


async def test_close_after_stop_returns_and_a_plain_close_still_closes(tmp_path: Path) -> None:
    url = make_url(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    stopped = await sqlite_connector(url, {})()
    await stopped.execute("SELECT 1")
    stopped.stop()
    await asyncio.wait_for(stopped.close(), timeout=10)
    stopped._thread.join(timeout=10)
    assert not stopped._thread.is_alive()

    plain = await sqlite_connector(url, {})()
    await plain.close()
    plain._thread.join(timeout=10)
    assert not plain._thread.is_alive()
    with pytest.raises(ValueError):
        await plain.execute("SELECT 1")


async def test_the_engine_opens_stoppable_connections_with_its_settings(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    try:
        async with db.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            assert isinstance(raw.driver_connection, StoppableConnection)
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 30000
    finally:
        await db.dispose()
