"""Shared fixtures. Every store test runs twice: on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.databases import PostgresTemplate, SqliteTemplate


@pytest.fixture(scope="session")
def pg_template() -> Iterator[PostgresTemplate]:
    template = PostgresTemplate()
    template.create()
    yield template
    template.drop_all()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> SqliteTemplate:
    template = SqliteTemplate(tmp_path_factory.mktemp("sqlite-template"))
    template.create()
    return template


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: SqliteTemplate
) -> str:
    """A fresh, migrated, empty database of each dialect."""
    if request.param == "sqlite":
        return sqlite_template.clone(tmp_path / "db")
    template: PostgresTemplate = request.getfixturevalue("pg_template")
    return template.clone()


@pytest.fixture
async def app(database_url: str, tmp_path: Path) -> AsyncIterator[RunningApp]:
    settings = make_settings(data_dir=tmp_path / "data", database_url=database_url)
    async with running_app(settings) as running:
        yield running
