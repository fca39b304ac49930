"""The rules around repairs, end to end on the sim: the ladder by host history, cooldown,
topology incidents, the circuit breaker, auto-approval, the dry run, admin node actions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apihelpers import error_of

from gpufleet.testing.fleet import SimFleet, sim_fleet


async def _approve(fleet: SimFleet, repair_id: str) -> None:
    response = await fleet.app.client.post(f"/api/v1/repairs/{repair_id}/approve", json={})
    assert response.status_code == 200, response.text


async def _ended(fleet: SimFleet, repair_id: str) -> str | None:
    status = await fleet.status_of(repair_id)
    return status if status in ("succeeded", "failed") else None


async def _run(fleet: SimFleet, repair_id: str) -> dict[str, Any]:
    await fleet.until(lambda: _ended(fleet, repair_id), ticks=60, seconds=5,
                      what=f"repair {repair_id} to end")  # fmt: skip
    return await fleet.repair(repair_id)


async def test_a_host_that_keeps_failing_climbs_the_ladder_to_a_new_host(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        old_serial = (await fleet.node("train-000"))["serial"]
        # Broken hardware: the NVSwitch error comes back after every reboot and reinstall.
        await fleet.inject("train-000", "sxid-fatal", sticky=True)
        climbed = []
        for expected in ("reboot", "reprovision", "failover"):
            repair = await fleet.until(
                lambda: fleet.proposed_for("train-000"), ticks=20, what=f"{expected} proposal"
            )
            assert repair["action"] == expected, repair["rule"]
            climbed.append(repair["action"])
            await _approve(fleet, repair["id"])
            done = await _run(fleet, repair["id"])
            if expected != "failover":
                assert done["status"] == "failed", done
                assert "seen again" in done["detail"]
                assert (await fleet.node("train-000"))["state"] == "cordoned"
            else:
                assert done["status"] == "succeeded", done
        assert climbed == ["reboot", "reprovision", "failover"]
        node = await fleet.node("train-000")
        assert node["state"] == "in_service" and node["serial"] != old_serial
        assert node["provider_instance_id"] == fleet.instance_id("train-000")
        assert len(fleet.world.list_instances(cluster_id=fleet.cluster["id"])) == 2  # size kept


async def test_cooldown_holds_a_new_repair_then_the_next_one_escalates(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2, policy={"cooldown_s": 1800}) as fleet:
        await fleet.inject("train-001", "xid-79")
        first = await fleet.until(lambda: fleet.proposed_for("train-001"), what="proposal")
        await _approve(fleet, first["id"])
        assert (await _run(fleet, first["id"]))["status"] == "succeeded"
        await fleet.inject("train-001", "xid-79")
        for _ in range(10):
            await fleet.tick(60)  # ten minutes: within the cooldown
            assert await fleet.proposed_for("train-001") is None
        second = await fleet.until(
            lambda: fleet.proposed_for("train-001"), ticks=30, seconds=60, what="after cooldown"
        )
        # Same host within the window: beyond a reboot (the catalog's repeat rule for Xid 79
        # says remove; the ladder alone would say reprovision).
        assert second["action"] in ("reprovision", "remove"), second["rule"]
        assert second["evidence"]["history"][0]["repair_id"] == first["id"]


async def test_four_nodes_behind_one_leaf_switch_are_one_incident(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=4) as fleet:
        for name in fleet.nodes:
            await fleet.inject(name, "xid-79")
        # The findings arrive one by one: the incident opens at three and the fourth joins.
        incident = await fleet.until(
            lambda: _incident(fleet, members=4), ticks=10, what="an incident of four nodes"
        )
        assert incident["incident_key"].startswith("leaf_switch=")
        assert sorted(incident["node_ids"]) == sorted(n["id"] for n in fleet.nodes.values())
        await fleet.tick()
        node_repairs = await fleet.repairs(kind="node", status="proposed")
        assert node_repairs == [], "members of an incident get no repair of their own"
        refused = await fleet.app.client.post(f"/api/v1/repairs/{incident['id']}/approve", json={})
        assert refused.status_code == 409 and "dismiss" in error_of(refused)["message"]
        dismissed = await fleet.app.client.post(
            f"/api/v1/repairs/{incident['id']}/dismiss", json={"reason": "switch is fine"}
        )
        assert dismissed.status_code == 200, dismissed.text
        await fleet.tick()
        await fleet.tick()
        assert len(await fleet.repairs(kind="node", status="proposed")) == 4


async def _incident(fleet: SimFleet, *, members: int) -> dict[str, Any] | None:
    items = await fleet.repairs(kind="incident", status="proposed")
    assert len(items) <= 1, items
    return items[0] if items and len(items[0]["node_ids"]) == members else None


async def test_the_breaker_trips_at_its_threshold_and_blocks_until_reset(
    database_url: str, tmp_path: Path
) -> None:
    policy = {"breaker_max_share": 0.25, "incident_min_nodes": 10}
    async with sim_fleet(database_url, tmp_path, size=4, policy=policy) as fleet:
        cid = fleet.cluster["id"]
        await fleet.inject("train-000", "xid-79")
        first = await fleet.until(lambda: fleet.proposed_for("train-000"), what="first")
        await _approve(fleet, first["id"])  # 1 of 4 out: at the threshold, allowed
        await fleet.tick()
        await fleet.inject("train-001", "xid-79")
        second = await fleet.until(lambda: fleet.proposed_for("train-001"), what="second")
        refused = await fleet.app.client.post(f"/api/v1/repairs/{second['id']}/approve", json={})
        assert refused.status_code == 409 and "breaker" in error_of(refused)["message"]
        breaker = (await fleet.app.client.get(f"/api/v1/clusters/{cid}/repair-breaker")).json()
        assert breaker["tripped"] and breaker["affected_nodes"] == 1
        assert (await _run(fleet, first["id"]))["status"] == "succeeded"
        # Nothing is out any more, but the breaker stays tripped until an admin resets it.
        still = await fleet.app.client.post(f"/api/v1/repairs/{second['id']}/approve", json={})
        assert still.status_code == 409
        reset = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/repair-breaker/reset", json={"reason": "checked"}
        )
        assert reset.status_code == 200 and not reset.json()["tripped"]
        await _approve(fleet, second["id"])


async def test_auto_approve_acts_without_a_human_only_for_the_chosen_signature(
    database_url: str, tmp_path: Path
) -> None:
    policy = {"auto_approve": [{"signature_id": "xid-79", "action": "reboot"}]}
    async with sim_fleet(database_url, tmp_path, size=2, policy=policy) as fleet:
        await fleet.inject("train-000", "xid-79")
        await fleet.inject("train-001", "xid-95", gpu_index=0)
        waiting = await fleet.until(lambda: fleet.proposed_for("train-001"), what="proposal")
        assert waiting["action"] == "reset_gpu"
        (auto,) = await fleet.repairs(node=fleet.nodes["train-000"]["id"])
        assert auto["auto_approved"] and auto["decided_by"] == "system:auto-approve"
        assert auto["status"] != "proposed"
        assert (await _run(fleet, auto["id"]))["status"] == "succeeded"
        assert await fleet.status_of(waiting["id"]) == "proposed"  # still waits for a human


async def test_dry_run_replay_reports_what_a_policy_would_have_done(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        await fleet.inject("train-000", "xid-79")
        await fleet.inject("train-001", "xid-95", gpu_index=0)
        await fleet.until(lambda: fleet.proposed_for("train-001"), what="proposal")
        before = await fleet.repairs()
        url = "/api/v1/projects/ml/repair-policy/replay"
        plain = await fleet.app.client.post(url, json={"days": 1})
        assert plain.status_code == 200, plain.text
        entries = plain.json()["entries"]
        assert {(e["subject"], e["action"]) for e in entries if e["kind"] == "propose"} >= {
            ("train-000", "reboot"),
            ("train-001", "reset_gpu"),
        }
        assert not any(e["auto_approved"] for e in entries)
        other = {"auto_approve": [{"signature_id": "xid-79", "action": "reboot"}]}
        tried = await fleet.app.client.post(url, json={"days": 1, "policy": other})
        assert any(e["auto_approved"] for e in tried.json()["entries"])
        assert await fleet.repairs() == before  # a dry run changes nothing
        bad = await fleet.app.client.post(url, json={"days": 0})
        assert bad.status_code == 422 and error_of(bad)["field"] == "days"


async def test_admin_node_actions_run_through_the_same_pipeline(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        node_id = fleet.nodes["train-001"]["id"]
        url = f"/api/v1/nodes/{node_id}/actions"
        cordoned = await fleet.app.client.post(url, json={"action": "cordon", "reason": "fan"})
        assert cordoned.status_code == 200, cordoned.text
        assert cordoned.json()["node"]["state"] == "cordoned"
        status = fleet.world.node_status("train-001", cluster_id=fleet.cluster["id"])
        assert status.drained and (status.reason or "").startswith("gpufleet:")
        back = await fleet.app.client.post(url, json={"action": "uncordon", "reason": "ok"})
        assert back.json()["node"]["state"] == "in_service"
        reboot = await fleet.app.client.post(url, json={"action": "reboot", "reason": "slow"})
        assert reboot.status_code == 200, reboot.text
        repair = reboot.json()["repair"]
        assert repair["source"] == "manual" and repair["status"] == "approved"
        twice = await fleet.app.client.post(url, json={"action": "reboot", "reason": "again"})
        assert twice.status_code == 409
        assert (await _run(fleet, repair["id"]))["status"] == "succeeded"
        removed = await fleet.app.client.post(url, json={"action": "remove", "reason": "RMA"})
        assert removed.status_code == 200, removed.text
        done = await _run(fleet, removed.json()["repair"]["id"])
        assert done["status"] == "succeeded"
        assert (await fleet.node("train-001"))["state"] == "removed"
        bad = await fleet.app.client.post(url, json={"action": "explode", "reason": "x"})
        assert bad.status_code == 422 and error_of(bad)["field"] == "action"
