"""Repair scenarios end to end through the API on the sim: recommendation, approval,
cordon → drain → act → verify → back in service, and the rules around them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from apihelpers import error_of, member_client
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow, EventRow
from gpufleet.testing.fleet import SimFleet, sim_fleet

KILLED = {"NODE_FAIL", "CANCELLED", "PREEMPTED"}


async def _timeline(fleet: SimFleet, repair_id: str) -> list[str]:
    async with fleet.app.ctx.db.session() as session:
        rows = await session.scalars(
            select(EventRow).where(EventRow.kind == "repair.status").order_by(EventRow.id)
        )
        return [r.data["to"] for r in rows if repair_id in r.message]


def _no_job_killed(fleet: SimFleet, since: dt.datetime) -> None:
    ended = fleet.world.accounting_since(since, cluster_id=fleet.cluster["id"])
    killed = [(j.job_id, j.state) for j in ended if j.state in KILLED]
    assert not killed, f"jobs were killed without a force: {killed}"


async def test_xid_79_is_recommended_approved_drained_rebooted_verified_and_back(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=4) as fleet:
        start = fleet.clock.now()
        cid = fleet.cluster["id"]
        job = fleet.world.submit_job(
            cluster_id=cid, node_count=4, gpus_per_node=8, duration_s=300, user="alice",
            account="llm-pretrain",
        )  # fmt: skip
        await fleet.tick()
        assert fleet.world.jobs_on_node("train-000", cluster_id=cid)
        await fleet.inject("train-000", "xid-79", gpu_index=3)

        repair = await fleet.until(lambda: fleet.proposed_for("train-000"), what="proposal")
        assert repair["action"] == "reboot" and repair["signature_id"] == "xid-79"
        assert "xid-79" in repair["rule"] and repair["reason"]
        (finding,) = repair["evidence"]["findings"]
        assert finding["signature_id"] == "xid-79" and "Xid" in finding["evidence"]
        assert repair["evidence"]["topology"]["leaf_switch"]
        shown = await fleet.repair(repair["id"])
        assert [(j["job_id"], j["user"], j["account"]) for j in shown["jobs"]] == [
            (job.job_id, "alice", "llm-pretrain")
        ]

        async with await member_client(fleet.app) as member:
            refused = await member.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
            assert refused.status_code == 403, refused.text
            assert "repair.approve" in error_of(refused)["message"]
            seen = await member.get(f"/api/v1/repairs/{repair['id']}")
            assert seen.status_code == 200  # members see the queue
        assert await fleet.status_of(repair["id"]) == "proposed"

        approved = await fleet.app.client.post(
            f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "bad GPU"}
        )
        assert approved.status_code == 200, approved.text
        assert approved.json()["status"] == "approved"

        await fleet.until(lambda: _is(fleet, repair["id"], "draining"), ticks=5, what="draining")
        status = fleet.world.node_status("train-000", cluster_id=cid)
        assert status.drained and status.reason == f"gpufleet: {repair['id']} xid-79"
        assert (await fleet.node("train-000"))["state"] == "draining"
        # The job keeps running: the drain waits for it.
        for _ in range(5):
            await fleet.tick(30)
            assert await fleet.status_of(repair["id"]) == "draining"
        detail = (await fleet.repair(repair["id"]))["detail"]
        assert job.job_id in detail and "alice" in detail
        boots_before = fleet.world.get_instance(fleet.instance_id("train-000"))
        assert boots_before is not None

        await fleet.until(lambda: _is(fleet, repair["id"], "succeeded"), ticks=60,
                          seconds=5, what=f"success of {repair['id']}")  # fmt: skip
        node = await fleet.node("train-000")
        assert node["state"] == "in_service" and node["health"] == "healthy"
        status = fleet.world.node_status("train-000", cluster_id=cid)
        assert not status.drained, status
        after = fleet.world.get_instance(fleet.instance_id("train-000"))
        assert after is not None and after.boot_id == boots_before.boot_id + 1  # one reboot
        open_findings = (
            await fleet.app.client.get(
                "/api/v1/findings", params={"node": node["id"], "open": "true"}
            )
        ).json()["items"]
        assert open_findings == []
        assert await _timeline(fleet, repair["id"]) == [
            "approved", "cordoning", "draining", "acting", "verifying", "succeeded",
        ]  # fmt: skip
        (done,) = [
            j for j in fleet.world.accounting_since(start, cluster_id=cid)
            if j.job_id == job.job_id
        ]  # fmt: skip
        # It ran to its own end (COMPLETED, or FAILED by itself: the sim fails ~5% of
        # jobs on their own), after its full duration: the drain waited for it.
        assert done.state in ("COMPLETED", "FAILED") and done.exit_code is not None
        assert done.ended_at is not None and done.started_at is not None
        assert (done.ended_at - done.started_at).total_seconds() >= 300
        _no_job_killed(fleet, start)
        async with fleet.app.ctx.db.session() as session:
            audit = list(
                await session.scalars(
                    select(AuditLogRow).where(
                        AuditLogRow.object_id == repair["id"], AuditLogRow.result == "ok"
                    )
                )
            )
        assert {a.detail["to"] for a in audit} >= {"approved", "succeeded"}
        assert any(a.actor.startswith("user:") and a.detail["to"] == "approved" for a in audit)


async def _is(fleet: SimFleet, repair_id: str, status: str) -> bool:
    return await fleet.status_of(repair_id) == status


async def test_dismissal_is_recorded_and_needs_a_reason(database_url: str, tmp_path: Path) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        await fleet.inject("train-001", "xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for("train-001"), what="proposal")
        url = f"/api/v1/repairs/{repair['id']}/dismiss"
        missing = await fleet.app.client.post(url, json={})
        assert missing.status_code == 422 and error_of(missing)["field"] == "reason"
        dismissed = await fleet.app.client.post(url, json={"reason": "known flaky riser"})
        assert dismissed.status_code == 200, dismissed.text
        body = dismissed.json()
        assert body["status"] == "rejected" and body["decision_reason"] == "known flaky riser"
        again = await fleet.app.client.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
        assert again.status_code == 409
        # The finding is still open, but the same findings are not recommended again ...
        for _ in range(5):
            await fleet.tick(60)
            assert await fleet.proposed_for("train-001") is None
        assert (await fleet.node("train-001"))["state"] == "in_service"
        # ... until the fault recurs.
        await fleet.inject("train-001", "xid-79")
        await fleet.until(lambda: fleet.proposed_for("train-001"), ticks=5, what="recurrence")


async def test_a_recommendation_whose_findings_clear_resolves_after_the_ttl(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2, policy={"ttl_s": 300}) as fleet:
        await fleet.inject("train-000", "xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for("train-000"), what="proposal")
        cleared = await fleet.app.client.delete(
            f"/api/v1/nodes/{fleet.nodes['train-000']['id']}/faults/xid-79"
        )
        assert cleared.status_code == 200, cleared.text
        await fleet.tick(60)
        await fleet.tick(60)
        assert await fleet.status_of(repair["id"]) == "proposed"  # TTL not up yet
        await fleet.until(lambda: _is(fleet, repair["id"], "resolved"), ticks=10, seconds=60,
                          what="ttl resolve")  # fmt: skip
        assert (await fleet.repair(repair["id"]))["decided_by"] is None


async def test_a_worse_finding_escalates_the_pending_recommendation_in_place(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        await fleet.inject("train-000", "xid-95", gpu_index=1)  # reset_gpu
        first = await fleet.until(lambda: fleet.proposed_for("train-000"), what="proposal")
        assert first["action"] == "reset_gpu" and first["gpu_index"] == 1
        await fleet.inject("train-000", "xid-79", gpu_index=2)  # reboot
        await fleet.until(
            lambda: _action_is(fleet, first["id"], "reboot"), ticks=10, what="escalation"
        )
        repair = await fleet.repair(first["id"])
        assert repair["escalated_from"] == "reset_gpu" and repair["status"] == "proposed"
        assert len(await fleet.repairs(node=fleet.nodes["train-000"]["id"])) == 1


async def _action_is(fleet: SimFleet, repair_id: str, action: str) -> bool:
    return (await fleet.repair(repair_id))["action"] == action


async def test_no_job_is_killed_and_an_unreadable_scheduler_means_wait(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        start = fleet.clock.now()
        cid = fleet.cluster["id"]
        fleet.world.submit_job(cluster_id=cid, node_count=2, gpus_per_node=8, duration_s=600)
        await fleet.tick()
        await fleet.inject("train-000", "xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for("train-000"), what="proposal")
        approved = await fleet.app.client.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
        assert approved.status_code == 200
        await fleet.until(lambda: _is(fleet, repair["id"], "draining"), ticks=5, what="drain")
        fleet.world.set_scheduler_available(False)
        for _ in range(4):
            await fleet.tick(300)  # past the job's end: but we cannot see that it ended
            assert await fleet.status_of(repair["id"]) == "draining"
        assert "unreadable" in (await fleet.repair(repair["id"]))["detail"]
        fleet.world.set_scheduler_available(True)
        await fleet.until(lambda: _is(fleet, repair["id"], "succeeded"), ticks=40,
                          seconds=5, what="success")  # fmt: skip
        _no_job_killed(fleet, start)


async def test_drain_timeout_waits_by_default_and_a_force_kills_only_when_asked(
    database_url: str, tmp_path: Path
) -> None:
    policy = {"drain_timeout_s": 120}
    async with sim_fleet(database_url, tmp_path, size=2, policy=policy) as fleet:
        start = fleet.clock.now()
        cid = fleet.cluster["id"]
        job = fleet.world.submit_job(cluster_id=cid, node_count=2, gpus_per_node=8, duration_s=7200)
        await fleet.tick()
        await fleet.inject("train-001", "xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for("train-001"), what="proposal")
        await fleet.app.client.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
        for _ in range(6):
            await fleet.tick(60)
        shown = await fleet.repair(repair["id"])
        assert shown["status"] == "draining" and "drain timeout" in shown["detail"]
        _no_job_killed(fleet, start)
        forced = await fleet.app.client.post(
            f"/api/v1/repairs/{repair['id']}/force", json={"reason": "job is hung"}
        )
        assert forced.status_code == 200, forced.text
        await fleet.until(lambda: _is(fleet, repair["id"], "succeeded"), ticks=40,
                          seconds=5, what="success")  # fmt: skip
        (killed,) = [
            j for j in fleet.world.accounting_since(start, cluster_id=cid)
            if j.job_id == job.job_id
        ]  # fmt: skip
        assert killed.state in KILLED  # killed, and only because an admin forced it


async def test_drain_timeout_requeues_the_jobs_when_the_policy_says_so(
    database_url: str, tmp_path: Path
) -> None:
    policy = {"drain_timeout_s": 120, "drain_timeout_action": "requeue"}
    async with sim_fleet(database_url, tmp_path, size=2, policy=policy) as fleet:
        start = fleet.clock.now()
        cid = fleet.cluster["id"]
        job = fleet.world.submit_job(cluster_id=cid, node_count=1, gpus_per_node=8, duration_s=7200)
        await fleet.tick()
        (running,) = fleet.world.running_jobs(cluster_id=cid)
        (name,) = running.nodes
        await fleet.inject(name, "xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for(name), what="proposal")
        await fleet.app.client.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
        await fleet.until(lambda: _is(fleet, repair["id"], "succeeded"), ticks=40,
                          seconds=10, what="success after the requeue")  # fmt: skip
        detail_events = [
            e["message"]
            for e in (
                await fleet.app.client.get(
                    "/api/v1/events", params={"kind": "repair.step", "limit": 100}
                )
            ).json()["items"]
        ]
        assert any("requeued" in m and job.job_id in m for m in detail_events), detail_events
        ended = fleet.world.accounting_since(start, cluster_id=cid)
        assert [j.state for j in ended if j.job_id == job.job_id] == ["REQUEUED"]
        assert not [j for j in ended if j.state == "NODE_FAIL"]
        # The job runs again, elsewhere, under the same id (as Slurm requeues).
        again = [j for j in fleet.world.running_jobs(cluster_id=cid) if j.job_id == job.job_id]
        assert again and name not in again[0].nodes
