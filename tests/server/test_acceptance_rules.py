"""Acceptance rules the sim cannot easily provoke, on rows set up by hand: a failure pinned
on nobody leaves the nodes in acceptance for an admin's run instead of looping; turning
acceptance off releases nodes waiting for it (all but one someone else drained)."""

from __future__ import annotations

from typing import Any

from apihelpers import create_cluster, create_project, nodes_of, run_loops
from sqlalchemy import func, select, update

from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.db.tables import AcceptanceRunRow, CheckRunRow
from gpufleet.testing.app import RunningApp


async def _in_acceptance(app: RunningApp) -> dict[str, Any]:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, size=2, acceptance_tests=True)
    for _ in range(4):
        await run_loops(app)
    nodes = await nodes_of(app, cluster["id"])
    assert {n["state"] for n in nodes} == {"acceptance"}, nodes
    return cluster


async def _runs(app: RunningApp) -> list[AcceptanceRunRow]:
    async with app.ctx.db.session() as session:
        return list(await session.scalars(select(AcceptanceRunRow).order_by(AcceptanceRunRow.id)))


async def test_a_failure_pinned_on_nobody_waits_for_an_admin(app: RunningApp) -> None:
    cluster = await _in_acceptance(app)
    (run,) = await _runs(app)
    assert (run.status, run.stage) == ("running", "node")
    # The cluster-wide all-reduce failed and bisecting named no node (a fabric problem).
    async with app.ctx.db.transaction() as session:
        await session.execute(
            update(CheckRunRow)
            .where(CheckRunRow.id.in_(run.check_run_ids))
            .values(status="cancelled", detail="stopped by the test")
        )
        await session.execute(
            update(AcceptanceRunRow)
            .where(AcceptanceRunRow.id == run.id)
            .values(
                status="failed",
                stage="gating",
                results={
                    **run.results,
                    "nodes": {
                        n: {"outcome": "fail", "reasons": ["slow ring"], "unpinned": True}
                        for n in run.node_ids
                    },
                },
            )
        )
    for _ in range(3):
        await run_loops(app)
    nodes = await nodes_of(app, cluster["id"])
    assert {n["state"] for n in nodes} == {"acceptance"}  # not cordoned: not their fault
    assert all("did not pass it" in n["state_detail"] for n in nodes)
    runs = await _runs(app)
    assert [(r.status, r.stage) for r in runs] == [("failed", "done")]  # no automatic rerun
    status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}")).json()
    assert status["status"] == "acceptance"

    # An admin runs the suite again: a new run takes the nodes in.
    response = await app.client.post(
        f"/api/v1/clusters/{cluster['id']}/acceptance", json={"reason": "switch replaced"}
    )
    assert response.status_code == 202, response.text
    await run_loops(app)
    runs = await _runs(app)
    assert [(r.trigger, r.stage) for r in runs] == [("provisioning", "done"), ("manual", "node")]
    assert sorted(runs[1].node_ids) == sorted(n["id"] for n in nodes)


async def test_turning_acceptance_off_releases_the_waiting_nodes(app: RunningApp) -> None:
    cluster = await _in_acceptance(app)
    response = await app.client.patch(
        f"/api/v1/clusters/{cluster['id']}",
        json={"acceptance_tests": False, "reason": "no time for it"},
    )
    assert response.status_code == 200
    for _ in range(3):
        await run_loops(app)
    nodes = await nodes_of(app, cluster["id"])
    assert {n["state"] for n in nodes} == {"in_service"}
    (run,) = await _runs(app)
    assert (run.status, run.stage) == ("cancelled", "done")
    async with app.ctx.db.session() as session:
        open_checks = await session.scalar(
            select(func.count()).where(
                CheckRunRow.id.in_(run.check_run_ids),
                CheckRunRow.status.in_(["pending", "running"]),
            )
        )
    assert open_checks == 0
    status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}")).json()
    assert status["status"] == "ready"


async def test_turning_acceptance_off_leaves_an_operators_drain_and_cordons_that_node(
    app: RunningApp,
) -> None:
    """As at gating: a node someone else drained meanwhile is not put in service (and
    their drain is not undone); it is cordoned, saying whose drain keeps it out."""
    cluster = await _in_acceptance(app)
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    world = provider.world
    held, free = sorted(n["name"] for n in await nodes_of(app, cluster["id"]))
    # The operator takes the node over: their drain replaces gpufleet's acceptance drain.
    world.resume_node(held, cluster_id=cluster["id"], only_reason_prefix=None)
    world.drain_node(held, reason="ops: recabling", cluster_id=cluster["id"])
    response = await app.client.patch(
        f"/api/v1/clusters/{cluster['id']}",
        json={"acceptance_tests": False, "reason": "no time for it"},
    )
    assert response.status_code == 200
    for _ in range(3):
        await run_loops(app)
    nodes = {n["name"]: n for n in await nodes_of(app, cluster["id"])}
    assert nodes[free]["state"] == "in_service"
    assert nodes[held]["state"] == "cordoned"
    assert nodes[held]["state_detail"] == (
        "acceptance tests turned off; drained by someone else ('ops: recabling')"
    )
    status = world.node_status(held, cluster_id=cluster["id"])
    assert status.drained and status.reason == "ops: recabling"
    assert not world.node_status(free, cluster_id=cluster["id"]).drained


async def test_a_passed_node_someone_else_drained_is_cordoned_at_gating(app: RunningApp) -> None:
    cluster = await _in_acceptance(app)
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    world = provider.world
    (run,) = await _runs(app)
    held, free = sorted(n["name"] for n in await nodes_of(app, cluster["id"]))
    world.resume_node(held, cluster_id=cluster["id"], only_reason_prefix=None)
    world.drain_node(held, reason="ops: recabling", cluster_id=cluster["id"])
    # Every node passed; the report is written.
    async with app.ctx.db.transaction() as session:
        await session.execute(
            update(CheckRunRow)
            .where(CheckRunRow.id.in_(run.check_run_ids))
            .values(status="cancelled", detail="stopped by the test")
        )
        await session.execute(
            update(AcceptanceRunRow)
            .where(AcceptanceRunRow.id == run.id)
            .values(
                status="passed",
                stage="gating",
                results={
                    **run.results,
                    "nodes": {n: {"outcome": "pass", "reasons": []} for n in run.node_ids},
                },
            )
        )
    for _ in range(3):
        await run_loops(app)
    nodes = {n["name"]: n for n in await nodes_of(app, cluster["id"])}
    assert (nodes[free]["state"], nodes[free]["state_detail"]) == ("in_service", "")
    assert nodes[held]["state"] == "cordoned"
    assert nodes[held]["state_detail"] == (
        "passed acceptance; drained by someone else ('ops: recabling')"
    )
    assert world.node_status(held, cluster_id=cluster["id"]).reason == "ops: recabling"
    assert not world.node_status(free, cluster_id=cluster["id"]).drained
