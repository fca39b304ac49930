"""Test databases: SQLite files and PostgreSQL databases, migrated, fresh per test.

PostgreSQL comes from ``GPUFLEET_TEST_PG_URL`` (default: the local server on 5432 with
trust auth, as CI has). If it cannot be reached the tests fail: they never skip.

A test's PostgreSQL database is dropped in the background once the test is done
(``release``), a few at a time: PostgreSQL 15 makes every ``DROP DATABASE`` wait for a
checkpoint (seconds on a busy machine), and drops that wait together share one. Dropped
one by one at the end of the session, a worker's few hundred took minutes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import psycopg
from psycopg import sql

from gpufleet.server.db.engine import Database

DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DROPPERS = 4  # drops in flight at once, per test process


def pg_admin_url() -> str:
    return os.environ.get("GPUFLEET_TEST_PG_URL", DEFAULT_PG_ADMIN_URL)


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


class PostgresTemplate:
    """One migrated template database per test session; each test gets a clone."""

    def __init__(self) -> None:
        self.admin_url = pg_admin_url()
        self.template = f"gpufleet_tpl_{uuid.uuid4().hex[:10]}"
        self._created: list[str] = []
        self._dropper = ThreadPoolExecutor(max_workers=DROPPERS, thread_name_prefix="pg-drop")
        self._drops: list[Future[None]] = []

    def create(self) -> None:
        try:
            conn = psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            raise RuntimeError(
                f"PostgreSQL is required for the store tests and is not reachable at "
                f"{self.admin_url} ({exc}). Start it (see .ci/run) or set GPUFLEET_TEST_PG_URL."
            ) from exc
        with conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        self._created.append(self.template)
        db = Database(self.async_url(self.template))

        async def migrate() -> None:
            await db.migrate()
            await db.dispose()

        asyncio.run(migrate())

    def clone(self) -> str:
        name = f"gpufleet_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
            # A commit returns before its WAL reaches the disk (only a crash of PostgreSQL
            # itself could lose one, which no test does): a test's commits then cost a
            # fraction of a millisecond instead of an fsync each (~1.2 ms here), and
            # CI's shared server is used as `./dev test`'s own one is (fsync off).
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                    sql.Identifier(name)
                )
            )
        self._created.append(name)
        return self.async_url(name)

    def async_url(self, name: str) -> str:
        return "postgresql+asyncpg://" + _with_database(self.admin_url, name).split("://", 1)[1]

    def release(self, url: str) -> None:
        """The test that had ``url`` (a ``clone()``) is done: drop its database soon,
        without waiting."""
        name = url.rpartition("/")[2]
        if name in self._created:
            self._created.remove(name)
            self._drops.append(self._dropper.submit(self._drop, name))

    def drop_all(self) -> None:
        """Wait for the drops under way, then drop what is left, the template last."""
        left = [n for n in self._created if n != self.template]
        self._created = [n for n in self._created if n == self.template]
        self._drops += [self._dropper.submit(self._drop, name) for name in left]
        wait(self._drops)
        self._dropper.shutdown()
        for name in self._created:
            self._drop(name)
        self._created.clear()
        for done in self._drops:
            done.result()  # a failed drop fails the session's teardown
        self._drops.clear()

    def _drop(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class SqliteTemplate:
    """A migrated SQLite file; each test copies it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "template.db"

    def create(self) -> None:
        db = Database(f"sqlite+aiosqlite:///{self.path}")

        async def migrate() -> None:
            await db.migrate()
            await db.dispose()

        asyncio.run(migrate())

    def clone(self, directory: Path) -> str:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / "gpufleet.db"
        shutil.copyfile(self.path, target)
        return f"sqlite+aiosqlite:///{target}"
