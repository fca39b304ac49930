"""The per-project query proxy against a real Prometheus: two projects' series in one
Prometheus, and through project pa's proxy nothing of pb comes back, whatever the query
says; pa's own series do."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from apihelpers import create_project, member_client

from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.prometheus import PrometheusServer, ScrapeJob

pytestmark = pytest.mark.slow

# pb's exporter claims to be pa: Prometheus keeps the target's label (exported_project).
EXPOSITION = {
    "pa": 'fake_gpu_util{gpu="0"} 1\nfake_gpu_util{gpu="1"} 2\n',
    "pb": 'fake_gpu_util{gpu="0",project="pa"} 100\nfake_secret_pb_only 7\n',
}
PA = "/api/v1/projects/pa/prometheus/api/v1"


class _Exporter(ThreadingHTTPServer):
    body = b""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        assert isinstance(self.server, _Exporter)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def fed_prometheus(prometheus: PrometheusServer) -> Iterator[PrometheusServer]:
    """The session's Prometheus scraping one static exporter per project."""
    servers: list[_Exporter] = []
    jobs: list[ScrapeJob] = []
    for project, text in EXPOSITION.items():
        server = _Exporter(("127.0.0.1", 0), _Handler)
        server.body = text.encode()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        port = server.server_address[1]
        jobs.append(
            ScrapeJob(
                name=f"exporter-{project}",
                target=f"127.0.0.1:{port}",
                labels=(("project", project), ("cluster", f"{project}-c"), ("node", "n0")),
            )
        )
    prometheus.configure(jobs)
    # Wait for these exporters' four series, and for a module before's exporters (other
    # ports) to have gone stale: Prometheus keeps a removed target's series for about two
    # scrape intervals after a reload.
    mine = "|".join(job.target for job in jobs)
    prometheus.wait_for(
        f'count({{__name__=~"fake_.*",instance=~"{mine}"}})',
        until=lambda r: bool(r) and float(r[0]["value"][1]) == 4,
    )
    prometheus.wait_for(f'{{job=~"exporter-.*",instance!~"{mine}"}}', until=lambda r: not r)
    yield prometheus
    prometheus.configure([])
    for server in servers:
        server.shutdown()


@pytest.fixture
async def proxy_app(
    database_url: str, tmp_path: Path, fed_prometheus: PrometheusServer
) -> AsyncIterator[RunningApp]:
    settings = make_settings(
        data_dir=tmp_path / "data", database_url=database_url, prometheus_url=fed_prometheus.url
    )
    async with running_app(settings) as running:
        await create_project(running.client, "pa")
        await create_project(running.client, "pb")
        yield running


def _series(response: httpx.Response) -> list[dict[str, str]]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "success", body
    data = body["data"]
    if isinstance(data, dict):  # query / query_range
        return [r["metric"] for r in data["result"]]
    assert isinstance(data, list)
    return data


ADVERSARIAL = [
    "fake_gpu_util",
    '{__name__=~".+"}',
    '{__name__=~"fake.*"}',
    'fake_gpu_util{project="pb"}',
    'fake_gpu_util{project=~".+"}',
    'fake_gpu_util{project!="pa"}',
    'fake_secret_pb_only or {project="pb"}',
    "fake_gpu_util or fake_secret_pb_only",
    "fake_gpu_util unless fake_secret_pb_only",
    'label_replace(fake_secret_pb_only, "project", "pa", "", "")',
    'label_replace({project="pb"}, "project", "pa", "project", ".*")',
    "up",
    'up{job="exporter-pb"}',
    'count by (project) ({__name__=~".+"})',
    'absent(fake_secret_pb_only{project="pb"}) * 0 + fake_gpu_util',
    "max_over_time(fake_secret_pb_only[1m:1s])",
    '{__name__="fake_secret_pb_only"} # {project="pb"}',
]


async def test_nothing_of_another_project_comes_through(proxy_app: RunningApp) -> None:
    async with await member_client(proxy_app, "pa") as member:
        own = _series(await member.get(f"{PA}/query", params={"query": "fake_gpu_util"}))
        assert sorted(s["gpu"] for s in own) == ["0", "1"]  # pa's own series do come
        assert {s["project"] for s in own} == {"pa"}
        total = (await member.post(f"{PA}/query", data={"query": "sum(fake_gpu_util)"})).json()
        assert total["data"]["result"][0]["value"][1] == "3"  # not 103: pb's lie is not pa's

        for query in ADVERSARIAL:
            for method in ("GET", "POST"):
                kwargs: dict[str, Any] = (
                    {"params": {"query": query}} if method == "GET" else {"data": {"query": query}}
                )
                got = _series(await member.request(method, f"{PA}/query", **kwargs))
                leaked = [s for s in got if s.get("project", "pa") != "pa"]
                pb_names = [s for s in got if s.get("__name__") == "fake_secret_pb_only"]
                assert not leaked and not pb_names, (query, method, got)
                if query == 'count by (project) ({__name__=~".+"})':
                    assert got == [{"project": "pa"}]
            ranged = await member.get(
                f"{PA}/query_range",
                params={"query": query, "start": "0", "end": "4102444800", "step": "3600"},
            )
            # A long range over little data may be refused by Prometheus for too many
            # points; either way nothing of pb.
            assert "pb" not in ranged.text.replace("exporter-pb", ""), (query, ranged.text)
            assert "fake_secret_pb_only" not in ranged.text or ranged.status_code != 200

        listed = _series(await member.get(f"{PA}/series", params={"match[]": '{__name__=~".+"}'}))
        assert listed and {s["project"] for s in listed} == {"pa"}
        listed = _series(await member.post(f"{PA}/series", data={"match[]": '{project="pb"}'}))
        assert listed == []
        names = (await member.get(f"{PA}/label/__name__/values")).json()["data"]
        assert "fake_gpu_util" in names and "fake_secret_pb_only" not in names
        projects = (await member.get(f"{PA}/label/project/values")).json()["data"]
        assert projects == ["pa"]
        labels = (await member.get(f"{PA}/labels")).json()["data"]
        assert "exported_project" not in labels  # only pb's series carry it

        # Another project's proxy is not there for pa's member; pb's own proxy works.
        other = await member.get(
            "/api/v1/projects/pb/prometheus/api/v1/query", params={"query": "up"}
        )
        assert other.status_code == 404
    pb = _series(
        await proxy_app.client.get(
            "/api/v1/projects/pb/prometheus/api/v1/query",
            params={"query": "fake_secret_pb_only"},
        )
    )
    assert [s["project"] for s in pb] == ["pb"]


async def test_a_query_the_proxy_cannot_check_is_refused(proxy_app: RunningApp) -> None:
    async with await member_client(proxy_app, "pa") as member:
        for query in ['{"fake_secret_pb_only"}', "up ; down", "up{"]:
            refused = await member.get(f"{PA}/query", params={"query": query})
            assert refused.status_code == 422, (query, refused.text)
            assert "query" in refused.json()["error"]["message"]
        missing = await member.get(f"{PA}/series")
        assert missing.status_code == 422
        assert "match[]" in missing.json()["error"]["message"]
