"""Re-issuing a node's token: for machines that take no user data (bare metal from the
host inventory) and reinstalled agents. The old token is refused at once; the new one is
shown once and written nowhere else; only a never-expiring admin credential may do it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from apihelpers import create_project, error_of, node_tokens, ready_cluster, report_batch
from apihelpers import send_report as send
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow, EventRow
from gpufleet.testing.app import RunningApp


async def _node(app: RunningApp) -> tuple[dict[str, Any], str]:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    nodes = (await app.client.get("/api/v1/nodes", params={"cluster": cluster["id"]})).json()
    node = nodes["items"][0]
    return node, (await node_tokens(app, cluster["id"]))[node["name"]]


async def test_a_new_token_replaces_the_old_one_and_is_shown_once(
    app: RunningApp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    node, old = await _node(app)
    assert (await send(app, old, report_batch(1, hostname=node["name"]))).status_code == 200

    issued = await app.client.post(f"/api/v1/nodes/{node['id']}/token", json={})
    assert issued.status_code == 201, issued.text
    body = issued.json()
    new = body["token"]
    assert body["node_id"] == node["id"] and body["node_name"] == node["name"]
    assert new.startswith("gpfn_") and new != old

    assert (await send(app, old, report_batch(2, hostname=node["name"]))).status_code == 401
    assert (await send(app, new, report_batch(3, hostname=node["name"]))).status_code == 200

    # Shown once: not in the node, its events, the audit log or any log line.
    shown = (await app.client.get(f"/api/v1/nodes/{node['id']}")).text
    async with app.ctx.db.session() as session:
        events = (await session.scalars(select(EventRow))).all()
        audits = (await session.scalars(select(AuditLogRow))).all()
    issued_events = [e for e in events if e.kind == "node.token_issued"]
    assert len(issued_events) == 1 and issued_events[0].node_id == node["id"]
    assert [a.action for a in audits if a.action == "node.token_issue"] == ["node.token_issue"]
    everything = [
        shown,
        caplog.text,
        *(f"{e.message} {e.data}" for e in events),
        *(f"{a.detail}" for a in audits),
    ]
    assert not [text for text in everything if new in text or new[5:] in text]


async def test_who_may_issue_a_node_token(app: RunningApp) -> None:
    node, _ = await _node(app)
    url = f"/api/v1/nodes/{node['id']}/token"
    for name in ("ada", "bob"):
        assert (await app.client.post("/api/v1/users", json={"name": name})).status_code == 201
    for user, role in (("ada", "admin"), ("bob", "member")):
        added = await app.client.post(
            "/api/v1/projects/ml/members", json={"user": user, "role": role}
        )
        assert added.status_code == 201, added.text

    async def token(**body: Any) -> str:
        created = await app.client.post("/api/v1/tokens", json={"name": "t", **body})
        assert created.status_code == 201, created.text
        return str(created.json()["token"])

    # A project admin with a never-expiring token may.
    async with app.with_token(await token(user="ada", project="ml")) as ada:
        assert (await ada.post(url, json={})).status_code == 201
    # A member may not; nor an admin token capped to member.
    async with app.with_token(await token(user="bob", project="ml")) as bob:
        assert (await bob.post(url, json={})).status_code == 403
    async with app.with_token(await token(user="ada", project="ml", role="member")) as capped:
        assert (await capped.post(url, json={})).status_code == 403
    # An expiring admin token may not: a node token never expires, and no credential
    # creates one that outlives it.
    expiring = await token(user="ada", project="ml", expires_in_days=1)
    async with app.with_token(expiring) as short:
        refused = await short.post(url, json={})
    assert refused.status_code == 403
    assert "outlives" in error_of(refused)["message"]
    # An unknown node is a 404.
    missing = await app.client.post("/api/v1/nodes/01a00000-0000-7000-8000-000000000000/token")
    assert missing.status_code == 404
