"""Test databases: SQLite files and PostgreSQL databases, migrated, fresh per test.

PostgreSQL comes from ``GPUFLEET_TEST_PG_URL`` (default: the local server on 5432 with
trust auth, as CI has). If it cannot be reached the tests fail: they never skip.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from gpufleet.server.db.engine import Database

DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


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
        self._created.append(name)
        return self.async_url(name)

    def async_url(self, name: str) -> str:
        return "postgresql+asyncpg://" + _with_database(self.admin_url, name).split("://", 1)[1]

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in reversed(self._created):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        self._created.clear()


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
