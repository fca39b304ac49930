"""The Utilization tab with Prometheus: its charts read from a real Prometheus scraping
real agents (sim GPUs, and the recorded sysfs/proc trees of tests/fixtures/hostio for
InfiniBand, NICs, disks, NFS and Lustre), through the project's query proxy; without
Prometheus, from the telemetry tables as before; with Prometheus down, from the tables
with a note. A screenshot of the Prometheus-backed tab goes to
``test-artifacts/console/13-utilization-prometheus.png``.

The agents: two of project ``ml``'s cluster ``train`` (2 GPUs each), and one more (3
GPUs) scraped twice, once labelled as project ``other``'s cluster also called ``train``
and once as ``ml``'s other cluster ``infer``. Neither of its two label sets may reach
the tab: the proxy forces the project, the tab selects the cluster. The store is not what
is tested here, so SQLite only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from browser_env import CHROMIUM, launch, shot
from playwright.async_api import Route, async_playwright
from webhelpers import APP_URL, browser, log_in

from gpufleet.core.errors import Unavailable
from gpufleet.server.services.prometheus_proxy import ProxiedAnswer, rewrite_params
from gpufleet.server.services.utilization_prometheus import (
    chart_queries,
    combined_query,
    inventory_query,
    result_of,
)
from gpufleet.testing.fleet import SimFleet, sim_fleet
from gpufleet.testing.processes import AgentProcess, free_port
from gpufleet.testing.prometheus import PrometheusServer, ScrapeJob

pytestmark = pytest.mark.slow
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

HOSTIO = Path(__file__).resolve().parents[1] / "fixtures" / "hostio"
# (hostname, GPUs, the label sets it is scraped with)
AGENTS = (
    ("gpu-a", 2, [{"project": "ml", "cluster": "train", "node": "train-001"}]),
    ("gpu-b", 2, [{"project": "ml", "cluster": "train", "node": "train-002"}]),
    (
        "intruder",
        3,
        [
            {"project": "other", "cluster": "train", "node": "train-001"},
            {"project": "ml", "cluster": "infer", "node": "infer-001"},
        ],
    ),
)
SCRAPED_GPUS = 2 + 2 + 3 + 3


@pytest.fixture(scope="module")
def scraped(
    prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """The session's Prometheus scraping the agents above, each scraped twice by now."""
    tmp = tmp_path_factory.mktemp("utilization-agents")
    jobs: list[ScrapeJob] = []
    with contextlib.ExitStack() as stack:
        for i, (hostname, gpus, label_sets) in enumerate(AGENTS):
            port = free_port()
            agent = AgentProcess(
                server_url="http://127.0.0.1:1",  # its reports are not what is tested
                node_token="unused",
                state_dir=tmp / f"agent{i}",
                kernel_log=tmp / f"kmsg{i}",
                log_path=tmp / f"agent{i}.log",
                env={
                    "GPUFLEET_AGENT_HOSTNAME": hostname,
                    "GPUFLEET_AGENT_SIM_GPUS": str(gpus),
                    "GPUFLEET_AGENT_METRICS_LISTEN": f"127.0.0.1:{port}",
                    "GPUFLEET_AGENT_SYS_ROOT": str(HOSTIO / "sys"),
                    "GPUFLEET_AGENT_PROC_ROOT": str(HOSTIO / "proc"),
                },
            )
            agent.kernel_log.write_text("")
            agent.start()
            stack.callback(agent.stop)
            jobs += [
                ScrapeJob(f"util-{hostname}-{k}", f"127.0.0.1:{port}", labels=tuple(ls.items()))
                for k, ls in enumerate(label_sets)
            ]
        prometheus.configure(jobs)
        stack.callback(prometheus.configure, [])
        mine = "|".join(sorted({job.target for job in jobs}))
        prometheus.wait_for(
            f'count(DCGM_FI_DEV_GPU_UTIL{{instance=~"{mine}"}})',
            until=lambda r: bool(r) and float(r[0]["value"][1]) == SCRAPED_GPUS,
            timeout_s=40,
        )
        # Two scrapes of every counter, for rate(); and no series left of a module before
        # (a reload keeps a removed target's series about two scrape intervals).
        prometheus.wait_for(
            f'count(rate(node_infiniband_port_data_received_bytes_total{{instance=~"{mine}"}}[1m]))'
        )
        prometheus.wait_for(f'{{cluster=~"train|infer",instance!~"{mine}"}}', until=lambda r: not r)
        yield prometheus


@contextlib.asynccontextmanager
async def fleet_with(
    database_url: str, tmp_path: Path, prometheus_url: str | None, *, real_time: bool = False
) -> AsyncIterator[SimFleet]:
    """The sim fleet; with ``real_time`` its clock is moved to the real time (it started
    when the fleet did), where Prometheus's samples are; else a minute on, for a minute
    of rows in the telemetry tables."""
    async with sim_fleet(
        database_url, tmp_path, size=3, public_url=APP_URL, prometheus_url=prometheus_url
    ) as fleet:
        if real_time:
            fleet.clock.advance((dt.datetime.now(dt.UTC) - fleet.clock.now()).total_seconds())
        else:
            await fleet.tick(60)
        yield fleet


async def tab(fleet: SimFleet, *, screenshot: str | None = None) -> str:
    async with browser(fleet.app) as client:
        assert (await log_in(client, fleet.app.owner_token)).status_code == 303
        path = f"/clusters/{fleet.cluster_id}/utilization"
        page = await client.get(path)
        assert page.status_code == 200, page.text
        if screenshot is not None:
            await take_screenshot(client, path, screenshot)
    return page.text


async def take_screenshot(client: httpx.AsyncClient, path: str, name: str) -> None:
    """Chromium on the page, every request answered by the in-process app (as the
    logged-in ``client``): nothing leaves the test."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium"

    async def from_app(route: Route) -> None:
        request = route.request
        answer = await client.request(request.method, request.url)
        await route.fulfill(status=answer.status_code, headers=dict(answer.headers),
                            body=answer.content)  # fmt: skip

    async with async_playwright() as playwright:
        chromium = await launch(playwright)
        try:
            context = await chromium.new_context(viewport={"width": 1400, "height": 900})
            await context.route("**/*", from_app)
            page = await context.new_page()
            await page.goto(APP_URL + path)
            await shot(page, name)
        finally:
            await chromium.close()


def chart_titles(html: str) -> list[str]:
    return re.findall(r'<section class="card chartcard" aria-label="([^"]+)"', html)


@SQLITE_ONLY
async def test_charts_come_from_prometheus_of_this_project_and_cluster(
    database_url: str, tmp_path: Path, scraped: PrometheusServer
) -> None:
    async with fleet_with(database_url, tmp_path, scraped.url, real_time=True) as fleet:
        html = await tab(fleet, screenshot="13-utilization-prometheus")
    # The tables hold 3 nodes of 8 GPUs; Prometheus this cluster's two agents, 2 GPUs
    # each: the intruder's 3 (another project's "train", this project's "infer") never.
    assert 'data-source="prometheus"' in html and 'data-source="tables"' not in html
    assert "4 GPUs on 2 nodes reporting" in html
    assert chart_titles(html) == [
        "GPU utilization (average)",
        "GPU memory used",
        "GPU power (sum)",
        "GPU temperature",
        "InfiniBand throughput (all ports)",
        "NIC throughput (Ethernet)",
        "Local disk I/O",
        "NFS and Lustre I/O",
    ]
    # Every chart drawn (the recorded host has IB ports, NICs, disks, NFS and Lustre).
    assert html.count('<svg class="chart"') == 8, html
    assert "Needs Prometheus" not in html and "did not answer" not in html


@SQLITE_ONLY
async def test_without_prometheus_the_tables_draw_and_io_needs_prometheus(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_with(database_url, tmp_path, None) as fleet:
        html = await tab(fleet)
    assert 'data-source="tables"' in html and 'data-source="prometheus"' not in html
    assert "One sample per node per minute" in html
    assert chart_titles(html) == [
        "GPU utilization (average)",
        "GPU memory used",
        "GPU power (sum)",
        "GPU temperature",
    ]
    assert html.count('<svg class="chart"') == 4
    assert "Needs Prometheus." in html and "GPUFLEET_PROMETHEUS_URL" in html
    assert "did not answer" not in html


@SQLITE_ONLY
async def test_prometheus_down_falls_back_on_the_tables_with_a_note(
    database_url: str, tmp_path: Path
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with fleet_with(database_url, tmp_path, nobody) as fleet:
        html = await tab(fleet)
    assert 'class="banner"' in html and "Prometheus did not answer" in html
    assert nobody in html  # which Prometheus, for whoever runs it
    assert html.count('<svg class="chart"') == 4  # the tables' GPU charts
    assert 'data-source="prometheus"' not in html and "Needs Prometheus." not in html


def test_every_chart_query_passes_the_proxy_checks() -> None:
    """The proxy refuses what it cannot check: each chart's query must pass, the project
    forced into every selector of it."""
    charts = chart_queries(cluster='we"ird', step_s=15)
    assert set(charts) == {"util", "mem", "power", "temp", "ib", "nic", "disk", "netfs"}
    for parts in [*charts.values(), [("hosts", inventory_query(cluster="train"))]]:
        query = dict(
            rewrite_params("query_range", [("query", combined_query(parts))], project="ml")
        )
        selectors = re.findall(r"\{[^}]*\}", query["query"])
        assert selectors and all('project="ml"' in s for s in selectors), query


def test_a_prometheus_error_is_unavailable_with_its_reason() -> None:
    refused = ProxiedAnswer(
        status_code=422,
        body=b'{"status":"error","errorType":"execution","error":"query timed out"}',
        content_type="application/json",
    )
    with pytest.raises(Unavailable, match="answered 422: query timed out"):
        result_of(refused, prometheus_url="http://prom:9090")
