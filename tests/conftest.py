"""Shared fixtures. Every store test runs twice: on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.databases import PostgresTemplate, SqliteTemplate
from gpufleet.testing.prometheus import PrometheusServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``long`` first, then ``slow`` ones, then the rest (each group in
    collection order): on parallel workers (``./dev test`` runs 3, a module per worker)
    the run then does not end waiting for one long module that started last."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("long") is not None:
            return 0
        return 1 if item.get_closest_marker("slow") is not None else 2

    items.sort(key=rank)  # stable: the order within a group stays


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
) -> Iterator[str]:
    """A fresh, migrated, empty database of each dialect."""
    if request.param == "sqlite":
        yield sqlite_template.clone(tmp_path / "db")
        return
    template: PostgresTemplate = request.getfixturevalue("pg_template")
    url = template.clone()
    yield url
    template.release(url)  # dropped in the background while the next tests run


@pytest.fixture
async def app(database_url: str, tmp_path: Path) -> AsyncIterator[RunningApp]:
    settings = make_settings(data_dir=tmp_path / "data", database_url=database_url)
    async with running_app(settings) as running:
        yield running


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One real Prometheus per session, scraping nothing until a test configures it
    (``PrometheusServer.configure``: a reload, not a restart)."""
    server = PrometheusServer(workdir=tmp_path_factory.mktemp("prometheus"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    """A Prometheus of the test's own, with an empty store: for a test that asserts which
    alerts are pending or firing. On the session's shared one, an earlier test's series
    still answer range functions for minutes after their target is gone, and an
    aggregated alert carries no instance to tell whose it is."""
    server = PrometheusServer(workdir=tmp_path / "prometheus")
    server.start()
    try:
        yield server
    finally:
        server.stop()
