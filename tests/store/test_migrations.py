"""The one migration tree: concurrent start-up, and no drift from the table definitions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import Connection

from gpufleet.server.db.engine import Database
from gpufleet.server.db.migrate import alembic_config
from gpufleet.server.db.tables import Base
from gpufleet.testing.databases import PostgresTemplate, pg_admin_url


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"gpufleet_mig_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield PostgresTemplate().async_url(name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def test_replicas_starting_together_migrate_once(empty_database_url: str) -> None:
    replicas = [Database(empty_database_url) for _ in range(4)]
    try:
        await asyncio.gather(*(db.migrate() for db in replicas))
        async with replicas[0].engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        assert [v[0] for v in versions] == [head]
        # A later start finds the schema at head and changes nothing.
        await replicas[1].migrate()
    finally:
        for db in replicas:
            await db.dispose()


async def test_migrations_match_the_table_definitions(empty_database_url: str) -> None:
    db = Database(empty_database_url)
    try:
        await db.migrate()

        def diff(conn: Connection) -> list[object]:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))

        async with db.engine.connect() as conn:
            changes = await conn.run_sync(diff)
        assert changes == [], f"tables.py and the migrations differ: {changes}"
    finally:
        await db.dispose()
