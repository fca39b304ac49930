"""Re-acceptance: a repaired node runs its startup scripts again and passes the node-level
suite before it is back in service; a failed re-acceptance fails the repair loudly, leaves
the node cordoned, and the planner recommends the next rung."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acceptancehelpers import QUICK_SUITE, STEP_S, bringup

from gpufleet.testing.fleet import SimFleet

pytestmark = pytest.mark.long

LADDER_ABOVE_REBOOT = ("reprovision", "failover", "remove")


async def _ready(fleet: SimFleet, **body: Any) -> tuple[str, dict[str, dict[str, Any]]]:
    response = await fleet.app.client.post(
        "/api/v1/clusters",
        json={
            "project": "ml",
            "name": "train",
            "size": 3,
            "gpus_per_node": 8,
            "startup_scripts": ["echo booted"],
            "acceptance_suite": QUICK_SUITE,
            **body,
        },
    )
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    await fleet.until(lambda: fleet.status_is(cid, "ready"), ticks=400, what="cluster ready")
    return cid, await fleet.nodes_of(cid)


async def _reboot(fleet: SimFleet, node_id: str) -> str:
    response = await fleet.app.client.post(
        f"/api/v1/nodes/{node_id}/actions", json={"action": "reboot", "reason": "test"}
    )
    assert response.status_code == 200, response.text
    repair_id: str = response.json()["repair"]["id"]
    return repair_id


async def _ended(fleet: SimFleet, repair_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        repair: dict[str, Any] = (await fleet.app.client.get(f"/api/v1/repairs/{repair_id}")).json()
        return repair if repair["status"] in ("succeeded", "failed") else None

    ended: dict[str, Any] = await fleet.until(check, ticks=200, what="the repair ended")
    return ended


async def test_a_repaired_node_passes_reacceptance_before_it_is_in_service(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _ready(fleet)
        node = nodes["train-001"]
        repair_id = await _reboot(fleet, node["id"])
        repair = await _ended(fleet, repair_id)
        assert repair["status"] == "succeeded", (repair["detail"], await fleet.describe())

        states = [
            (e["data"]["from"], e["data"]["to"])
            for e in await fleet.events(cid, "node.state")
            if e["node_id"] == node["id"]
        ]
        # Provisioning, then the repair: in service only after re-acceptance.
        assert states == [
            ("provisioning", "acceptance"),
            ("acceptance", "in_service"),
            ("in_service", "cordoned"),
            ("cordoned", "draining"),
            ("draining", "drained"),
            ("drained", "repairing"),
            ("repairing", "acceptance"),
            ("acceptance", "in_service"),
        ]
        runs = await fleet.acceptance_runs(cid)
        again = [r for r in runs if r["trigger"] == "repair"]
        assert [(r["repair_id"], r["status"], r["node_ids"]) for r in again] == [
            (repair_id, "passed", [node["id"]])
        ]
        # Node-level checks only, one per check of the suite at node scope.
        assert len(again[0]["check_run_ids"]) == 3
        report = await fleet.app.client.get(f"/api/v1/acceptance/{again[0]['id']}/report.json")
        assert report.status_code == 200 and report.json()["run"]["repair_id"] == repair_id
        # The reboot was a node start: the startup script ran again, after the provision.
        ran = [
            e["data"]
            for e in await fleet.events(cid, "node.startup_script")
            if e["node_id"] == node["id"] and "index" in e["data"]
        ]
        assert [d["stdout_tail"] for d in ran] == ["booted\n", "booted\n"]
        steps = [e["message"] for e in await fleet.events(cid, "repair.step")]
        assert any("re-acceptance" in m for m in steps)
        assert (await fleet.get(f"/api/v1/clusters/{cid}"))["status"] == "ready"


async def test_a_failed_reacceptance_fails_the_repair_and_the_ladder_climbs(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _ready(fleet)
        node = nodes["train-002"]
        repair_id = await _reboot(fleet, node["id"])

        async def in_reacceptance() -> bool:
            return (await fleet.nodes_of(cid))["train-002"]["state"] == "acceptance"

        await fleet.until(in_reacceptance, ticks=200, what="re-acceptance started")
        # The node came back clean from its reboot; now its memory goes bad, before its
        # checks run: DCGM's memory test fails on GPU 5.
        await fleet.inject(node["id"], "xid-48", gpu_index=5, sticky=True)
        repair = await _ended(fleet, repair_id)
        assert repair["status"] == "failed", repair
        assert "re-acceptance" in repair["detail"] and "failed" in repair["detail"]

        after = (await fleet.nodes_of(cid))["train-002"]
        assert after["state"] == "cordoned"
        assert after["state_detail"].startswith("re-acceptance")
        (run,) = [r for r in await fleet.acceptance_runs(cid) if r["trigger"] == "repair"]
        assert (run["status"], run["failed_nodes"]) == ("failed", ["train-002"])

        async def next_rung() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = (
                await fleet.app.client.get(
                    "/api/v1/repairs", params={"node": node["id"], "status": "proposed"}
                )
            ).json()["items"]
            return items

        (proposal,) = await fleet.until(next_rung, what="the next repair recommended")
        assert proposal["action"] in LADDER_ABOVE_REBOOT, proposal
