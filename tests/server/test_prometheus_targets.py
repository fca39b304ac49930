"""Prometheus HTTP service discovery: every node whose agent runs, labelled with its
project, cluster and node names; read with the scrape token or by the owner only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from apihelpers import create_project, member_client, ready_cluster
from sqlalchemy import update

from gpufleet.core.enums import NodeState
from gpufleet.server.db.tables import NodeRow
from gpufleet.testing.app import RunningApp, make_settings, running_app

SCRAPE_TOKEN = "scrape-" + "s3cr3t" * 8
TARGETS = "/api/v1/prometheus/targets"


@pytest.fixture
async def sd_app(database_url: str, tmp_path: Path) -> AsyncIterator[RunningApp]:
    token_file = tmp_path / "metrics-token"
    token_file.write_text(SCRAPE_TOKEN + "\n")
    settings = make_settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        metrics_token_file=token_file,
        agent_metrics_port=9555,
    )
    async with running_app(settings) as running:
        yield running


async def test_targets_carry_project_cluster_and_node_labels(sd_app: RunningApp) -> None:
    app = sd_app
    for project in ("ml", "vision"):
        await create_project(app.client, project)
        await ready_cluster(app, project=project, name=f"{project}-c", size=2)
    async with app.ctx.db.transaction() as session:
        await session.execute(update(NodeRow).values(hostname=NodeRow.name + ".example"))
        # A node whose agent is gone is not a target.
        await session.execute(
            update(NodeRow)
            .where(NodeRow.name == "vision-c-001")
            .values(state=NodeState.REMOVED.value)
        )
    async with app.with_token(SCRAPE_TOKEN) as scraper:
        response = await scraper.get(TARGETS)
    assert response.status_code == 200, response.text
    assert response.json() == [
        {
            "targets": ["ml-c-000.example:9555"],
            "labels": {"project": "ml", "cluster": "ml-c", "node": "ml-c-000"},
        },
        {
            "targets": ["ml-c-001.example:9555"],
            "labels": {"project": "ml", "cluster": "ml-c", "node": "ml-c-001"},
        },
        {
            "targets": ["vision-c-000.example:9555"],
            "labels": {"project": "vision", "cluster": "vision-c", "node": "vision-c-000"},
        },
    ]
    assert (await app.client.get(TARGETS)).status_code == 200  # the owner


async def test_only_the_scrape_token_and_the_owner_read_targets(sd_app: RunningApp) -> None:
    app = sd_app
    await create_project(app.client)
    async with app.anonymous() as anonymous:
        assert (await anonymous.get(TARGETS)).status_code == 401
    async with app.with_token(SCRAPE_TOKEN + "x") as wrong:
        assert (await wrong.get(TARGETS)).status_code == 401
    async with await member_client(app) as member:
        refused = await member.get(TARGETS)
    assert refused.status_code == 403
    assert "metrics.read" in refused.json()["error"]["message"]
