"""Injected faults: API → sim world → simulated agent → finding, node health, events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from apihelpers import count_rows, create_project, error_of, nodes_of, ready_cluster
from sqlalchemy import select

from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.db.tables import AuditLogRow, EventRow
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.models import BootPlan
from gpufleet.testing.app import RunningApp


@pytest.fixture
async def fleet(app: RunningApp) -> AsyncIterator[dict[str, Any]]:
    """A ready two-node cluster whose simulated agents talk to the app in-process."""
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=2)
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app))
    # A long report interval: only the findings path can make the test pass in time.
    runner = SimFleetRunner(provider.world, http=http, report_interval_s=3600, seed=1)
    await runner.run_once()
    nodes = {n["name"]: n for n in await nodes_of(app, cluster["id"])}
    try:
        yield {"cluster": cluster, "nodes": nodes, "runner": runner, "world": provider.world}
    finally:
        await runner.aclose()
        await http.aclose()


async def _wait_for(app: RunningApp, params: dict[str, str], *, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = (await app.client.get("/api/v1/findings", params=params)).json()["items"]
        if items:
            return items
        await asyncio.sleep(0.02)
    raise AssertionError(f"no finding for {params} within {timeout_s} s")


async def test_inject_xid_79_opens_a_finding_and_the_node_turns_unhealthy(
    app: RunningApp, fleet: dict[str, Any]
) -> None:
    node = fleet["nodes"]["train-000"]
    started = time.monotonic()
    response = await app.client.post(
        f"/api/v1/nodes/{node['id']}/faults", json={"signature": "xid-79", "gpu_index": 2}
    )
    assert response.status_code == 202, response.text
    fault = response.json()
    assert (fault["signature"], fault["gpu_index"], fault["severity"]) == ("xid-79", 2, "fatal")
    assert fault["node_name"] == "train-000" and fault["gpu_uuid"].startswith("GPU-")

    (finding,) = await _wait_for(app, {"node": node["id"], "open": "true"})
    print(f"inject → stored finding: {(time.monotonic() - started) * 1000:.0f} ms (in-process)")
    assert finding["signature_id"] == "xid-79"
    assert (finding["gpu_index"], finding["gpu_uuid"]) == (2, fault["gpu_uuid"])
    assert finding["severity"] == "fatal" and finding["title"] == "GPU has fallen off the bus"
    assert "NVRM: Xid (PCI:0000:3a:00): 79" in finding["evidence"]
    assert "GPU has fallen off the bus" in finding["evidence"]
    assert finding["pci_bus_id"] == "0000:3a:00.0"
    shown = (await app.client.get(f"/api/v1/nodes/{node['id']}")).json()
    assert shown["health"] == "unhealthy"
    other = fleet["nodes"]["train-001"]
    assert (await app.client.get("/api/v1/findings", params={"node": other["id"]})).json()[
        "items"
    ] == []

    async with app.ctx.db.session() as session:
        audit = (
            await session.scalars(
                select(AuditLogRow).where(AuditLogRow.action == "node.fault.inject")
            )
        ).all()
        kinds = set(await session.scalars(select(EventRow.kind)))
    assert [(a.object_id, a.detail["signature"]) for a in audit] == [(node["id"], "xid-79")]
    assert {"fault.injected", "finding.opened"} <= kinds

    listed = (await app.client.get(f"/api/v1/nodes/{node['id']}/faults")).json()
    assert [f["id"] for f in listed] == [fault["id"]]

    cleared = await app.client.delete(f"/api/v1/nodes/{node['id']}/faults/xid-79")
    assert cleared.status_code == 200, cleared.text
    assert [f["id"] for f in cleared.json()] == [fault["id"]]
    (gone,) = await _wait_for(app, {"node": node["id"], "open": "false"})
    assert gone["id"] == finding["id"] and gone["cleared_at"] is not None


async def test_a_reboot_clears_the_fault_and_the_agent_reports_it_cleared(
    app: RunningApp, fleet: dict[str, Any]
) -> None:
    node = fleet["nodes"]["train-001"]
    response = await app.client.post(
        f"/api/v1/nodes/{node['id']}/faults", json={"signature": "thermal-slowdown"}
    )
    assert response.status_code == 202, response.text
    await _wait_for(app, {"node": node["id"], "open": "true"})
    # The world's reboot, as the provider does it, but with no boot delay.
    fleet["world"].reboot(node["provider_instance_id"], plan=BootPlan((0.0, 0.0)))
    await fleet["runner"].run_once()  # the rebooted machine's new agent sends the clear
    (cleared,) = await _wait_for(app, {"node": node["id"], "open": "false"})
    assert cleared["signature_id"] == "thermal-slowdown"


async def test_bad_injections_are_refused_and_change_nothing(
    app: RunningApp, fleet: dict[str, Any]
) -> None:
    node = fleet["nodes"]["train-000"]
    url = f"/api/v1/nodes/{node['id']}/faults"
    before = await count_rows(app)

    response = await app.client.post(url, json={"signature": "xid-9999"})
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["field"] == "signature" and "xid-9999" in error["message"]

    response = await app.client.post(url, json={"signature": "xid-79", "gpu_index": 8})
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == "gpu_index"

    response = await app.client.post(url, json={"signature": "xid-79", "gpu": 1})
    assert response.status_code == 422, response.text

    response = await app.client.post(
        "/api/v1/nodes/01ARZ3NDEKTSV4RRFFQ69G5FAV/faults", json={"signature": "xid-79"}
    )
    assert response.status_code == 404, response.text

    response = await app.client.delete(f"{url}/not-a-signature")
    assert response.status_code == 422, response.text

    assert await count_rows(app) == before
    assert fleet["world"].faults_of(node["provider_instance_id"]) == []


async def test_a_member_may_not_inject(app: RunningApp, fleet: dict[str, Any]) -> None:
    created = await app.client.post(
        "/api/v1/tokens", json={"project": "ml", "role": "member", "name": "ci"}
    )
    assert created.status_code == 201, created.text
    node = fleet["nodes"]["train-000"]
    async with app.with_token(created.json()["token"]) as member:
        response = await member.post(
            f"/api/v1/nodes/{node['id']}/faults", json={"signature": "xid-79"}
        )
        assert response.status_code == 403, response.text
        assert "node.action" in error_of(response)["message"]
        response = await member.delete(f"/api/v1/nodes/{node['id']}/faults/xid-79")
        assert response.status_code == 403, response.text
    assert fleet["world"].faults_of(node["provider_instance_id"]) == []


async def test_inject_on_a_node_that_is_not_simulated_is_a_conflict(
    app: RunningApp, fleet: dict[str, Any]
) -> None:
    node = fleet["nodes"]["train-000"]
    providers = app.ctx.drivers.providers
    sim = providers["sim"]
    providers["sim"] = object()  # type: ignore[assignment]  # stands in for a real cloud
    try:
        response = await app.client.post(
            f"/api/v1/nodes/{node['id']}/faults", json={"signature": "xid-79"}
        )
    finally:
        providers["sim"] = sim
    assert response.status_code == 409, response.text
    assert "inject works on sim nodes" in error_of(response)["message"]
    assert "--log" in error_of(response)["message"]
