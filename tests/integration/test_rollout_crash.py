"""Kill the server mid-rollout (failpoints exit like SIGKILL right after a node's start is
committed, then right after a node's end is), restart it each time: the rollout carries
on and every node is reinstalled exactly once."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.server.failpoints import EXIT_CODE
from gpufleet.sim.world import SimWorld
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _wait(predicate: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)  # real sleep: the server's loops run on the real clock
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_a_server_killed_mid_rollout_reinstalls_every_node_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    token_file = tmp_path / "owner-token"
    env = fast_sim_server_env(data_dir=data_dir, port=port, token_file=token_file)
    url = f"http://127.0.0.1:{port}"
    rid = ""
    runs = [("rollout.after_start", "server-1.log"), ("rollout.after_node_end", "server-2.log")]
    for n, (failpoint, log) in enumerate(runs):
        proc = ServerProcess(
            args=["server"], env={**env, "GPUFLEET_FAILPOINTS": failpoint},
            log_path=tmp_path / log,
        )  # fmt: skip
        proc.start()
        try:
            proc.wait_ready(url)
            token = token_file.read_text().strip()
            api = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
            if n == 0:
                rid, nodes = _start_rollout(api)
            assert proc.proc is not None
            code = proc.proc.wait(timeout=90)
            assert code == EXIT_CODE, proc.output()[-3000:]
            assert f"failpoint {failpoint}" in proc.output()
        finally:
            proc.stop()

    again = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server-3.log")
    again.start()
    try:
        again.wait_ready(url)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)

        def ended() -> dict[str, Any] | None:
            body: dict[str, Any] = api.get(f"/api/v1/rollouts/{rid}").json()
            return body if body["status"] in ("succeeded", "paused", "aborted") else None

        rollout = _wait(ended, timeout_s=120, what="the rollout to end after the restarts")
        assert rollout["status"] == "succeeded", (rollout, again.output()[-3000:])
        assert rollout["counts"] == {"done": 3}
        assert [n["attempts"] for n in rollout["nodes"]] == [1, 1, 1]
        repairs = api.get("/api/v1/repairs", params={"all": "true", "limit": 100}).json()["items"]
        mine = [r for r in repairs if r["source"] == "rollout"]
        assert sorted(r["node_id"] for r in mine) == sorted(n["id"] for n in nodes)
        assert {r["status"] for r in mine} == {"succeeded"}
        events = api.get("/api/v1/events", params={"kind": "rollout.node", "limit": 500}).json()
        started = [e for e in events["items"] if e["data"]["to"] == "migrating"]
        assert len(started) == 3, [e["message"] for e in started]
        for node in nodes:
            shown = api.get(f"/api/v1/nodes/{node['id']}").json()
            assert shown["state"] == "in_service" and shown["software"]["driver"] == "580.95.05"
    finally:
        again.stop()
    world = SimWorld(data_dir / "sim-world.json")
    for node in nodes:
        counts = world.action_counts(node["provider_instance_id"])
        assert counts.get("reprovision", 0) == 1, (node["name"], counts)


def _start_rollout(api: httpx.Client) -> tuple[str, list[dict[str, Any]]]:
    assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
    policy = {"verify_settle_s": 1.0, "verify_timeout_s": 60.0}
    assert api.put("/api/v1/projects/ml/repair-policy", json=policy).status_code == 200
    for name, driver in (("old", "570.133.20"), ("new", "580.95.05")):
        made = api.post("/api/v1/stacks", json={"name": name, "driver": driver,
                                                 "latest": name == "old"})  # fmt: skip
        assert made.status_code == 201, made.text
    created = api.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "c1", "size": 3, "acceptance_tests": False},
    )
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]
    _wait(
        lambda: api.get(f"/api/v1/clusters/{cluster_id}").json()["status"] == "ready",
        timeout_s=30, what="the cluster to be ready",
    )  # fmt: skip
    nodes: list[dict[str, Any]] = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()[
        "items"
    ]
    opened = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    made = api.post(
        f"/api/v1/clusters/{cluster_id}/rollouts",
        json={"to_stack": "new", "window": f"daily {opened:%H:%M}/2h", "max_unavailable": "1"},
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"]), nodes
