"""GET /api/v1/agent/access: a node learns who has sudo and Slurm admin on its cluster."""

from __future__ import annotations

from typing import Any

from apihelpers import create_project, node_tokens, nodes_of, ready_cluster
from sqlalchemy import update

from gpufleet.server.db.tables import ClusterRow
from gpufleet.testing.app import RunningApp


async def _access(app: RunningApp, token: str) -> dict[str, Any]:
    async with app.with_token(token) as agent:
        response = await agent.get("/api/v1/agent/access")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _member(app: RunningApp, name: str, role: str, unix_name: str | None) -> None:
    body: dict[str, Any] = {"name": name}
    if unix_name:
        body["unix_name"] = unix_name
    assert (await app.client.post("/api/v1/users", json=body)).status_code == 201
    added = await app.client.post("/api/v1/projects/ml/members", json={"user": name, "role": role})
    assert added.status_code == 201, added.text


async def test_a_node_gets_its_project_s_admins_and_follows_changes(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    await create_project(app.client, "infra")
    cluster = await ready_cluster(app, project="ml", size=1)
    other = await ready_cluster(app, project="infra", name="serve", size=1)
    async with app.ctx.db.transaction() as session:
        await session.execute(
            update(ClusterRow).where(ClusterRow.id == cluster["id"]).values(scheduler="slurm")
        )
    await _member(app, "alice", "admin", "alice")
    await _member(app, "bob", "member", "bob")
    await _member(app, "erin", "admin", None)
    node = (await nodes_of(app, cluster["id"]))[0]
    token = (await node_tokens(app, cluster["id"]))[node["name"]]

    access = await _access(app, token)
    assert access["cluster_id"] == cluster["id"]
    rules = [line for line in access["sudoers"].splitlines() if not line.startswith("#")]
    assert rules == ["alice ALL=(ALL:ALL) NOPASSWD: ALL"]
    assert access["admin_levels"] == {"alice": "Administrator", "bob": "None"}
    assert access["skipped"] == ["admin", "erin"]  # the owner and erin have no Unix name

    promoted = await app.client.patch("/api/v1/projects/ml/members/bob", json={"role": "admin"})
    assert promoted.status_code == 200
    after = await _access(app, token)
    assert after["admin_levels"] == {"alice": "Administrator", "bob": "Administrator"}
    assert after["content_hash"] != access["content_hash"]
    assert (await _access(app, token))["content_hash"] == after["content_hash"]

    other_node = (await nodes_of(app, other["id"]))[0]
    other_token = (await node_tokens(app, other["id"]))[other_node["name"]]
    theirs = await _access(app, other_token)
    assert theirs["cluster_id"] == other["id"] and "alice" not in theirs["sudoers"]
    assert theirs["admin_levels"] == {}  # not a Slurm cluster

    people = await app.client.get(f"/api/v1/clusters/{cluster['id']}/access")
    assert people.json() == after


async def test_only_node_tokens_reach_the_agent_route(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    for client in (app.client, app.anonymous()):
        response = await client.get("/api/v1/agent/access")
        assert response.status_code == 401
    async with app.with_token("gpfn_" + "x" * 43) as forged:
        assert (await forged.get("/api/v1/agent/access")).status_code == 401
