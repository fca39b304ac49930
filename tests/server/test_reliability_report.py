"""The reliability report on a store's real history: a fault, and its repair that waited
for the node's job, on a simulated fleet with a fake clock (SQLite and PostgreSQL); the outage and
the lost GPU-hours match the node's own state events."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from apihelpers import error_of

from gpufleet.testing.fleet import SimFleet, sim_fleet


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


async def _ended(fleet: SimFleet, repair_id: str) -> str | None:
    status = await fleet.status_of(repair_id)
    return status if status in ("succeeded", "failed") else None


async def _repaired_fleet_report(fleet: SimFleet) -> tuple[dict[str, Any], dict[str, Any]]:
    """xid-79 on the node of a running job; the reboot approved, done once the job ended."""
    cid = fleet.cluster_id
    fleet.world.submit_job(
        cluster_id=cid, node_count=1, gpus_per_node=8, duration_s=3600, user="alice"
    )
    await fleet.tick(60)
    (job,) = fleet.world.running_jobs(cluster_id=cid)
    victim = next(name for name, n in fleet.nodes.items() if n["scheduler_name"] in job.nodes)
    await fleet.tick(1800)
    await fleet.inject(victim, "xid-79")
    repair = await fleet.until(lambda: fleet.proposed_for(victim), what="proposal")
    approved = await fleet.app.client.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
    assert approved.status_code == 200, approved.text
    # The drain waits for the job (half an hour left), then the reboot.
    done = await fleet.until(lambda: _ended(fleet, repair["id"]), ticks=120, seconds=60)
    assert done == "succeeded"
    await fleet.tick(600)  # accounting copies the job
    return repair, await fleet.get("/api/v1/reliability", cluster=cid)


async def test_a_repaired_outage_is_put_down_to_its_signature(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=3) as fleet:
        repair, report = await _repaired_fleet_report(fleet)
        node_id = repair["node_id"]
        (outage,) = report["outages"]
        assert (outage["node_id"], outage["signature"], outage["cause"]) == (
            node_id,
            "xid-79",
            "repair",
        )
        assert outage["repair_id"] == repair["id"] and outage["ended"] == "in_service"
        # The outage is the node's own history: out at its first move out of service,
        # back at its return.
        moves = [
            e for e in await fleet.events(fleet.cluster_id, "node.state") if e["node_id"] == node_id
        ]
        out = next(e for e in moves if e["data"]["from"] == "in_service")
        back = [e for e in moves if e["data"]["to"] == "in_service"][-1]
        assert _ts(outage["out_at"]) == _ts(out["ts"])
        assert _ts(outage["back_at"]) == _ts(back["ts"])
        hours = (_ts(back["ts"]) - _ts(out["ts"])).total_seconds() / 3600
        assert report["gpu_hours_lost"] == pytest.approx(8 * hours, abs=1e-3)
        finding = (await fleet.get("/api/v1/findings", node=node_id, signature="xid-79"))["items"]
        detected = min(_ts(f["first_seen"]) for f in finding)
        assert _ts(outage["detected_at"]) == detected
        mttr = (_ts(back["ts"]) - detected).total_seconds() / 3600
        assert report["mttr_h"] == pytest.approx(mttr, abs=1e-3)
        assert report["failures"] == 1
        (cluster,) = report["by_cluster"]
        assert cluster["name"] == "ml/" + fleet.cluster["name"] and cluster["gpus"] == 24
        assert report["by_signature"][0]["key"] == "xid-79"
        # The job ran to its end before the drain let the reboot go: nothing thrown away.
        assert report["job_gpu_hours_lost"] == 0
        assert 0 < report["available_pct"] < 100


async def test_bad_reliability_windows_are_refused(database_url: str, tmp_path: Path) -> None:
    async with sim_fleet(database_url, tmp_path, size=1) as fleet:
        backwards = await fleet.app.client.get(
            "/api/v1/reliability",
            params={"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        )
        assert backwards.status_code == 422 and error_of(backwards)["field"] == "until"
        too_long = await fleet.app.client.get(
            "/api/v1/reliability",
            params={"since": "2024-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        )
        assert too_long.status_code == 422 and error_of(too_long)["field"] == "since"
        unknown = await fleet.app.client.get("/api/v1/reliability", params={"project": "nope"})
        assert unknown.status_code == 404
        empty = await fleet.get("/api/v1/reliability")
        assert empty["outages"] == [] and empty["gpu_hours_lost"] == 0
        assert json.dumps(empty)  # plain JSON
