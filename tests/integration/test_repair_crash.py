"""Kill the server inside each repair step (a failpoint exits like SIGKILL between a
driver call and the store write that records it), restart it: the repair completes
exactly once, with one reboot and one of each transition."""

from __future__ import annotations

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

FAILPOINTS = [
    "repair.cordoning.after_drain",
    "repair.draining.after_empty",
    "repair.acting.before_call",
    "repair.acting.after_call",
    "repair.verifying.after_resume",
]
STEPS = ["approved", "cordoning", "draining", "acting", "verifying", "succeeded"]


def _wait(predicate: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_a_crash_inside_each_step_still_completes_the_repair_exactly_once(
    failpoint: str, tmp_path: Path
) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    token_file = tmp_path / "owner-token"
    env = fast_sim_server_env(data_dir=data_dir, port=port, token_file=token_file)
    url = f"http://127.0.0.1:{port}"
    crashing = ServerProcess(
        args=["server"], env={**env, "GPUFLEET_FAILPOINTS": failpoint},
        log_path=tmp_path / "server-1.log",
    )  # fmt: skip
    crashing.start()
    try:
        crashing.wait_ready(url)
        token = token_file.read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        policy = {"verify_settle_s": 1.0, "verify_timeout_s": 60.0, "breaker_max_share": 0.5}
        assert api.put("/api/v1/projects/ml/repair-policy", json=policy).status_code == 200
        created = api.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "c1", "size": 2, "acceptance_tests": False},
        )
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        _wait(
            lambda: api.get(f"/api/v1/clusters/{cluster_id}").json()["status"] == "ready",
            timeout_s=30, what="the cluster to be ready",
        )  # fmt: skip
        nodes = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        node = next(n for n in nodes if n["name"] == "c1-000")
        injected = api.post(f"/api/v1/nodes/{node['id']}/faults", json={"signature": "xid-79"})
        assert injected.status_code == 202, injected.text

        def proposed() -> dict[str, Any] | None:
            items = api.get(
                "/api/v1/repairs", params={"node": node["id"], "status": "proposed"}
            ).json()["items"]
            return items[0] if items else None

        repair = _wait(proposed, timeout_s=30, what="a recommendation")
        approved = api.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
        assert approved.status_code == 200, approved.text
        assert crashing.proc is not None
        code = crashing.proc.wait(timeout=60)
        assert code == EXIT_CODE, crashing.output()[-3000:]
        assert f"failpoint {failpoint}" in crashing.output()
    finally:
        crashing.stop()

    again = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server-2.log")
    again.start()
    try:
        again.wait_ready(url)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        done = _wait(
            lambda: api.get(f"/api/v1/repairs/{repair['id']}").json()["status"]
            in ("succeeded", "failed"),
            timeout_s=90, what="the repair to end after the restart",
        )  # fmt: skip
        assert done
        shown = api.get(f"/api/v1/repairs/{repair['id']}").json()
        assert shown["status"] == "succeeded", (shown, again.output()[-3000:])
        events = api.get(
            "/api/v1/events", params={"node": node["id"], "kind": "repair.status", "limit": 500}
        ).json()["items"]
        steps = [e["data"]["to"] for e in sorted(events, key=lambda e: e["id"])
                 if repair["id"] in e["message"]]  # fmt: skip
        assert steps == STEPS, steps
        assert api.get(f"/api/v1/nodes/{node['id']}").json()["state"] == "in_service"
        repairs = api.get("/api/v1/repairs", params={"node": node["id"]}).json()["items"]
        assert [r["id"] for r in repairs] == [repair["id"]]  # no second repair appeared
    finally:
        again.stop()
    world = SimWorld(data_dir / "sim-world.json")
    instance = world.get_instance(node["provider_instance_id"])
    assert instance is not None
    assert world.reboot_count(instance.instance_id) == 1, "the machine was rebooted twice"
