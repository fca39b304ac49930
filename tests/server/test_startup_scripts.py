"""Startup scripts on the sim: run in order on every node start through the agent command
channel, output in the node's events; a failing script holds the node out of service
with the error shown until an admin retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from acceptancehelpers import bringup
from apihelpers import member_client

from gpufleet.server.services.startup_scripts import DEFAULT_SCRIPT_TIMEOUT_S, script_timeout_s
from gpufleet.testing.fleet import SimFleet


async def _create(fleet: SimFleet, scripts: list[str], **body: Any) -> dict[str, Any]:
    response = await fleet.app.client.post(
        "/api/v1/clusters",
        json={
            "project": "ml",
            "name": "train",
            "size": 2,
            "gpus_per_node": 8,
            "acceptance_tests": False,
            "startup_scripts": scripts,
            **body,
        },
    )
    assert response.status_code == 201, response.text
    cluster: dict[str, Any] = response.json()
    return cluster


async def _results(fleet: SimFleet, cluster_id: str, node_id: str) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in await fleet.events(cluster_id, "node.startup_script")
        if e["node_id"] == node_id and "index" in e["data"]
    ]


def test_a_script_may_set_its_own_time_limit() -> None:
    assert script_timeout_s("echo hi") == DEFAULT_SCRIPT_TIMEOUT_S
    assert script_timeout_s("#!/bin/sh\n# gpufleet-timeout: 120\nmake") == 120.0
    assert script_timeout_s("# gpufleet-timeout: 99999999\n") == 6 * 3600.0
    assert script_timeout_s("\n" * 30 + "# gpufleet-timeout: 5\n") == DEFAULT_SCRIPT_TIMEOUT_S


async def test_scripts_run_in_order_and_their_output_is_on_the_timeline(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path) as fleet:
        scripts = ["echo first; echo to-stderr >&2", 'echo "second saw $((6 * 7))"']
        cluster = await _create(fleet, scripts)
        cid = cluster["id"]
        await fleet.until(lambda: fleet.status_is(cid, "ready"), what="cluster ready")
        nodes = await fleet.nodes_of(cid)
        for node in nodes.values():
            mine = await _results(fleet, cid, node["id"])
            assert [(d["index"], d["exit_code"], d["status"]) for d in mine] == [
                (0, 0, "succeeded"),
                (1, 0, "succeeded"),
            ]
            assert mine[0]["stdout_tail"] == "first\n"
            assert mine[0]["stderr_tail"] == "to-stderr\n"
            assert mine[1]["stdout_tail"] == "second saw 42\n"
            # The second script started only after the first had ended.
            assert mine[1]["started_at"] >= mine[0]["finished_at"]
            assert node["state"] == "in_service" and node["state_detail"] == ""


async def test_a_failing_script_holds_the_node_until_an_admin_retries(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path) as fleet:
        scripts = ["echo ok", "echo 'mount /data: no such device' >&2; exit 3", "echo never"]
        cluster = await _create(fleet, scripts)
        cid = cluster["id"]

        async def held() -> dict[str, dict[str, Any]] | None:
            nodes = await fleet.nodes_of(cid)
            done = all("exited 3" in n["state_detail"] for n in nodes.values())
            return nodes if done else None

        nodes = await fleet.until(held, what="both nodes held by the failed script")
        for node in nodes.values():
            assert node["state"] == "provisioning"
            assert node["state_detail"] == (
                "startup script 2/3 exited 3: mount /data: no such device"
            )
            mine = await _results(fleet, cid, node["id"])
            assert [(d["index"], d["exit_code"]) for d in mine] == [(0, 0), (1, 3)]
        for _ in range(5):  # it stays that way: no retry by itself, the third never runs
            await fleet.tick()
        status = await fleet.get(f"/api/v1/clusters/{cid}")
        assert status["status"] == "provisioning"
        assert "startup scripts failed on train-000, train-001" in status["status_detail"]
        assert "exited 3" in status["status_detail"]
        for node in (await fleet.nodes_of(cid)).values():
            assert len(await _results(fleet, cid, node["id"])) == 2

        # Members cannot retry; an admin fixes the script, then retries each node.
        one = nodes["train-000"]["id"]
        async with await member_client(fleet.app) as member:
            refused = await member.post(
                f"/api/v1/nodes/{one}/actions",
                json={"action": "retry_startup", "reason": "fixed"},
            )
            assert refused.status_code == 403
        fixed = await fleet.app.client.patch(
            f"/api/v1/clusters/{cid}",
            json={"startup_scripts": ["echo ok", "true"], "reason": "drop the bad mount"},
        )
        assert fixed.status_code == 200
        for node in nodes.values():
            response = await fleet.app.client.post(
                f"/api/v1/nodes/{node['id']}/actions",
                json={"action": "retry_startup", "reason": "mount removed"},
            )
            assert response.status_code == 200, response.text
            assert response.json()["repair"] is None
        await fleet.until(lambda: fleet.status_is(cid, "ready"), what="cluster ready")
        for node in (await fleet.nodes_of(cid)).values():
            assert (node["state"], node["state_detail"]) == ("in_service", "")
            mine = await _results(fleet, cid, node["id"])
            assert [(d["index"], d["exit_code"]) for d in mine] == [(0, 0), (1, 3), (0, 0), (1, 0)]
        # A node that is in service has nothing to retry.
        again = await fleet.app.client.post(
            f"/api/v1/nodes/{one}/actions", json={"action": "retry_startup", "reason": "again"}
        )
        assert again.status_code == 409
        actions = await fleet.events(cid, "node.action")
        assert [e["data"]["action"] for e in actions] == ["retry_startup", "retry_startup"]


async def test_a_hung_script_is_killed_at_its_limit_and_fails(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path) as fleet:
        cluster = await _create(fleet, ["# gpufleet-timeout: 1\nsleep 60"], size=1)
        cid = cluster["id"]

        async def held() -> dict[str, Any] | None:
            node = (await fleet.nodes_of(cid))["train-000"]
            return node if "timed out" in node["state_detail"] else None

        node = await fleet.until(held, ticks=200, what="the script killed at its limit")
        assert node["state"] == "provisioning"
        assert node["state_detail"].startswith("startup script 1/1 timed out after 1 s")
        (result,) = await _results(fleet, cid, node["id"])
        assert (result["status"], result["timed_out"]) == ("timed_out", True)
