"""The cluster's Reliability tab: an outage (a node cordoned with an Xid open, then back)
shows in its KPIs, its per-day chart, its signature and host tables and its outage list;
a bad window is a 4xx page (every tab renders for a member: test_pages.py)."""

from __future__ import annotations

import httpx

from gpufleet.testing.fleet import SimFleet


async def _act(fleet: SimFleet, node_id: str, action: str) -> None:
    response = await fleet.app.client.post(
        f"/api/v1/nodes/{node_id}/actions", json={"action": action, "reason": "tab test"}
    )
    assert response.status_code == 200, response.text


async def test_the_tab_shows_where_the_gpu_hours_went(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    node_id = fleet.node_id("train-001")
    await fleet.inject("train-001", "xid-79")
    await fleet.until(lambda: _open(fleet, node_id), what="the finding")
    await _act(fleet, node_id, "cordon")
    await fleet.tick(3 * 3600)  # three hours out: 24 GPU-hours
    await _act(fleet, node_id, "uncordon")
    await fleet.tick()

    page = await admin.get(f"/clusters/{fleet.cluster_id}/reliability")
    assert page.status_code == 200, page.text
    html = page.text
    assert "GPU-hours lost per day" in html and "<svg" in html
    assert "xid-79" in html and "train-001" in html
    assert "24.0" in html  # the outage's GPU-hours, in the KPI, tables and list
    assert 'aria-current="page"' in html and ">Reliability<" in html
    week = await admin.get(f"/clusters/{fleet.cluster_id}/reliability", params={"window": "7d"})
    assert week.status_code == 200 and "xid-79" in week.text
    bad = await admin.get(f"/clusters/{fleet.cluster_id}/reliability", params={"window": "1y"})
    assert bad.status_code == 422 and "window must be one of" in bad.text


async def _open(fleet: SimFleet, node_id: str) -> bool:
    found = await fleet.get("/api/v1/findings", node=node_id, signature="xid-79", open="true")
    return bool(found["items"])
