"""Kill the server (SIGKILL) while a cluster provisions; the restart finishes the job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.sim.world import SimWorld
from gpufleet.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.slow

SIZE = 12


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, str, Path]]:
    port = free_port()
    data_dir = tmp_path / "data"
    token_file = tmp_path / "owner-token"
    env = {
        "GPUFLEET_DATA_DIR": str(data_dir),
        "GPUFLEET_DATABASE_URL": database_url,
        "GPUFLEET_PORT": str(port),
        "GPUFLEET_BOOTSTRAP_TOKEN_FILE": str(token_file),
        "GPUFLEET_ANNOUNCE_BOOTSTRAP_TOKEN": "false",
        "GPUFLEET_SIM_AGENTS": "true",
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[1.5, 9.0]",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
        # The restarted server takes its dead self's loop leases after 5 s, not 15.
        "GPUFLEET_LEASE_TTL_S": "5",
        "GPUFLEET_REPORT_INTERVAL_S": "1.0",
    }
    proc = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    try:
        yield proc, f"http://127.0.0.1:{port}", data_dir
    finally:
        proc.stop()


def _wait(predicate: object, *, timeout_s: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_kill_during_provisioning_converges_without_duplicates(
    server: tuple[ServerProcess, str, Path], tmp_path: Path
) -> None:
    proc, url, data_dir = server
    proc.start()
    proc.wait_ready(url)
    token = (tmp_path / "owner-token").read_text().strip()
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
    # Acceptance off: this is about provisioning (tests/integration/test_acceptance_restart.py
    # kills the server mid-acceptance).
    created = api.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "c1", "size": SIZE, "acceptance_tests": False},
    )
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]

    def in_service() -> int:
        nodes = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        return sum(1 for n in nodes if n["state"] == "in_service")

    # Kill while some machines are up and others are still booting.
    _wait(lambda: in_service() >= 2, timeout_s=30, what="the first nodes in service")
    assert api.get(f"/api/v1/clusters/{cluster_id}").json()["status"] == "provisioning"
    proc.kill()

    proc.start()
    proc.wait_ready(url)
    _wait(
        lambda: api.get(f"/api/v1/clusters/{cluster_id}").json()["status"] == "ready",
        timeout_s=60,
        what="the cluster to be ready after restart",
    )
    nodes = api.get("/api/v1/nodes", params={"cluster": cluster_id, "limit": 1000}).json()["items"]
    assert len(nodes) == SIZE
    assert len({n["name"] for n in nodes}) == SIZE
    assert all(n["state"] == "in_service" for n in nodes)
    instance_ids = {n["provider_instance_id"] for n in nodes}
    assert None not in instance_ids and len(instance_ids) == SIZE
    # The simulated cloud agrees: exactly one live machine per node, none orphaned, and
    # no machine was ever asked for twice.
    world = SimWorld(data_dir / "sim-world.json")
    assert len(world.list_instances(cluster_id=cluster_id, include_terminated=True)) == SIZE
    live = world.list_instances(cluster_id=cluster_id)
    assert sorted(i.instance_id for i in live) == sorted(instance_ids)

    # And every node's agent reports again after the crash.
    def all_healthy() -> bool:
        items = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        return all(n["health"] == "healthy" for n in items)

    _wait(all_healthy, timeout_s=30, what="every node to report healthy")
