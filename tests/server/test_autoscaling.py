"""Autoscaling on the sim fleet, through the real app and its loops: the settings API, and
scale-down that takes only idle nodes (never one running a job, under repair or in
acceptance), each step an event and the action's own lifecycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acceptancehelpers import QUICK_SUITE, STEP_S, bringup

from gpufleet.core.autoscaling import AutoscaleSource
from gpufleet.core.errors import Conflict
from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.services.autoscale import start_scale_down
from gpufleet.server.workers.autoscaler import AutoscalerLoop
from gpufleet.testing.fleet import SimFleet, sim_fleet


async def _set(fleet: SimFleet, **body: Any) -> dict[str, Any]:
    response = await fleet.app.client.put(
        f"/api/v1/clusters/{fleet.cluster_id}/autoscale", json=body
    )
    assert response.status_code == 200, response.text
    settings: dict[str, Any] = response.json()
    return settings


async def _actions(fleet: SimFleet) -> list[dict[str, Any]]:
    listed = await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}/autoscale/actions")
    items: list[dict[str, Any]] = listed["items"]
    return items


async def _states(fleet: SimFleet) -> dict[str, str]:
    """Every node's state, removed ones too."""
    live = await fleet.get("/api/v1/nodes", cluster=fleet.cluster_id)
    gone = await fleet.get("/api/v1/nodes", cluster=fleet.cluster_id, state="removed")
    return {n["name"]: n["state"] for n in [*live["items"], *gone["items"]]}


async def test_settings_are_shown_changed_and_checked(database_url: str, tmp_path: Path) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        path = f"/api/v1/clusters/{fleet.cluster_id}/autoscale"
        shown = await fleet.get(path)
        assert shown["mode"] == "off" and shown["min_nodes"] is None
        assert shown["scale_down_after_s"] == 1800.0

        client = fleet.app.client
        bad = await client.put(path, json={"mode": "gpufleet"})
        assert bad.status_code == 422 and "min_nodes" in bad.text
        bad = await client.put(path, json={"mode": "gpufleet", "min_nodes": 5, "max_nodes": 4})
        assert bad.status_code == 422 and "must not exceed" in bad.text
        bad = await client.put(path, json={"mode": "slurm", "min_nodes": 1, "max_nodes": 4})
        assert bad.status_code == 422 and "slurm clusters" in bad.text
        bad = await client.put(path, json={"mode": "gpufleet", "max_step": 0})
        assert bad.status_code == 422
        bad = await client.put(path, json={"scale_up_after_s": -1})
        assert bad.status_code == 422
        bad = await client.put(path, json={})
        assert bad.status_code == 422 and "nothing to change" in bad.text
        assert (await fleet.get(path))["mode"] == "off"  # nothing half-written

        after = await _set(
            fleet, mode="gpufleet", min_nodes=1, max_nodes=4, scale_up_after_s=60,
            reason="pilot",
        )  # fmt: skip
        assert (after["mode"], after["min_nodes"], after["max_nodes"]) == ("gpufleet", 1, 4)
        assert after["scale_up_after_s"] == 60.0 and after["max_step"] == 8
        cluster = await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}")
        assert (cluster["autoscale_min"], cluster["autoscale_max"]) == (1, 4)
        (event,) = await fleet.events(fleet.cluster_id, "autoscale.updated")
        assert "mode off → gpufleet" in event["message"] and "pilot" in event["message"]
        assert (await _actions(fleet)) == []


async def test_idle_nodes_go_after_the_idle_time_never_under_the_minimum(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=3, step_s=10.0) as fleet:
        await _set(
            fleet, mode="gpufleet", min_nodes=1, max_nodes=4, scale_down_after_s=60,
            down_cooldown_s=0,
        )  # fmt: skip

        async def removed() -> list[str]:
            states = await _states(fleet)
            return sorted(n for n, s in states.items() if s == "removed")

        gone = await fleet.until(removed, ticks=40, what="two idle nodes removed")
        assert len(gone) == 2
        (action,) = await _actions(fleet)
        assert (action["kind"], action["source"]) == ("scale_down", "policy")
        await fleet.until(lambda: _done(fleet, action["id"]), ticks=10, what="the step down ends")
        (action,) = await _actions(fleet)
        assert action["status"] == "succeeded" and sorted(action["nodes"]) == gone
        assert any("idle" in r for r in action["reasons"])
        cluster = await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}")
        assert cluster["size"] == 1
        # Their machines went back to the provider.
        running = {i.node_name for i in fleet.world.list_instances(cluster_id=fleet.cluster_id)}
        assert not set(gone) & running
        # The story: the decision, each node held then removed, the action's end.
        events = await fleet.get("/api/v1/events", cluster=fleet.cluster_id, limit=1000)
        kinds = [e["kind"] for e in events["items"]]
        assert "autoscale.decision" in kinds and "autoscale.step" in kinds
        assert "autoscale.status" in kinds
        # Never under the minimum: the last node stays, however long it idles.
        for _ in range(10):
            await fleet.tick()
        assert len(await _actions(fleet)) == 1
        assert sorted(s for s in (await _states(fleet)).values()) == [
            "in_service", "removed", "removed",
        ]  # fmt: skip


async def _done(fleet: SimFleet, action_id: str) -> bool:
    return any(a["id"] == action_id and a["status"] != "acting" for a in await _actions(fleet))


async def test_a_busy_node_and_a_node_under_repair_are_never_removed(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=3, step_s=10.0) as fleet:
        busy = fleet.world.submit_job(
            cluster_id=fleet.cluster_id, node_count=1, gpus_per_node=8, duration_s=36_000
        )
        await fleet.tick()
        running = fleet.world.running_jobs(cluster_id=fleet.cluster_id)
        (job,) = [j for j in running if j.job_id == busy.job_id]
        (busy_node,) = job.nodes
        broken = next(n for n in fleet.nodes if n != busy_node)
        await fleet.inject(broken, "xid-79")
        await fleet.until(lambda: fleet.proposed_for(broken), what="a repair proposed")

        await _set(
            fleet, mode="gpufleet", min_nodes=0, max_nodes=4, scale_down_after_s=60,
            down_cooldown_s=0,
        )  # fmt: skip
        for _ in range(20):
            await fleet.tick()
        states = await _states(fleet)
        idle = next(n for n in fleet.nodes if n not in (busy_node, broken))
        assert states[idle] == "removed"
        assert states[busy_node] == "in_service" and states[broken] != "removed"
        assert all(a["nodes"] == [idle] for a in await _actions(fleet))


async def test_a_node_that_takes_a_job_before_it_goes_stays(
    database_url: str, tmp_path: Path
) -> None:
    """Chosen idle, then a job lands before the hold: the autoscaler drains it, reads its
    jobs once more, releases it and keeps it; nothing is removed and the size comes back."""
    async with sim_fleet(database_url, tmp_path, size=2, step_s=10.0) as fleet:
        await _set(fleet, min_nodes=0, max_nodes=4)
        chosen = sorted(fleet.nodes)[0]
        db = fleet.app.ctx.db
        async with db.transaction() as session:
            cluster = await session.get(ClusterRow, fleet.cluster_id, with_for_update=True)
            node = await session.get(NodeRow, fleet.node_id(chosen))
            assert cluster is not None and node is not None
            await start_scale_down(
                session, cluster=cluster, nodes=[node], busy={node.id: False},
                source=AutoscaleSource.ADMIN, reasons=["test"], actor="test", now=fleet.clock.now(),
            )  # fmt: skip
        assert (await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}"))["size"] == 1
        fleet.world.submit_job(
            cluster_id=fleet.cluster_id, node_count=2, gpus_per_node=8, duration_s=36_000
        )
        fleet.world.advance()  # the job starts on both nodes before the autoscaler's pass
        loop = fleet.loop(AutoscalerLoop)
        for _ in range(3):
            await loop.run_once()
        (action,) = await _actions(fleet)
        assert action["status"] == "cancelled", action
        assert "kept" in action["detail"]
        assert (await _states(fleet))[chosen] == "in_service"
        assert (await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}"))["size"] == 2
        (job,) = fleet.world.running_jobs(cluster_id=fleet.cluster_id)
        assert job.state == "RUNNING" and chosen in job.nodes  # untouched
        steps = await fleet.events(fleet.cluster_id, "autoscale.step")
        assert any("took job" in e["message"] for e in steps)


async def test_pending_gpu_work_brings_nodes_that_pass_acceptance_and_run_it(
    database_url: str, tmp_path: Path
) -> None:
    """A two-node job waits on a one-node cluster: after the threshold the policy adds a
    node, which boots, runs the startup scripts, passes the acceptance suite and only
    then takes the job; once the job ends and the node idles past its time, it goes."""
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        created = await fleet.app.client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "inf", "size": 1, "acceptance_suite": QUICK_SUITE},
        )
        assert created.status_code == 201, created.text
        fleet.cluster = created.json()
        cid = fleet.cluster_id
        await fleet.until(
            lambda: fleet.status_is(cid, "ready"), ticks=200, what="the cluster ready"
        )
        fleet.world.set_synthetic_load(cid, on=False)
        await _set(
            fleet, mode="gpufleet", min_nodes=1, max_nodes=3, scale_up_after_s=60,
            up_cooldown_s=0, scale_down_after_s=120, down_cooldown_s=0,
        )  # fmt: skip
        job = fleet.world.submit_job(cluster_id=cid, node_count=2, gpus_per_node=8, duration_s=1800)

        async def added() -> list[dict[str, Any]]:
            return [a for a in await _actions(fleet) if a["kind"] == "scale_up"]

        (up,) = await fleet.until(added, ticks=20, what="a step up")
        assert up["count"] == 1 and up["source"] == "policy"
        assert f"{job.job_id}: 16 GPUs" in up["reasons"][0]
        (new,) = up["nodes"]
        # The new node is tested before it takes work: in acceptance, the job still waits.
        await fleet.until(
            lambda: _in_state(fleet, new, "acceptance"), ticks=40, what="the node in acceptance"
        )
        assert fleet.world.running_jobs(cluster_id=cid) == []
        await fleet.until(lambda: _done(fleet, up["id"]), ticks=200, what="the node in service")
        (up,) = await added()
        assert up["status"] == "succeeded"
        runs = await fleet.acceptance_runs(cid)
        assert any(r["status"] == "passed" and len(r["node_ids"]) == 1 for r in runs), runs

        async def running() -> list[Any]:
            return [j for j in fleet.world.running_jobs(cluster_id=cid) if j.job_id == job.job_id]

        (started,) = await fleet.until(running, ticks=10, what="the job running")
        assert new in started.nodes

        # The job ends; after 2 min idle, the nodes above the minimum of one may go.
        async def removed() -> list[dict[str, Any]]:
            return [a for a in await _actions(fleet) if a["kind"] == "scale_down"]

        (down,) = await fleet.until(removed, ticks=300, what="a step down")
        assert len(down["nodes"]) == 1  # never under the minimum
        await fleet.until(lambda: _done(fleet, down["id"]), ticks=20, what="the step down")
        cluster = await fleet.get(f"/api/v1/clusters/{cid}")
        assert cluster["size"] == 1 and cluster["status"] == "ready"


async def _in_state(fleet: SimFleet, name: str, state: str) -> bool:
    return (await _states(fleet)).get(name) == state


async def test_a_node_in_an_acceptance_run_is_never_removed(
    database_url: str, tmp_path: Path
) -> None:
    """An admin's acceptance run on an idle node in service (DCGM level 3: 15 minutes):
    the other idle node goes, the one under test stays until its run is over."""
    async with sim_fleet(database_url, tmp_path, size=3, step_s=10.0) as fleet:
        tested = sorted(fleet.nodes)[0]
        run = await fleet.app.client.post(
            f"/api/v1/clusters/{fleet.cluster_id}/acceptance",
            json={"nodes": [tested], "reason": "burn-in"},
        )
        assert run.status_code == 202, run.text
        await _set(
            fleet, mode="gpufleet", min_nodes=0, max_nodes=4, scale_down_after_s=30,
            down_cooldown_s=0,
        )  # fmt: skip
        for _ in range(15):
            await fleet.tick()
        states = await _states(fleet)
        assert states[tested] == "in_service", states
        assert sorted(s for n, s in states.items() if n != tested) == ["removed", "removed"]
        assert all(tested not in a["nodes"] for a in await _actions(fleet))
        # A request to remove it (Cluster Autoscaler's, Slurm's) is refused, naming why.
        async with fleet.app.ctx.db.transaction() as session:
            cluster = await session.get(ClusterRow, fleet.cluster_id, with_for_update=True)
            node = await session.get(NodeRow, fleet.node_id(tested))
            assert cluster is not None and node is not None
            with pytest.raises(Conflict, match="is in an acceptance run"):
                await start_scale_down(
                    session, cluster=cluster, nodes=[node], busy={node.id: False},
                    source=AutoscaleSource.ADMIN, reasons=["test"], actor="test",
                    now=fleet.clock.now(),
                )  # fmt: skip
