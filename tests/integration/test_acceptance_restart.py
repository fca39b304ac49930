"""Kill the server in the middle of acceptance (a failpoint exits like SIGKILL right after
a step committed, or between undoing a drain and recording it), restart it: the same run
finishes, every node ran its startup scripts once and each node-level check once, and
the cluster is ready with a report whose hash matches."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.server.failpoints import EXIT_CODE
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port

pytestmark = [pytest.mark.slow, pytest.mark.long]

SIZE = 4
SCRIPTS = ["echo one", "echo two"]
# The default suite with two HCAs instead of eight: the same stages, fewer commands.
SUITE = {
    "checks": [
        {"kind": "dcgm-diag", "params": {"level": 3}},
        {"kind": "nccl"},
        {"kind": "ib-write-bw", "params": {"hcas": ["mlx5_0", "mlx5_1"]}},
        {"kind": "nccl", "scope": "cluster"},
    ]
}
FAILPOINTS = [
    "acceptance.startup.after_step",
    "acceptance.node.after_start",
    "acceptance.cluster.after_start",
    "acceptance.gating.after_resume",
]


def _wait(predicate: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_a_crash_mid_acceptance_resumes_the_same_run(failpoint: str, tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    token_file = tmp_path / "owner-token"
    env = {
        **fast_sim_server_env(data_dir=data_dir, port=port, token_file=token_file),
        # The check tools at 1/500 of their real durations (DCGM level 3: under 2 s).
        "GPUFLEET_SIM_PROGRAM_TIME_SCALE": "0.002",
        "GPUFLEET_REPORT_INTERVAL_S": "0.25",
    }
    url = f"http://127.0.0.1:{port}"
    crashing = ServerProcess(
        args=["server"],
        env={**env, "GPUFLEET_FAILPOINTS": failpoint},
        log_path=tmp_path / "server-1.log",
    )
    crashing.start()
    try:
        crashing.wait_ready(url)
        token = token_file.read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        created = api.post(
            "/api/v1/clusters",
            json={
                "project": "ml",
                "name": "c1",
                "size": SIZE,
                "startup_scripts": SCRIPTS,
                "acceptance_suite": SUITE,
            },
        )
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        assert crashing.proc is not None
        crashing.proc.wait(timeout=300)
        assert crashing.proc.returncode == EXIT_CODE, crashing.output()
        assert f"failpoint {failpoint}" in crashing.output()
    finally:
        crashing.stop()

    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server-2.log")
    server.start()
    try:
        server.wait_ready(url)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)

        def settled() -> dict[str, Any] | None:
            body: dict[str, Any] = api.get(f"/api/v1/clusters/{cluster_id}").json()
            return body if body["status"] in ("ready", "degraded") else None

        # The suite's commands run one at a time per node (as a real agent runs them),
        # each picked up at the agent's next report: a minute or two on 2 shared cores.
        cluster = _wait(settled, timeout_s=300, what="the cluster to settle after the restart")
        assert cluster["status"] == "ready", cluster
        nodes = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        assert len(nodes) == SIZE and {n["state"] for n in nodes} == {"in_service"}

        runs = api.get(f"/api/v1/clusters/{cluster_id}/acceptance").json()["items"]
        assert [(r["trigger"], r["status"]) for r in runs] == [("provisioning", "passed")]
        run = runs[0]
        # Each node-level check covered every node exactly once, across batches and the
        # crash; the cluster-wide one ran once.
        covered: dict[tuple[str, str | None], list[str]] = {}
        for check_id in run["check_run_ids"]:
            check = api.get(f"/api/v1/checks/{check_id}").json()
            key = (check["kind"], check["params"].get("scope"))
            covered.setdefault(key, []).extend(n["id"] for n in check["nodes"])
        node_ids = sorted(n["id"] for n in nodes)
        for key in [("dcgm-diag", None), ("nccl", "per-node"), ("ib-write-bw", None)]:
            assert sorted(covered[key]) == node_ids, key
        assert sorted(covered[("nccl", "multi-node")]) == node_ids

        events = api.get(
            "/api/v1/events",
            params={"cluster": cluster_id, "kind": "node.startup_script", "limit": 1000},
        ).json()["items"]
        results = [e for e in events if "index" in e["data"]]
        for node in nodes:
            mine = sorted(e["data"]["index"] for e in results if e["node_id"] == node["id"])
            assert mine == [0, 1], (node["name"], mine)
        transitions = api.get(
            "/api/v1/events",
            params={"cluster": cluster_id, "kind": "cluster.status", "limit": 100},
        ).json()["items"]
        assert [e["data"]["to"] for e in reversed(transitions)] == ["acceptance", "ready"]

        report = api.get(f"/api/v1/acceptance/{run['id']}/report.json")
        assert report.status_code == 200
        digest = hashlib.sha256(report.content).hexdigest()
        assert digest == run["report_sha256"] == report.headers["etag"].strip('"')
        assert json.loads(report.content)["summary"]["passed"] == SIZE
    finally:
        server.stop()
