"""Live updates: the poll endpoint sends the grid cells that changed since the browser's
version, the events after its newest, and versions that tell which parts to refresh."""

from __future__ import annotations

import re
from typing import Any

import httpx
from sqlalchemy import update
from webhelpers import NO_EVENT

from gpufleet.server.db.tables import GpuRow
from gpufleet.server.services.health_grid import CELL_OF_HEALTH
from gpufleet.server.web.live import GridCache
from gpufleet.testing.fleet import SimFleet


async def _poll(client: httpx.AsyncClient, fleet: SimFleet, **params: str) -> dict[str, Any]:
    response = await client.get(f"/clusters/{fleet.cluster_id}/live", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body: dict[str, Any] = response.json()
    return body


async def test_a_fault_changes_one_cell_and_arrives_as_an_event(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    fleet.app.app.state.console_grids = GridCache(ttl_s=0.0)  # every poll reads the store
    page = (await admin.get(f"/clusters/{fleet.cluster_id}/health")).text
    etag = re.search(r'data-etag="([0-9a-f]+)"', page)
    after = re.search(r'data-after="([0-9a-f-]+)"', page)
    assert etag and after
    first = await _poll(admin, fleet, grid=etag.group(1), after=after.group(1))
    assert first["etag"] == etag.group(1) and "changes" not in first  # nothing new
    assert first["events"] == [] and first["cells"]["healthy"] == 24

    await fleet.inject("train-001", "xid-79", gpu_index=2)
    await fleet.tick()
    second = await _poll(admin, fleet, grid=first["etag"], after=after.group(1))
    assert second["etag"] != first["etag"]
    # A diff against the page's version: only train-001's block, GPU 2 unhealthy.
    (change,) = second["changes"]
    index, cls, cells, label = change
    names = list(fleet.nodes)
    assert names[index] == "train-001"
    assert cells[2] == CELL_OF_HEALTH[next(h for h in CELL_OF_HEALTH if h.value == "unhealthy")]
    assert cells.count("h") == 7 and "h-unhealthy" in cls.split()
    assert "GPU 2 unhealthy" in label and "1 open finding" in label
    assert "train-001" in second["attention_html"]
    assert second["cells"]["unhealthy"] == 1
    assert any("fault.injected" in e or "finding.opened" in e for e in second["events"])
    assert second["last_event"] > after.group(1)

    # A browser whose version the server no longer knows gets the whole grid.
    third = await _poll(admin, fleet, grid="0" * 24, after=second["last_event"])
    assert "grid_html" in third and "changes" not in third
    assert third["grid_html"].count('class="n ') == 3


async def test_versions_tell_the_page_what_to_refresh(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    node = fleet.nodes["train-000"]["id"]
    before = await _poll(admin, fleet, after=NO_EVENT, node=node)
    assert "etag" not in before  # no grid asked for, none read
    await fleet.inject("train-000", "xid-79")
    await fleet.until(lambda: fleet.proposed_for("train-000"), what="a proposal")
    after = await _poll(admin, fleet, after=NO_EVENT, node=node)
    assert after["versions"]["repairs"] != before["versions"]["repairs"]
    assert after["versions"]["node"] != before["versions"]["node"]
    assert after["pending_repairs"] == 1
    # Events can be filtered like the Events tab: only this node's.
    others = await _poll(admin, fleet, after=NO_EVENT, node=fleet.nodes["train-002"]["id"])
    assert all("train-000" not in e for e in others["events"])


async def test_bad_poll_parameters_are_refused(fleet: SimFleet, admin: httpx.AsyncClient) -> None:
    for params in ({"after": "yesterday"}, {"node": "x"}):
        response = await admin.get(f"/clusters/{fleet.cluster_id}/live", params=params)
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "invalid_input"


async def test_a_gpu_gone_from_the_middle_is_shown_missing(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    fleet.app.app.state.console_grids = GridCache(ttl_s=0.0)
    before = await _poll(admin, fleet, grid="0" * 24)
    node = fleet.nodes["train-002"]["id"]
    async with fleet.app.ctx.db.transaction() as session:
        await session.execute(
            update(GpuRow)
            .where(GpuRow.node_id == node, GpuRow.index == 3)
            .values(removed_at=fleet.clock.now())
        )
    after = await _poll(admin, fleet, grid=before["etag"])
    (change,) = after["changes"]
    assert change[2] == "hhhmhhhh" and "GPU 3 missing" in change[3]
    assert after["cells"]["unhealthy"] == 1  # a missing GPU counts as unhealthy
