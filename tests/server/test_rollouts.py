"""Stack rollouts on the sim: a cluster migrated to a new stack inside its maintenance
window, at most ``max_unavailable`` nodes out at once, every node re-accepted, no job
killed; a node failing re-acceptance pauses the rollout at its budget; abort leaves every
node in service; bad requests are refused whole."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from acceptancehelpers import QUICK_SUITE, bringup
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow, JobRow
from gpufleet.testing.fleet import SimFleet

pytestmark = pytest.mark.long

STEP_S = 30.0  # fake seconds a tick
LONG_STEP_S = 300.0  # a tick while nothing is meant to move
OLD = {"driver": "570.133.20", "cuda": "12.8", "nccl": "2.26.2", "os_image": "gpu-2026.09"}
NEW = {"driver": "580.95.05", "cuda": "12.9", "nccl": "2.27.3", "os_image": "gpu-2026.12"}
TZ = "Europe/Berlin"


async def _cluster(fleet: SimFleet, size: int) -> tuple[str, dict[str, dict[str, Any]]]:
    for name, spec in (("gpu-2026.09", OLD), ("gpu-2026.12", NEW)):
        made = await fleet.app.client.post(
            "/api/v1/stacks", json={"name": name, **spec, "latest": name == "gpu-2026.09"}
        )
        assert made.status_code == 201, made.text
    response = await fleet.app.client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "train", "size": size, "gpus_per_node": 8,
              "acceptance_suite": QUICK_SUITE},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    assert response.json()["stack"] == "gpu-2026.09"
    await fleet.until(lambda: fleet.status_is(cid, "ready"), ticks=400, what="cluster ready")
    return cid, await fleet.nodes_of(cid)


def _daily_at(now: dt.datetime, *, minutes_from_now: int) -> str:
    local = (now + dt.timedelta(minutes=minutes_from_now)).astimezone(ZoneInfo(TZ))
    return f"daily {local:%H:%M}/2h"


async def _rollout(fleet: SimFleet, rollout_id: str) -> dict[str, Any]:
    body: dict[str, Any] = await fleet.get(f"/api/v1/rollouts/{rollout_id}")
    return body


# The whole 16-node migration on PostgreSQL (the production store, and the row locks that
# matter); the smaller tests below run on both stores.
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_sixteen_nodes_move_in_their_window_two_at_a_time_and_no_job_dies(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _cluster(fleet, 16)
        # Jobs on every node, 40 to 70 minutes each: the first drains wait them out.
        for i in range(16):
            fleet.world.submit_job(
                cluster_id=cid, node_count=1, gpus_per_node=8, duration_s=2400 + 120 * i
            )
        await fleet.tick()
        assert len(fleet.world.running_jobs(cluster_id=cid)) == 16

        window = _daily_at(fleet.clock.now(), minutes_from_now=30)
        made = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/rollouts",
            json={"to_stack": "gpu-2026.12", "window": window, "tz": TZ,
                  "max_unavailable": "2", "failure_budget": 2, "reason": "driver 580"},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        rollout = made.json()
        rid = rollout["id"]
        assert (rollout["status"], rollout["open_now"], rollout["counts"]) == (
            "scheduled", False, {"pending": 16}
        )  # fmt: skip
        opens = dt.datetime.fromisoformat(rollout["next_opening"]["start"])
        closes = dt.datetime.fromisoformat(rollout["next_opening"]["end"])
        assert dt.timedelta(minutes=29) <= opens - fleet.clock.now() <= dt.timedelta(minutes=31)

        # Nothing moves before the window opens (five minutes a tick, then the usual).
        for _ in range(int(20 * 60 / LONG_STEP_S)):
            await fleet.tick(LONG_STEP_S)
        for _ in range(int(5 * 60 / STEP_S)):
            await fleet.tick()
        assert not [r for r in await fleet.repairs(cluster=cid) if r["source"] == "rollout"]
        assert (await _rollout(fleet, rid))["status"] == "scheduled"

        most_out = 0

        async def done() -> dict[str, Any] | None:
            nonlocal most_out
            states = [n["state"] for n in (await fleet.nodes_of(cid)).values()]
            most_out = max(most_out, sum(1 for s in states if s != "in_service"))
            body = await _rollout(fleet, rid)
            return body if body["status"] in ("succeeded", "paused", "aborted") else None

        ended = await fleet.until(done, ticks=1200, what="rollout ended")
        assert ended["status"] == "succeeded", (ended, await fleet.describe())
        assert ended["counts"] == {"done": 16} and ended["failures"] == 0
        assert most_out <= 2, most_out

        # Every node runs the new stack, passed re-acceptance, and is in service.
        after = await fleet.nodes_of(cid)
        for name, node in after.items():
            shown = await fleet.node(node["id"])
            assert shown["state"] == "in_service", name
            assert shown["software"]["driver"] == NEW["driver"], (name, shown["software"])
            assert shown["stack_skew"] == [], (name, shown["stack_skew"])
        cluster = await fleet.get(f"/api/v1/clusters/{cid}")
        assert cluster["stack"] == "gpu-2026.12"
        runs = [r for r in await fleet.acceptance_runs(cid) if r["trigger"] == "repair"]
        passed = {n for r in runs if r["status"] == "passed" for n in r["node_ids"]}
        assert passed == {n["id"] for n in after.values()}

        # Each node's reinstall happened inside the window, exactly once.
        repairs = [
            r for r in await fleet.repairs(cluster=cid, all="true") if r["source"] == "rollout"
        ]
        assert sorted(r["node_id"] for r in repairs) == sorted(n["id"] for n in after.values())
        acting = [
            e for e in await fleet.events(cid, "repair.status") if e["data"]["to"] == "acting"
        ]
        assert len(acting) == 16
        for event in acting:
            at = dt.datetime.fromisoformat(event["ts"])
            assert opens <= at < closes, (event["message"], at, opens, closes)

        # No job was killed or requeued: accounting saw every one run to its end.
        await fleet.tick()
        async with fleet.app.ctx.db.session() as session:
            jobs = list(await session.scalars(select(JobRow).where(JobRow.cluster_id == cid)))
            audited = list(
                await session.scalars(
                    select(AuditLogRow.action).where(AuditLogRow.action.like("rollout.%"))
                )
            )
        # (FAILED is a job's own non-zero exit, which the sim draws for a share of jobs;
        # a killed one is NODE_FAIL, REQUEUED or CANCELLED, and cut short.)
        ran = [(j.scheduler_job_id, j.state, j.started_at, j.ended_at) for j in jobs]
        assert len(jobs) == 16 and {j.state for j in jobs} <= {"COMPLETED", "FAILED"}, ran
        for job in jobs:
            assert job.started_at is not None and job.ended_at is not None
            assert (job.ended_at - job.started_at).total_seconds() >= 2400, ran
        assert audited.count("rollout.create") == 1 and "rollout.status" in audited
        assert audited.count("rollout.node") >= 32  # migrating and done, per node
        del nodes


async def test_a_node_failing_reacceptance_pauses_the_rollout_and_abort_returns_the_rest(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _cluster(fleet, 4)
        now = fleet.clock.now()
        made = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/rollouts",
            json={"to_stack": "gpu-2026.12", "window": _daily_at(now, minutes_from_now=-1),
                  "tz": TZ, "max_unavailable": "25%", "failure_budget": 1},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        rid = made.json()["id"]
        first = nodes["train-000"]

        async def reaccepting() -> bool:
            return bool((await fleet.node(first["id"]))["state"] == "acceptance")

        await fleet.until(reaccepting, ticks=200, what="train-000 in re-acceptance")
        assert (await _rollout(fleet, rid))["status"] == "running"
        # Its memory goes bad before its checks run: re-acceptance fails.
        await fleet.inject(first["id"], "xid-48", gpu_index=5, sticky=True)

        async def paused() -> dict[str, Any] | None:
            body = await _rollout(fleet, rid)
            return body if body["status"] == "paused" else None

        body = await fleet.until(paused, ticks=300, what="rollout paused")
        assert body["failures"] == 1 and "failure budget" in body["detail"], body
        by_name = {n["node_name"]: n for n in body["nodes"]}
        assert by_name["train-000"]["status"] == "failed"
        assert all(by_name[f"train-00{i}"]["status"] == "pending" for i in (1, 2, 3)), by_name
        for _ in range(10):  # paused: nothing else starts
            await fleet.tick()
        assert (await _rollout(fleet, rid))["counts"] == {"failed": 1, "pending": 3}

        refused = await fleet.app.client.post(f"/api/v1/rollouts/{rid}/resume", json={})
        assert refused.status_code == 409 and "failure budget" in refused.text
        aborted = await fleet.app.client.post(
            f"/api/v1/rollouts/{rid}/abort", json={"reason": "bad batch"}
        )
        assert aborted.status_code == 200, aborted.text

        async def over() -> dict[str, Any] | None:
            body = await _rollout(fleet, rid)
            return body if body["status"] == "aborted" else None

        await fleet.until(over, ticks=50, what="rollout aborted")
        states = {n: v["state"] for n, v in (await fleet.nodes_of(cid)).items()}
        # The failed node stays cordoned for a person (as any failed repair leaves it);
        # every node the rollout did not touch is in service on its old stack.
        assert {states[f"train-00{i}"] for i in (1, 2, 3)} == {"in_service"}, states
        assert states["train-000"] == "cordoned"
        for i in (1, 2, 3):
            shown = await fleet.node(nodes[f"train-00{i}"]["id"])
            assert shown["software"]["driver"] == OLD["driver"]
        assert (await fleet.get(f"/api/v1/clusters/{cid}"))["stack"] == "gpu-2026.09"


async def test_bad_rollout_requests_are_refused_whole(database_url: str, tmp_path: Path) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, _nodes = await _cluster(fleet, 2)
        url = f"/api/v1/clusters/{cid}/rollouts"
        good = {"to_stack": "gpu-2026.12", "window": "sat 02:00/4h", "tz": TZ}
        for bad, field in (
            ({"window": "someday"}, "window"),
            ({"window": "sat 02:00/4h", "tz": "Mars/Olympus"}, "Mars/Olympus"),
            ({"max_unavailable": "0"}, "max_unavailable"),
            ({"max_unavailable": "150%"}, "max_unavailable"),
            ({"window": "2020-01-01T02:00/2h"}, "never opens again"),
        ):
            response = await fleet.app.client.post(url, json={**good, **bad})
            assert response.status_code in (409, 422), (bad, response.text)
            assert field in response.text, (bad, response.text)
        unknown = await fleet.app.client.post(url, json={**good, "to_stack": "nope"})
        assert unknown.status_code == 404, unknown.text
        same = await fleet.app.client.post(url, json={**good, "to_stack": "gpu-2026.09"})
        assert same.status_code == 409 and "already" in same.text
        assert await fleet.get(url) == []
        first = await fleet.app.client.post(url, json=good)
        assert first.status_code == 201, first.text
        second = await fleet.app.client.post(url, json=good)
        assert second.status_code == 409 and first.json()["id"] in second.text
        paused = await fleet.app.client.post(
            f"/api/v1/rollouts/{first.json()['id']}/pause", json={"reason": "holiday"}
        )
        assert paused.status_code == 200 and paused.json()["status"] == "paused"
        resumed = await fleet.app.client.post(f"/api/v1/rollouts/{first.json()['id']}/resume",
                                              json={})  # fmt: skip
        assert resumed.status_code == 200 and resumed.json()["status"] == "scheduled"
        missing = await fleet.app.client.get("/api/v1/rollouts/0000")
        assert missing.status_code == 404


@pytest.mark.parametrize("policy", ["wait", "release"])
async def test_a_drain_unfinished_at_the_windows_close_waits_or_is_released(
    database_url: str, tmp_path: Path, policy: str
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _cluster(fleet, 2)
        first = nodes["train-000"]
        # A 3-hour job on both nodes: train-000's drain outlasts the 1-hour window.
        fleet.world.submit_job(cluster_id=cid, node_count=2, gpus_per_node=8, duration_s=3 * 3600)
        await fleet.tick()
        opened = (fleet.clock.now() - dt.timedelta(minutes=1)).astimezone(ZoneInfo(TZ))
        made = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/rollouts",
            json={"to_stack": "gpu-2026.12", "window": f"daily {opened:%H:%M}/1h", "tz": TZ,
                  "on_window_close": policy},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        rid = made.json()["id"]
        assert made.json()["on_window_close"] == policy

        async def draining() -> bool:
            return bool((await fleet.node(first["id"]))["state"] == "draining")

        await fleet.until(draining, ticks=20, what="train-000 draining")
        # The drain waits on the job through the window: five minutes a tick (every agent
        # reports, every loop runs each time), then the usual ticks across its close.
        for _ in range(int(50 * 60 / LONG_STEP_S)):
            await fleet.tick(LONG_STEP_S)
        for _ in range(int(15 * 60 / STEP_S)):  # past the window's end
            await fleet.tick()
        body = await _rollout(fleet, rid)
        by_name = {n["node_name"]: n for n in body["nodes"]}
        shown = await fleet.node(first["id"])
        assert body["status"] == "scheduled" and body["open_now"] is False, body
        assert fleet.world.jobs_on_node("train-000", cluster_id=cid)  # never killed
        (repair,) = [r for r in await fleet.repairs(cluster=cid, all="true")
                     if r["source"] == "rollout"]  # fmt: skip
        if policy == "wait":
            assert shown["state"] == "draining", shown
            assert by_name["train-000"]["status"] == "migrating"
            assert repair["status"] == "draining"
        else:
            assert shown["state"] == "in_service", shown
            assert by_name["train-000"]["status"] == "pending"
            assert by_name["train-000"]["repair_id"] is None
            assert repair["status"] == "released" and "window" in repair["detail"]
            assert shown["stack_skew"] == []  # its own stack is the old one again
            status = fleet.world.node_status("train-000", cluster_id=cid)
            assert not status.drained, status  # the hold is undone in the scheduler
        assert by_name["train-001"]["status"] == "pending"  # nothing else started


async def test_an_abort_mid_rollout_leaves_every_node_in_service(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _cluster(fleet, 3)
        now = fleet.clock.now()
        made = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/rollouts",
            json={"to_stack": "gpu-2026.12", "window": _daily_at(now, minutes_from_now=-1),
                  "tz": TZ, "max_unavailable": "1"},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        rid = made.json()["id"]

        async def under_way() -> bool:
            return bool((await fleet.node(nodes["train-000"]["id"]))["state"] != "in_service")

        await fleet.until(under_way, ticks=20, what="train-000 out of service")
        aborted = await fleet.app.client.post(f"/api/v1/rollouts/{rid}/abort", json={})
        assert aborted.status_code == 200 and aborted.json()["status"] == "aborting"

        async def over() -> dict[str, Any] | None:
            body = await _rollout(fleet, rid)
            return body if body["status"] == "aborted" else None

        body = await fleet.until(over, ticks=200, what="rollout aborted")
        # The node under way finished its migration; the others were never touched.
        assert body["counts"] == {"done": 1, "pending": 2}, body
        after = await fleet.nodes_of(cid)
        assert {n["state"] for n in after.values()} == {"in_service"}, after
        drivers = {n: (await fleet.node(v["id"]))["software"]["driver"] for n, v in after.items()}
        assert drivers == {"train-000": NEW["driver"], "train-001": OLD["driver"],
                           "train-002": OLD["driver"]}  # fmt: skip
        assert (await fleet.get(f"/api/v1/clusters/{cid}"))["stack"] == "gpu-2026.09"


async def test_a_node_rolled_back_while_paused_returns_to_its_old_stack(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid, nodes = await _cluster(fleet, 2)
        made = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/rollouts",
            json={"to_stack": "gpu-2026.12",
                  "window": _daily_at(fleet.clock.now(), minutes_from_now=-1), "tz": TZ},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        rid = made.json()["id"]
        first = nodes["train-000"]["id"]

        async def status_of(name: str, *wanted: str) -> dict[str, Any] | None:
            body = await _rollout(fleet, rid)
            node = next(n for n in body["nodes"] if n["node_name"] == name)
            return body if node["status"] in wanted else None

        await fleet.until(lambda: status_of("train-000", "done"), ticks=200, what="000 done")
        paused = await fleet.app.client.post(f"/api/v1/rollouts/{rid}/pause", json={})
        assert paused.status_code == 200, paused.text
        back = await fleet.app.client.post(
            f"/api/v1/rollouts/{rid}/nodes/{first}/rollback", json={"reason": "NCCL hangs"}
        )
        assert back.status_code == 200, back.text
        body = await fleet.until(
            lambda: status_of("train-000", "rolled_back"), ticks=200, what="000 rolled back"
        )
        shown = await fleet.node(first)
        assert shown["state"] == "in_service" and shown["software"]["driver"] == OLD["driver"]
        assert shown["stack_skew"] == []
        # train-001 may have been under way at the pause (it then finished); else it waits.
        if body["status"] == "paused":
            resumed = await fleet.app.client.post(f"/api/v1/rollouts/{rid}/resume", json={})
            assert resumed.status_code == 200, resumed.text

        async def ended() -> dict[str, Any] | None:
            body = await _rollout(fleet, rid)
            return body if body["status"] == "succeeded" else None

        body = await fleet.until(ended, ticks=200, what="rollout succeeded")
        assert body["counts"] == {"rolled_back": 1, "done": 1}
        assert (await fleet.get(f"/api/v1/clusters/{cid}"))["stack"] == "gpu-2026.12"
        for node_id, driver in ((first, OLD["driver"]), (nodes["train-001"]["id"], NEW["driver"])):
            shown = await fleet.node(node_id)
            assert shown["software"]["driver"] == driver and shown["stack_skew"] == [], shown
