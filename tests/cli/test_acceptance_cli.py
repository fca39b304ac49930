"""``gpufleet acceptance list | show | run | report`` end to end: a real ``gpufleet server``
process whose simulated agents run the sim's check tools (sped up 100×), driven through
the CLI as a person would."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli

pytestmark = pytest.mark.slow

SUITE = {
    "checks": [
        {"kind": "dcgm-diag", "params": {"level": 1}},
        {"kind": "ib-write-bw", "params": {"hcas": ["mlx5_0"]}},
        {"kind": "nccl", "scope": "cluster"},
    ]
}


@dataclass(frozen=True)
class Fleet:
    url: str
    token: str
    cluster_id: str

    def cli(self, *args: str, token: str | None = None) -> Any:
        return run_cli(*args, url=self.url, token=token or self.token)

    def json(self, *args: str) -> Any:
        done = self.cli(*args, "--output", "json")
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("acceptance-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = {
        **fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file),
        "GPUFLEET_SIM_PROGRAM_TIME_SCALE": "0.01",
        "GPUFLEET_REPORT_INTERVAL_S": "0.25",
    }
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    server.start()
    try:
        server.wait_ready(url)
        token = token_file.read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        created = api.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "c1", "size": 2, "acceptance_suite": SUITE},
        )
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        deadline = time.monotonic() + 180
        while api.get(f"/api/v1/clusters/{cluster_id}").json()["status"] != "ready":
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.5)
        yield Fleet(url=url, token=token, cluster_id=cluster_id)
    finally:
        server.stop()


def test_list_show_and_download_both_report_formats(fleet: Fleet, tmp_path: Path) -> None:
    listed = fleet.json("acceptance", "list", "--cluster", "c1")
    (run,) = listed["items"]
    assert (run["trigger"], run["status"]) == ("provisioning", "passed")
    table = fleet.cli("acceptance", "list", "--cluster", "c1")
    assert table.returncode == 0 and run["id"] in table.stdout and "passed" in table.stdout

    shown = fleet.cli("acceptance", "show", run["id"])
    assert shown.returncode == 0, shown.stderr
    assert "c1-000" in shown.stdout and "c1-001" in shown.stdout
    assert run["report_sha256"] in shown.stdout

    json_file = tmp_path / "report.json"
    done = fleet.cli("acceptance", "report", run["id"], "--format", "json", "-o", str(json_file))
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(json_file.read_bytes()).hexdigest() == run["report_sha256"]
    report = json.loads(json_file.read_bytes())
    assert {n["name"] for n in report["nodes"]} == {"c1-000", "c1-001"}
    html_file = tmp_path / "report.html"
    done = fleet.cli("acceptance", "report", run["id"], "--format", "html", "-o", str(html_file))
    assert done.returncode == 0, done.stderr
    page = html_file.read_text()
    assert page.startswith("<!DOCTYPE html>") and run["report_sha256"] in page
    # Without -o the JSON goes to stdout, byte for byte.
    out = fleet.cli("acceptance", "report", run["id"])
    assert out.returncode == 0 and out.stdout.encode() == json_file.read_bytes()


def test_run_waits_for_the_suite_and_refuses_members_and_bad_input(fleet: Fleet) -> None:
    done = fleet.json("acceptance", "run", "--cluster", "c1", "--reason", "before a run", "--wait")
    assert (done["trigger"], done["status"]) == ("manual", "passed")
    assert [n["outcome"] for n in done["nodes"]] == ["pass", "pass"]

    api = httpx.Client(
        base_url=fleet.url, headers={"Authorization": f"Bearer {fleet.token}"}, timeout=10
    )
    member = api.post("/api/v1/tokens", json={"project": "ml", "role": "member", "name": "m"})
    assert member.status_code == 201, member.text
    refused = fleet.cli("acceptance", "run", "--cluster", "c1", token=member.json()["token"])
    assert refused.returncode == 2 and "node.action" in refused.stderr
    listed = fleet.cli("acceptance", "list", "--cluster", "c1", token=member.json()["token"])
    assert listed.returncode == 0

    assert fleet.cli("acceptance", "show", "not-an-id").returncode == 2
    bad = fleet.cli("acceptance", "report", done["id"], "--format", "pdf")
    assert bad.returncode == 2 and "json or html" in bad.stderr
