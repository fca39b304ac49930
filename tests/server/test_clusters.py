"""Clusters: create, list, show, status, provisioning to ready, delete, name reuse."""

from __future__ import annotations

from apihelpers import (
    create_cluster,
    create_project,
    nodes_of,
    ready_cluster,
    run_loops,
)
from sqlalchemy import func, select

from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.db.tables import AuditLogRow, EventRow, NodeRow
from gpufleet.testing.app import RunningApp


async def _events(app: RunningApp, cluster_id: str, kind: str) -> list[EventRow]:
    async with app.ctx.db.session() as session:
        rows = await session.scalars(
            select(EventRow)
            .where(EventRow.cluster_id == cluster_id, EventRow.kind == kind)
            .order_by(EventRow.id)
        )
        return list(rows.all())


async def test_create_cluster_records_nodes_event_and_audit(app: RunningApp) -> None:
    project = await create_project(app.client, "ml")
    response = await app.client.post(
        "/api/v1/clusters",
        json={
            "project": "ml",
            "name": "train",
            "size": 3,
            "gpus_per_node": 4,
            "gpu_model": "NVIDIA H200",
            "labels": {"team": "llm"},
        },
    )
    assert response.status_code == 201, response.text
    cluster = response.json()
    assert cluster["project_id"] == project["id"]
    assert (cluster["status"], cluster["health"]) == ("provisioning", "unknown")
    assert (cluster["size"], cluster["gpus_per_node"], cluster["gpu_model"]) == (
        3,
        4,
        "NVIDIA H200",
    )
    assert cluster["labels"] == {"team": "llm"}
    assert cluster["nodes"] == {
        "total": 3,
        "by_state": {"provisioning": 3},
        "by_health": {"unknown": 3},
        "gpus": 0,
    }
    async with app.ctx.db.session() as session:
        nodes = (
            await session.scalars(
                select(NodeRow).where(NodeRow.cluster_id == cluster["id"]).order_by(NodeRow.name)
            )
        ).all()
        audits = (
            await session.scalars(select(AuditLogRow).where(AuditLogRow.object_id == cluster["id"]))
        ).all()
    assert [n.name for n in nodes] == ["train-000", "train-001", "train-002"]
    assert {(n.state, n.health, n.expected_gpus) for n in nodes} == {("provisioning", "unknown", 4)}
    created = await _events(app, cluster["id"], "cluster.created")
    assert len(created) == 1
    assert created[0].actor == "user:admin"
    assert "3 × 4 NVIDIA H200" in created[0].message
    assert [(a.action, a.actor) for a in audits] == [("cluster.create", "user:admin")]
    assert audits[0].detail["size"] == 3


async def test_list_and_filter_clusters(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    await create_project(app.client, "infra")
    a = await create_cluster(app.client, project="ml", name="a", size=1)
    b = await create_cluster(app.client, project="ml", name="b", size=1)
    c = await create_cluster(app.client, project="infra", name="a", size=1)

    async def names(**params: str) -> list[str]:
        response = await app.client.get("/api/v1/clusters", params=params)
        assert response.status_code == 200, response.text
        return [x["id"] for x in response.json()["items"]]

    assert await names() == [a["id"], b["id"], c["id"]]
    assert await names(project="ml") == [a["id"], b["id"]]
    assert await names(project="infra") == [c["id"]]
    assert await names(name="a") == [a["id"], c["id"]]
    assert await names(status="provisioning") == [a["id"], b["id"], c["id"]]
    assert await names(status="ready") == []


async def test_show_and_status(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, name="train", size=2)
    shown = await app.client.get(f"/api/v1/clusters/{cluster['id']}")
    assert shown.status_code == 200
    assert shown.json()["id"] == cluster["id"]
    assert shown.json()["nodes"]["total"] == 2
    status = await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")
    assert status.status_code == 200
    assert status.json() == {
        "id": cluster["id"],
        "name": "train",
        "status": "provisioning",
        "status_detail": "",
        "health": "unknown",
        "size": 2,
        "nodes": {
            "total": 2,
            "by_state": {"provisioning": 2},
            "by_health": {"unknown": 2},
            "gpus": 0,
        },
    }


async def test_provisioning_brings_cluster_to_ready_with_node_identities(
    app: RunningApp,
) -> None:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=3)
    status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
    assert status["status"] == "ready"
    assert status["nodes"]["by_state"] == {"in_service": 3}
    # No agent has reported yet, so nothing may read as healthy.
    assert status["nodes"]["by_health"] == {"unknown": 3}
    nodes = await nodes_of(app, cluster["id"])
    assert len(nodes) == 3
    for node in nodes:
        assert node["state"] == "in_service"
        assert node["health"] == "unknown"
        for key in ("hostname", "serial", "provider_instance_id", "rack", "leaf_switch", "pdu"):
            assert node[key], (key, node)
        assert node["scheduler_name"] == node["hostname"]
    assert len({n["hostname"] for n in nodes}) == 3
    assert len({n["serial"] for n in nodes}) == 3
    assert len(await _events(app, cluster["id"], "node.created")) == 3
    assert len(await _events(app, cluster["id"], "node.state")) == 3
    statuses = await _events(app, cluster["id"], "cluster.status")
    assert [(e.data["from"], e.data["to"]) for e in statuses] == [("provisioning", "ready")]


async def test_more_loop_passes_change_nothing(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=2)
    before = await nodes_of(app, cluster["id"])
    await run_loops(app, passes=3)
    after = await nodes_of(app, cluster["id"])
    assert [(n["id"], n["provider_instance_id"]) for n in before] == [
        (n["id"], n["provider_instance_id"]) for n in after
    ]
    provider = app.ctx.drivers.provider("sim")
    assert len(await provider.list_instances(cluster["id"])) == 2


async def test_delete_gives_machines_back_and_frees_the_name(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=2)
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)

    response = await app.client.delete(f"/api/v1/clusters/{cluster['id']}")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "deleting"
    again = await app.client.delete(f"/api/v1/clusters/{cluster['id']}")
    assert again.status_code == 202
    assert again.json()["status"] == "deleting"

    await run_loops(app)
    status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
    assert status["status"] == "deleted"
    assert status["nodes"]["total"] == 0
    assert await provider.list_instances(cluster["id"]) == []
    assert await nodes_of(app, cluster["id"]) == []
    removed = await app.client.get(
        "/api/v1/nodes", params={"cluster": cluster["id"], "state": "removed"}
    )
    assert [n["state"] for n in removed.json()["items"]] == ["removed", "removed"]
    listed = (await app.client.get("/api/v1/clusters")).json()["items"]
    assert cluster["id"] not in [c["id"] for c in listed]
    deleted = (await app.client.get("/api/v1/clusters", params={"status": "deleted"})).json()
    assert [c["id"] for c in deleted["items"]] == [cluster["id"]]
    audits = await _audit_actions(app, cluster["id"])
    # The second delete changes nothing but is on record too.
    assert audits == [
        "cluster.create", "cluster.status", "cluster.status", "cluster.delete", "cluster.status",
    ]  # fmt: skip

    reused = await create_cluster(app.client, name="train", size=1)
    assert reused["id"] != cluster["id"]
    await ready_cluster_by_id(app, reused["id"])


async def _audit_actions(app: RunningApp, object_id: str) -> list[str]:
    async with app.ctx.db.session() as session:
        rows = await session.scalars(
            select(AuditLogRow.action)
            .where(AuditLogRow.object_id == object_id)
            .order_by(AuditLogRow.id)
        )
        return list(rows.all())


async def ready_cluster_by_id(app: RunningApp, cluster_id: str) -> None:
    await run_loops(app, passes=2)
    status = (await app.client.get(f"/api/v1/clusters/{cluster_id}/status")).json()
    assert status["status"] == "ready", status


async def test_delete_while_provisioning(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, name="train", size=2)
    await run_loops(app)  # machines requested, not yet recorded as running
    response = await app.client.delete(f"/api/v1/clusters/{cluster['id']}")
    assert response.status_code == 202
    await run_loops(app)
    status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
    assert status["status"] == "deleted"
    assert await app.ctx.drivers.provider("sim").list_instances(cluster["id"]) == []
    async with app.ctx.db.session() as session:
        live = await session.scalar(
            select(func.count())
            .select_from(NodeRow)
            .where(NodeRow.cluster_id == cluster["id"], NodeRow.state != "removed")
        )
    assert live == 0


async def test_enum_fields_accept_their_json_strings(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(
        app.client,
        name="train",
        size=1,
        provider="sim",
        scheduler="sim",
        acceptance_tests=False,
        autoscale_min=1,
        autoscale_max=4,
        startup_scripts=["#!/bin/sh\necho hi"],
    )
    assert (cluster["provider"], cluster["scheduler"]) == ("sim", "sim")
    assert cluster["acceptance_tests"] is False
    assert (cluster["autoscale_min"], cluster["autoscale_max"]) == (1, 4)
    assert cluster["startup_scripts"] == ["#!/bin/sh\necho hi"]


async def test_node_names_follow_the_prefix_and_first_index(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    body = {"project": "ml", "name": "hpc", "size": 3, "acceptance_tests": False}
    created = await app.client.post(
        "/api/v1/clusters", json={**body, "node_prefix": "gpu-", "first_node_index": 1}
    )
    assert created.status_code == 201, created.text
    assert (created.json()["node_prefix"], created.json()["first_node_index"]) == ("gpu-", 1)
    await run_loops(app, passes=2)
    nodes = await nodes_of(app, created.json()["id"])
    assert sorted(n["name"] for n in nodes) == ["gpu-001", "gpu-002", "gpu-003"]
    assert sorted(n["hostname"] for n in nodes) == ["gpu-001", "gpu-002", "gpu-003"]
    default = await app.client.post("/api/v1/clusters", json={**body, "name": "plain"})
    assert default.json()["node_prefix"] == "plain-"
    for bad in ({"node_prefix": "-x"}, {"node_prefix": "a b"}, {"first_node_index": -1}):
        refused = await app.client.post("/api/v1/clusters", json={**body, "name": "x", **bad})
        assert refused.status_code == 422, (bad, refused.text)
    listed = (await app.client.get("/api/v1/clusters")).json()["items"]
    assert {c["name"] for c in listed} == {"hpc", "plain"}  # the refused left nothing
