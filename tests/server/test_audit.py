"""The audit log: who, what, when, from where, result; its query API; and no secrets in it
or in the server's log."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import httpx
import pytest
from apihelpers import audit_rows_of, create_cluster, create_project, error_of
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow
from gpufleet.testing.app import RunningApp


async def _member_and_admin(app: RunningApp, project: str) -> tuple[str, str]:
    tokens = []
    for role in ("member", "admin"):
        name = f"{project}-{role}"
        await app.client.post("/api/v1/users", json={"name": name})
        await app.client.post(
            f"/api/v1/projects/{project}/members", json={"user": name, "role": role}
        )
        created = await app.client.post(
            "/api/v1/tokens", json={"user": name, "project": project, "role": role}
        )
        tokens.append(created.json()["token"])
    return tokens[0], tokens[1]


async def test_a_mutation_s_rows_carry_its_request_id_and_address(app: RunningApp) -> None:
    response = await app.client.post("/api/v1/projects", json={"name": "ml"})
    request_id = response.headers["X-Request-ID"]
    rows = await audit_rows_of(app, response)
    assert [(r.action, r.actor, r.result, r.source_ip) for r in rows] == [
        ("project.create", "user:admin", "ok", "127.0.0.1")
    ]
    assert rows[0].request_id == request_id
    reads = await app.client.get("/api/v1/projects")
    assert reads.headers["X-Request-ID"] != request_id
    assert await audit_rows_of(app, reads) == []


async def test_a_refused_mutation_is_recorded_and_writes_nothing_else(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, project="ml", name="train", size=1)
    member, _admin = await _member_and_admin(app, "ml")
    async with app.with_token(member) as client:
        denied = await client.delete(f"/api/v1/clusters/{cluster['id']}")
    assert denied.status_code == 403
    (row,) = await audit_rows_of(app, denied)
    assert (row.actor, row.action, row.result, row.object_id, row.project_id) == (
        "user:ml-member",
        "cluster.delete",
        "denied",
        cluster["id"],
        cluster["project_id"],
    )
    assert row.detail["status"] == 403
    assert row.detail["route"] == "DELETE /api/v1/clusters/{cluster_id}"
    assert "cluster.delete" in row.detail["error"]
    assert (await app.client.get(f"/api/v1/clusters/{cluster['id']}")).json()["status"] != (
        "deleting"
    )
    conflict = await app.client.post("/api/v1/projects", json={"name": "ml"})
    invalid = await app.client.post("/api/v1/projects", json={"name": "ML!"})
    results = [(await audit_rows_of(app, r))[0] for r in (conflict, invalid)]
    assert [(r.result, r.detail["status"]) for r in results] == [
        ("conflict", 409),
        ("invalid", 422),
    ]
    anonymous = await app.anonymous().post("/api/v1/projects", json={"name": "x"})
    assert anonymous.status_code == 401
    assert await audit_rows_of(app, anonymous) == []  # nobody to name; not stored


async def _query(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    response = await client.get("/api/v1/audit", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_admins_read_their_project_s_rows_the_owner_all(app: RunningApp) -> None:
    ml = await create_project(app.client, "ml")
    infra = await create_project(app.client, "infra")
    member, admin = await _member_and_admin(app, "ml")
    await create_cluster(app.client, project="infra", name="serve", size=1)
    async with app.with_token(admin) as client:
        mine = await _query(client, limit=1000)
        assert mine and {r["project_id"] for r in mine} == {ml["id"]}
        assert (await client.get("/api/v1/audit", params={"project": "infra"})).status_code == 404
    async with app.with_token(member) as client:
        refused = await client.get("/api/v1/audit")
        assert refused.status_code == 403
        assert "audit.read" in error_of(refused)["message"]
    everything = await _query(app.client, limit=1000)
    assert {r["project_id"] for r in everything} >= {ml["id"], infra["id"], None}
    assert [r["id"] for r in everything] == sorted((r["id"] for r in everything), reverse=True)


async def test_filters_and_pages(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    for name in ("a", "b", "c"):
        await create_cluster(app.client, project="ml", name=name, size=1)
    created = await _query(app.client, action="cluster.create")
    assert len(created) == 3 and {r["actor"] for r in created} == {"user:admin"}
    prefixed = await _query(app.client, action="cluster.", project="ml")
    assert {r["action"] for r in prefixed} == {"cluster.create"}
    assert await _query(app.client, actor="user:nobody") == []
    first = await app.client.get("/api/v1/audit", params={"limit": 2})
    page = first.json()
    assert len(page["items"]) == 2 and page["next_cursor"] == page["items"][-1]["id"]
    rest = await _query(app.client, cursor=page["next_cursor"], limit=1000)
    everything = await _query(app.client, limit=1000)
    assert [r["id"] for r in page["items"] + rest] == [r["id"] for r in everything]
    now = dt.datetime.now(dt.UTC)
    assert await _query(app.client, since=(now + dt.timedelta(minutes=1)).isoformat()) == []
    assert len(await _query(app.client, until=now.isoformat(), limit=1000)) == len(everything)
    naive = await app.client.get("/api/v1/audit", params={"since": "2026-01-01T00:00:00"})
    assert naive.status_code == 422 and error_of(naive)["field"] == "since"


async def test_no_secret_reaches_the_log_or_the_audit_rows(
    app: RunningApp, caplog: pytest.LogCaptureFixture
) -> None:
    """A scenario with tokens made, used, refused, revoked and forged: none of the secrets
    is in anything the server logged or in any audit row."""
    caplog.set_level(logging.DEBUG)
    await create_project(app.client, "ml")
    member, admin = await _member_and_admin(app, "ml")
    secrets = [app.owner_token, member, admin]
    async with app.with_token(admin) as client:
        cluster = await create_cluster(client, project="ml", name="train", size=1)
        made = await client.post("/api/v1/tokens", json={"project": "ml", "name": "ci"})
        secrets.append(made.json()["token"])
        await client.delete(f"/api/v1/tokens/{made.json()['info']['id']}")
    async with app.with_token(member) as client:
        await client.delete(f"/api/v1/clusters/{cluster['id']}")  # refused
        await client.post("/api/v1/tokens", json={"project": "ml", "role": "admin"})  # refused
    forged = secrets[-1][:-4] + "AAAA"
    secrets.append(forged)
    async with app.with_token(forged) as client:
        assert (await client.get("/api/v1/clusters")).status_code == 401
    async with app.with_token(secrets[3]) as client:  # revoked
        assert (await client.get("/api/v1/clusters")).status_code == 401
    async with app.ctx.db.session() as session:
        rows = (await session.scalars(select(AuditLogRow))).all()
    dumped = json.dumps(
        [
            [r.actor, r.action, r.object_type, r.object_id, r.result, r.request_id, r.detail]
            for r in rows
        ]
    )
    assert len(rows) > 10
    assert any(r.result == "denied" for r in rows)
    for secret in secrets:
        body = secret.removeprefix("gpf_")
        assert body[:16] not in dumped
        assert body[:16] not in caplog.text
    assert caplog.records, "the scenario logged nothing at all: the check would be empty"
