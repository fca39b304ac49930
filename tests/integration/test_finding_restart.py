"""A fault cleared and raised again on one GPU, then the server killed and restarted:
exactly one finding row per episode, the clear never back-dated, events in time order.

Before the fix the restarted sim agents (whose finding queue starts empty) sent the
first episode's clear again; the server applied it to the second, open episode under the
same fold key — cleared before it began — and the following open made a duplicate row.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    env = {
        "GPUFLEET_DATA_DIR": str(tmp_path / "data"),
        "GPUFLEET_DATABASE_URL": database_url,
        "GPUFLEET_PORT": str(port),
        "GPUFLEET_BOOTSTRAP_TOKEN_FILE": str(tmp_path / "owner-token"),
        "GPUFLEET_ANNOUNCE_BOOTSTRAP_TOKEN": "false",
        "GPUFLEET_SIM_AGENTS": "true",
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[0.5, 1.0]",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
        # The restarted server takes its dead self's loop leases after 5 s, not 15.
        "GPUFLEET_LEASE_TTL_S": "5",
        "GPUFLEET_REPORT_INTERVAL_S": "1.0",
        # No background faults: this test's own are the only ones.
        "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
    }
    proc = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _wait(predicate: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _rows(api: httpx.Client, node_id: str) -> list[dict[str, Any]]:
    params = {"node": node_id, "signature": "xid-48"}
    items: list[dict[str, Any]] = api.get("/api/v1/findings", params=params).json()["items"]
    return sorted(items, key=lambda f: f["first_seen"])


def _events(api: httpx.Client, cluster_id: str) -> list[dict[str, Any]]:
    params = {"cluster": cluster_id, "limit": 1000, "kind": ["finding.opened", "finding.cleared"]}
    items: list[dict[str, Any]] = api.get("/api/v1/events", params=params).json()["items"]
    return items


@pytest.mark.parametrize("stop", ["kill", "term"])
def test_a_re_raised_fault_survives_a_restart_as_one_row_per_episode(
    server: tuple[ServerProcess, str], tmp_path: Path, stop: str
) -> None:
    proc, url = server
    proc.start()
    proc.wait_ready(url)
    token = (tmp_path / "owner-token").read_text().strip()
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
    created = api.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "c1", "size": 1, "acceptance_tests": False},
    )
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]

    def node() -> dict[str, Any] | None:
        nodes = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        return next((n for n in nodes if n["state"] == "in_service"), None)

    node_id = _wait(node, timeout_s=60, what="the node in service")["id"]
    faults = f"/api/v1/nodes/{node_id}/faults"
    fault = {"signature": "xid-48", "gpu_index": 2}

    assert api.post(faults, json=fault).status_code == 202
    _wait(lambda: len(_rows(api, node_id)) == 1, timeout_s=30, what="the first finding")
    assert api.delete(f"{faults}/xid-48", params={"gpu_index": 2}).status_code == 200
    _wait(lambda: _rows(api, node_id)[0]["cleared_at"], timeout_s=30, what="the clear")
    time.sleep(0.05)  # the second episode starts strictly later
    assert api.post(faults, json=fault).status_code == 202
    _wait(lambda: len(_rows(api, node_id)) == 2, timeout_s=30, what="the second finding")
    before = _rows(api, node_id)
    events_before = _events(api, cluster_id)

    if stop == "kill":
        proc.kill()
    else:
        proc.stop()
    proc.start()
    proc.wait_ready(url)
    # Long enough for every restarted sim agent to resync several times (1 s interval).
    time.sleep(5)

    after = _rows(api, node_id)
    first, second = after
    assert [r["id"] for r in after] == [r["id"] for r in before]
    assert first["cleared_at"] is not None and second["cleared_at"] is None, after
    assert first["first_seen"] <= first["cleared_at"] <= second["first_seen"]
    events = _events(api, cluster_id)
    assert len(events) == len(events_before) == 3, events
    in_time = sorted(events, key=lambda e: dt.datetime.fromisoformat(e["ts"]))
    assert [e["kind"] for e in in_time] == ["finding.opened", "finding.cleared", "finding.opened"]
    assert [e["data"]["finding_id"] for e in in_time] == [first["id"], first["id"], second["id"]]
    assert dt.datetime.fromisoformat(in_time[1]["ts"]) >= dt.datetime.fromisoformat(
        first["first_seen"]
    )
