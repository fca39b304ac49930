"""Every console page renders from the real services, for an admin and for a member; a
project the viewer is not in does not exist for them; pages without a session go to the
login page."""

from __future__ import annotations

import re

import httpx
import pytest
from webhelpers import browser, log_in, member_token

from gpufleet.testing.fleet import SimFleet

TABS = (
    "health",
    "utilization",
    "reliability",
    "events",
    "configuration",
    "nodes",
    "repairs",
    "checks",
    "rollouts",
)


async def _pages(fleet: SimFleet) -> list[str]:
    base = f"/clusters/{fleet.cluster_id}"
    node = fleet.nodes["train-001"]["id"]
    return [
        "/",
        "/projects/ml",
        *(f"{base}/{tab}" for tab in TABS),
        f"{base}/nodes/{node}",
        f"{base}/nodes/{node}?window=6h",
        f"{base}/events?kind=node.health&since=1h",
        f"{base}/utilization?window=24h",
        f"{base}/nodes?state=in_service&health=healthy",
    ]


async def test_every_page_renders_for_admin_and_member(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    await fleet.inject("train-001", "xid-79", gpu_index=2)
    repair = await fleet.until(lambda: fleet.proposed_for("train-001"), what="a proposal")
    base = f"/clusters/{fleet.cluster_id}"
    pages = [*await _pages(fleet), f"{base}/repairs/{repair['id']}"]
    async with browser(fleet.app) as member:
        assert (await log_in(member, await member_token(fleet.app))).status_code == 303
        for client, who in ((admin, "admin"), (member, "member")):
            for path in pages:
                response = await client.get(path)
                assert response.status_code == 200, f"{who} {path}: {response.text[:500]}"
                assert response.headers["content-type"].startswith("text/html")
                assert "Content-Security-Policy" in response.headers
                assert "Traceback" not in response.text
        # The grid shows GPU 2 of train-001 unhealthy, with its spoken summary.
        health = (await admin.get(f"{base}/health")).text
        block = re.search(
            r'<a class="n h-unhealthy[^"]*"[^>]*aria-label="train-001: [^"]*"', health
        )
        assert block is not None and "GPU 2 unhealthy" in block.group(0)
        # The node's page shows the finding's evidence (the kernel log line).
        node = (await admin.get(f"{base}/nodes/{fleet.nodes['train-001']['id']}")).text
        assert 'id="gpu-2"' in node and "xid-79" in node and "Xid" in node
        # Admins get approve buttons and node actions; members get neither.
        queue = (await admin.get(f"{base}/repairs")).text
        assert f"{base}/repairs/{repair['id']}/approve" in queue
        admin_node = (await admin.get(f"{base}/nodes/{fleet.nodes['train-002']['id']}")).text
        assert "data-confirm data-action" in admin_node and "/actions/reboot" in admin_node
        member_queue = (await member.get(f"{base}/repairs")).text
        assert "/approve" not in member_queue and "Waiting for a project admin" in member_queue
        member_node = (await member.get(f"{base}/nodes/{fleet.nodes['train-002']['id']}")).text
        assert "/actions" not in member_node  # no node action, not even its confirmation
        assert "Run check" in member_node  # members run active checks
        assert "Only project admins can change" in (await member.get(f"{base}/configuration")).text


async def test_other_projects_do_not_exist_for_a_member(fleet: SimFleet) -> None:
    created = await fleet.app.client.post("/api/v1/projects", json={"name": "skunkworks"})
    assert created.status_code == 201, created.text
    other = await fleet.app.client.post(
        "/api/v1/clusters",
        json={"project": "skunkworks", "name": "stealth", "size": 1, "acceptance_tests": False},
    )
    assert other.status_code == 201, other.text
    hidden = other.json()["id"]
    async with browser(fleet.app) as member:
        assert (await log_in(member, await member_token(fleet.app))).status_code == 303
        home = (await member.get("/")).text
        assert "skunkworks" not in home and "stealth" not in home
        for path in (
            "/projects/skunkworks",
            f"/clusters/{hidden}/health",
            f"/clusters/{hidden}/nodes",
            f"/clusters/{hidden}/configuration",
            f"/clusters/{hidden}/live?grid=x",
            "/clusters/not-an-id/health",
        ):
            response = await member.get(path)
            assert response.status_code == 404, f"{path}: {response.status_code}"
        # Nor can one of its nodes be reached through a cluster the member can see.
        nodes = await fleet.app.client.get("/api/v1/nodes", params={"cluster": hidden})
        node_id = nodes.json()["items"][0]["id"]
        response = await member.get(f"/clusters/{fleet.cluster_id}/nodes/{node_id}")
        assert response.status_code == 404


@pytest.mark.parametrize("path", ["/", "/projects/ml", "/clusters/{cluster}/health"])
async def test_no_session_goes_to_the_login_page_and_back(fleet: SimFleet, path: str) -> None:
    path = path.format(cluster=fleet.cluster_id)
    async with browser(fleet.app) as anonymous:
        response = await anonymous.get(path)
        assert response.status_code == 303
        assert response.headers["location"] == "/login?next=" + path
        live = await anonymous.get(f"/clusters/{fleet.cluster_id}/live?grid=x")
        assert live.status_code == 401 and live.json()["error"]["code"] == "unauthorized"
        back = await log_in(anonymous, fleet.app.owner_token, next_path=path)
        assert back.status_code == 303 and back.headers["location"] == path
        assert (await anonymous.get(path)).status_code == 200


async def test_static_files_are_served(fleet: SimFleet) -> None:
    async with browser(fleet.app) as client:
        for name, kind in (("console.css", "text/css"), ("console.js", "javascript")):
            response = await client.get(f"/static/{name}")
            assert response.status_code == 200 and kind in response.headers["content-type"]


async def test_pages_are_compressed_when_the_browser_accepts_it(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    path = f"/clusters/{fleet.cluster_id}/health"
    response = await admin.get(path, headers={"accept-encoding": "gzip"})
    assert response.headers.get("content-encoding") == "gzip"
    assert "Nodes × GPUs" in response.text  # httpx decodes it
    plain = await admin.get(path, headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers and "Nodes × GPUs" in plain.text


async def test_a_page_that_does_not_exist_is_an_html_404(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    for path in (f"/clusters/{fleet.cluster_id}/nope", "/projects/ml/nope/deeper"):
        response = await admin.get(path)
        assert response.status_code == 404, path
        assert response.headers["content-type"].startswith("text/html")
        assert "Not found" in response.text
    api = await admin.get("/api/v1/nope")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
