"""Tokens and scopes: who sees what, who may change what, and the unauthenticated routes."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from apihelpers import count_rows, create_cluster, create_project, error_of
from sqlalchemy import select, update

from gpufleet.server.db.tables import ApiTokenRow, AuditLogRow
from gpufleet.testing.app import RunningApp


async def _token(app: RunningApp, **body: Any) -> dict[str, Any]:
    """A token the owner mints (for themselves, or with ``user`` for a member)."""
    response = await app.client.post("/api/v1/tokens", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@pytest.fixture
async def two_projects(app: RunningApp) -> dict[str, Any]:
    """Projects ml and infra with one cluster each, and a member token for ml."""
    await create_project(app.client, "ml")
    await create_project(app.client, "infra")
    ml = await create_cluster(app.client, project="ml", name="train", size=1)
    infra = await create_cluster(app.client, project="infra", name="serve", size=1)
    member = await _token(app, project="ml", role="member", name="ci")
    return {"ml": ml, "infra": infra, "member": member["token"]}


async def test_owner_creates_a_project_scoped_member_token(app: RunningApp) -> None:
    project = await create_project(app.client, "ml")
    created = await _token(app, project="ml", role="member", name="ci", expires_in_days=7)
    token, info = created["token"], created["info"]
    assert token.startswith("gpf_")
    assert info["prefix"] == token[:12]
    assert (info["project_id"], info["role"], info["name"]) == (project["id"], "member", "ci")
    expires = dt.datetime.fromisoformat(info["expires_at"])
    assert dt.timedelta(days=6) < expires - dt.datetime.now(dt.UTC) <= dt.timedelta(days=7)
    async with app.ctx.db.session() as session:
        row = await session.scalar(select(ApiTokenRow).where(ApiTokenRow.id == info["id"]))
        audit = await session.scalar(select(AuditLogRow).where(AuditLogRow.object_id == info["id"]))
    assert row is not None
    assert token not in (row.token_hash, row.prefix)  # only the hash is stored
    assert audit is not None
    assert (audit.action, audit.actor) == ("token.create", "user:admin")
    async with app.with_token(token) as client:
        me = (await client.get("/api/v1/me")).json()
    assert me["token"] == {"id": info["id"], "project_id": project["id"], "role": "member"}


async def test_member_token_sees_only_its_project(
    app: RunningApp, two_projects: dict[str, Any]
) -> None:
    ml, infra = two_projects["ml"], two_projects["infra"]
    async with app.with_token(two_projects["member"]) as client:
        projects = (await client.get("/api/v1/projects")).json()["items"]
        assert [p["name"] for p in projects] == ["ml"]
        clusters = (await client.get("/api/v1/clusters")).json()["items"]
        assert [c["id"] for c in clusters] == [ml["id"]]
        assert (await client.get(f"/api/v1/clusters/{ml['id']}")).status_code == 200
        nodes = (await client.get("/api/v1/nodes")).json()["items"]
        assert {n["cluster_id"] for n in nodes} == {ml["id"]}
        events = (await client.get("/api/v1/events")).json()["items"]
        assert {e["project_id"] for e in events} == {ml["project_id"]}
        summary = (await client.get("/api/v1/health/summary")).json()
        assert (summary["clusters"], summary["nodes"]) == (1, 1)
        for url in (
            f"/api/v1/clusters/{infra['id']}",
            f"/api/v1/clusters/{infra['id']}/status",
            "/api/v1/projects/infra",
        ):
            response = await client.get(url)
            assert response.status_code == 404, url
        listed = await client.get("/api/v1/clusters", params={"project": "infra"})
        assert listed.status_code == 404
        other_events = await client.get("/api/v1/events", params={"cluster": infra["id"]})
        assert other_events.status_code == 404


async def test_member_token_cannot_create_or_delete_clusters(
    app: RunningApp, two_projects: dict[str, Any]
) -> None:
    before = await count_rows(app)
    async with app.with_token(two_projects["member"]) as client:
        created = await client.post(
            "/api/v1/clusters", json={"project": "ml", "name": "new", "size": 1}
        )
        deleted = await client.delete(f"/api/v1/clusters/{two_projects['ml']['id']}")
        elsewhere = await client.post(
            "/api/v1/clusters", json={"project": "infra", "name": "new", "size": 1}
        )
    assert created.status_code == 403
    assert "cluster.create" in error_of(created)["message"]
    assert deleted.status_code == 403
    assert elsewhere.status_code == 404  # another project does not even exist for it
    assert await count_rows(app) == before


async def test_admin_token_of_one_project_cannot_touch_another(
    app: RunningApp, two_projects: dict[str, Any]
) -> None:
    admin = await _token(app, project="infra", role="admin")
    async with app.with_token(admin["token"]) as client:
        ml = two_projects["ml"]
        assert (await client.get(f"/api/v1/clusters/{ml['id']}")).status_code == 404
        assert (await client.delete(f"/api/v1/clusters/{ml['id']}")).status_code == 404
        ok = await client.post(
            "/api/v1/clusters", json={"project": "infra", "name": "new", "size": 1}
        )
        assert ok.status_code == 201, ok.text


async def test_member_token_mints_only_member_tokens_of_its_project(
    app: RunningApp, two_projects: dict[str, Any]
) -> None:
    ml_id = two_projects["ml"]["project_id"]
    async with app.with_token(two_projects["member"]) as client:
        ok = await client.post("/api/v1/tokens", json={"project": "ml", "role": "member"})
        assert ok.status_code == 201, ok.text
        before = await count_rows(app)
        admin = await client.post("/api/v1/tokens", json={"project": "ml", "role": "admin"})
        assert admin.status_code == 403
        assert error_of(admin)["field"] == "role"
        other = await client.post("/api/v1/tokens", json={"project": "infra"})
        assert other.status_code == 404
        assert await count_rows(app) == before
        # No project, no role: the new token inherits this one's scope and cap.
        inherited = await client.post("/api/v1/tokens", json={})
        assert inherited.status_code == 201, inherited.text
        info = inherited.json()["info"]
        assert (info["project_id"], info["role"]) == (ml_id, "member")


@pytest.mark.parametrize("change", ["revoked_at", "expires_at"])
async def test_revoked_or_expired_token_is_401(
    app: RunningApp, two_projects: dict[str, Any], change: str
) -> None:
    async with app.ctx.db.transaction() as session:
        await session.execute(
            update(ApiTokenRow)
            .where(ApiTokenRow.project_id.is_not(None))
            .values({change: dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)})
        )
    async with app.with_token(two_projects["member"]) as client:
        response = await client.get("/api/v1/clusters")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"


async def _api_routes(app: RunningApp) -> list[tuple[str, str]]:
    """Every (METHOD, path) under /api/v1, as the OpenAPI document lists them."""
    async with app.anonymous() as client:
        paths = (await client.get("/api/v1/openapi.json")).json()["paths"]
    return [
        (method.upper(), path.replace("{", "").replace("}", ""))
        for path, operations in paths.items()
        if path.startswith("/api/v1/")
        for method in operations
    ]


# The login itself: reached before anyone has a token (tests/auth covers them).
LOGIN_ROUTES = {
    ("GET", "/api/v1/auth/config"),
    ("GET", "/api/v1/auth/login"),
    ("GET", "/api/v1/auth/callback"),
    ("POST", "/api/v1/auth/device-token"),
}


@pytest.mark.parametrize("header", [None, "Bearer ", "Bearer gpf_forged", "Token abc"])
async def test_every_api_route_needs_a_token(app: RunningApp, header: str | None) -> None:
    routes = [r for r in await _api_routes(app) if r not in LOGIN_ROUTES]
    assert len(routes) >= 12
    assert ("POST", "/api/v1/agent/reports") in routes
    project = await create_project(app.client, "ml")
    before = await count_rows(app)
    headers = {} if header is None else {"Authorization": header}
    async with app.anonymous() as client:
        for method, path in routes:
            url = path.replace("cluster_id", str(uuid.uuid4())).replace(
                "node_id", str(uuid.uuid4())
            )
            url = url.replace("project_ref", project["id"])
            body = {"reports": [{"seq": 1, "sampled_at": "2026-01-01T00:00:00Z", "gpus": []}]}
            response = await client.request(
                method, url, headers=headers, json=body if method == "POST" else None
            )
            assert response.status_code == 401, (method, url, response.text)
            assert error_of(response)["code"] == "unauthorized"
    assert await count_rows(app) == before


async def test_agent_route_rejects_anonymous_before_reading_the_body(app: RunningApp) -> None:
    async with app.anonymous() as client:
        response = await client.post("/api/v1/agent/reports", json={})
    assert response.status_code == 401


async def test_probes_need_no_token(app: RunningApp) -> None:
    async with app.anonymous() as client:
        live = await client.get("/healthz")
        ready = await client.get("/readyz")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


async def test_openapi_lists_the_routes(app: RunningApp) -> None:
    async with app.anonymous() as client:
        response = await client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path, method in [
        ("/api/v1/projects", "post"),
        ("/api/v1/projects/{project_ref}", "get"),
        ("/api/v1/tokens", "post"),
        ("/api/v1/me", "get"),
        ("/api/v1/clusters", "post"),
        ("/api/v1/clusters/{cluster_id}", "delete"),
        ("/api/v1/clusters/{cluster_id}/status", "get"),
        ("/api/v1/nodes", "get"),
        ("/api/v1/nodes/{node_id}", "get"),
        ("/api/v1/events", "get"),
        ("/api/v1/findings", "get"),
        ("/api/v1/health/summary", "get"),
        ("/api/v1/agent/reports", "post"),
    ]:
        assert method in paths.get(path, {}), (method, path)


async def test_tokens_are_listed_without_secrets_and_revoked_at_once(
    app: RunningApp, two_projects: dict[str, Any]
) -> None:
    member = two_projects["member"]
    async with app.with_token(member) as client:
        mine = (await client.get("/api/v1/tokens")).json()
        # The member's token belongs to the owner here (minted by the owner for themselves).
        assert {t["project_id"] for t in mine} <= {two_projects["ml"]["project_id"], None}
        assert all("token" not in t and member not in str(t) for t in mine)
    listed = (await app.client.get("/api/v1/projects/ml/tokens")).json()
    (ci,) = [t for t in listed if t["name"] == "ci"]
    assert ci["user_name"] == "admin" and ci["prefix"] == member[:12]
    revoked = await app.client.delete(f"/api/v1/tokens/{ci['id']}")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revoked_at"] is not None
    async with app.with_token(member) as client:
        refused = await client.get("/api/v1/clusters")
    assert refused.status_code == 401
    again = await app.client.delete(f"/api/v1/tokens/{ci['id']}")
    assert again.status_code == 200  # revoking twice changes nothing, and is on record
    async with app.ctx.db.session() as session:
        rows = (
            await session.scalars(select(AuditLogRow).where(AuditLogRow.action == "token.revoke"))
        ).all()
    assert [r.detail["already"] for r in rows] == [False, True]
    assert (await app.client.get("/api/v1/projects/ml/tokens")).json() == [
        t for t in listed if t["id"] != ci["id"]
    ]
    with_revoked = await app.client.get("/api/v1/projects/ml/tokens", params={"revoked": True})
    assert ci["id"] in [t["id"] for t in with_revoked.json()]


async def test_who_may_revoke_a_token(app: RunningApp) -> None:
    """Its user, an admin of its project, the owner; a member not someone else's (403);
    another project's admin does not even see it (404)."""
    for name in ("ml", "infra"):
        await create_project(app.client, name)
    users = {}
    for name, project, role in (
        ("ann", "ml", "member"),
        ("ben", "ml", "member"),
        ("cat", "ml", "admin"),
        ("dan", "infra", "admin"),
    ):
        await app.client.post("/api/v1/users", json={"name": name})
        await app.client.post(
            f"/api/v1/projects/{project}/members", json={"user": name, "role": role}
        )
        users[name] = await _token(app, user=name, project=project, role=role)
    victim = (await _token(app, user="ann", project="ml", role="member"))["info"]["id"]
    outcomes = {}
    for name in ("dan", "ben", "cat"):
        async with app.with_token(users[name]["token"]) as client:
            outcomes[name] = (await client.delete(f"/api/v1/tokens/{victim}")).status_code
    assert outcomes == {"dan": 404, "ben": 403, "cat": 200}
    own = (await _token(app, user="ann", project="ml", role="member"))["info"]["id"]
    async with app.with_token(users["ann"]["token"]) as client:
        assert (await client.delete(f"/api/v1/tokens/{own}")).status_code == 200
        # A member mints tokens only for themselves.
        for_other = await client.post(
            "/api/v1/tokens", json={"project": "ml", "role": "member", "user": "ben"}
        )
    assert for_other.status_code == 403
    assert error_of(for_other)["field"] == "user"


async def test_owner_mints_for_members_only(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    await app.client.post("/api/v1/users", json={"name": "eve"})
    outside = await app.client.post("/api/v1/tokens", json={"project": "ml", "user": "eve"})
    assert outside.status_code == 422
    assert "not in that project" in error_of(outside)["message"]
    unscoped = await app.client.post("/api/v1/tokens", json={"user": "eve"})
    assert unscoped.status_code == 422
    assert error_of(unscoped)["field"] == "project"
