"""The cluster page links to the project's Grafana dashboards when a Grafana is
configured (``GPUFLEET_GRAFANA_URL``), on every tab, and shows no link without one."""

from __future__ import annotations

from pathlib import Path

from webhelpers import APP_URL, browser, log_in

from gpufleet.grafana.sync import FOLDER_UID
from gpufleet.server.web.routing import DASHBOARD_FOLDER_UID
from gpufleet.testing.app import make_settings, running_app

GRAFANA = "https://grafana.example.test/"


async def _cluster_pages(database_url: str, data_dir: Path, **extra: str) -> list[str]:
    settings = make_settings(data_dir=data_dir, database_url=database_url, public_url=APP_URL,
                             **extra)  # fmt: skip
    async with running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        created = await app.client.post(
            "/api/v1/clusters", json={"project": "ml", "name": "inf", "size": 1}
        )
        assert created.status_code == 201, created.text
        base = f"/clusters/{created.json()['id']}"
        async with browser(app) as admin:
            assert (await log_in(admin, app.owner_token)).status_code == 303
            pages = [await admin.get(f"{base}/{tab}") for tab in ("health", "utilization",
                                                                    "configuration")]  # fmt: skip
    assert all(p.status_code == 200 for p in pages), [p.status_code for p in pages]
    return [p.text for p in pages]


async def test_the_cluster_page_links_to_the_projects_dashboards(
    database_url: str, tmp_path: Path
) -> None:
    assert DASHBOARD_FOLDER_UID == FOLDER_UID  # the folder grafana sync makes
    link = f'href="https://grafana.example.test/dashboards/f/{FOLDER_UID}/"'
    for page in await _cluster_pages(database_url, tmp_path, grafana_url=GRAFANA):
        assert link in page and "Dashboards (Grafana)" in page


async def test_no_link_without_a_grafana(database_url: str, tmp_path: Path) -> None:
    for page in await _cluster_pages(database_url, tmp_path):
        assert "Dashboards (Grafana)" not in page
