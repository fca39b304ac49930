"""Projects and their members: the owner names the first admin; admins manage members;
a project always keeps an admin; IdP-group memberships are changed at the IdP."""

from __future__ import annotations

from typing import Any

from apihelpers import count_rows, error_of
from sqlalchemy import select

from gpufleet.core.clock import utcnow
from gpufleet.server.db.tables import AuditLogRow, MembershipRow, UserRow
from gpufleet.testing.app import RunningApp


async def _user(app: RunningApp, name: str, **extra: Any) -> dict[str, Any]:
    response = await app.client.post("/api/v1/users", json={"name": name, **extra})
    assert response.status_code == 201, response.text
    user: dict[str, Any] = response.json()
    return user


async def _token(app: RunningApp, user: str, project: str, role: str = "admin") -> str:
    body = {"user": user, "project": project, "role": role, "name": f"{user}-{role}"}
    response = await app.client.post("/api/v1/tokens", json=body)
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


async def _members(app: RunningApp, project: str = "ml") -> list[tuple[str, str, str]]:
    response = await app.client.get(f"/api/v1/projects/{project}/members")
    assert response.status_code == 200, response.text
    return [(m["user_name"], m["role"], m["source"]) for m in response.json()]


async def test_owner_names_the_first_admin_who_then_manages_members(app: RunningApp) -> None:
    alice = await _user(app, "alice", email="alice@example.com", unix_name="alice")
    await _user(app, "bob")
    created = await app.client.post("/api/v1/projects", json={"name": "ml", "first_admin": "alice"})
    assert created.status_code == 201, created.text
    assert await _members(app) == [("alice", "admin", "manual")]  # not the owner
    admin = await _token(app, "alice", "ml")
    async with app.with_token(admin) as client:
        added = await client.post("/api/v1/projects/ml/members", json={"user": "bob"})
        assert added.status_code == 201, added.text
        assert (added.json()["role"], added.json()["user_name"]) == ("member", "bob")
        again = await client.post("/api/v1/projects/ml/members", json={"user": "bob"})
        assert again.status_code == 409
        promoted = await client.patch("/api/v1/projects/ml/members/bob", json={"role": "admin"})
        assert promoted.status_code == 200, promoted.text
        listed = (await client.get("/api/v1/projects/ml/members")).json()
    assert [(m["user_name"], m["role"], m["unix_name"]) for m in listed] == [
        ("alice", "admin", "alice"),
        ("bob", "admin", None),
    ]
    assert listed[0]["user_id"] == alice["id"]
    async with app.ctx.db.session() as session:
        actions = (
            await session.scalars(
                select(AuditLogRow.action)
                .where(AuditLogRow.object_type == "membership", AuditLogRow.result == "ok")
                .order_by(AuditLogRow.id)
            )
        ).all()
    assert actions == ["membership.create", "membership.update"]


async def test_first_admin_must_exist(app: RunningApp) -> None:
    before = await count_rows(app)
    response = await app.client.post(
        "/api/v1/projects", json={"name": "ml", "first_admin": "nobody"}
    )
    assert response.status_code == 404
    assert error_of(response)["field"] == "first_admin"
    assert await count_rows(app) == before


async def test_the_last_admin_can_be_neither_removed_nor_demoted(app: RunningApp) -> None:
    await app.client.post("/api/v1/projects", json={"name": "ml"})  # the owner is its admin
    await _user(app, "bob")
    await app.client.post("/api/v1/projects/ml/members", json={"user": "bob", "role": "member"})
    for method, body in (("PATCH", {"role": "member"}), ("DELETE", None)):
        response = await app.client.request(method, "/api/v1/projects/ml/members/admin", json=body)
        assert response.status_code == 409, response.text
        assert "at least one admin" in error_of(response)["message"]
    promoted = await app.client.patch("/api/v1/projects/ml/members/bob", json={"role": "admin"})
    assert promoted.status_code == 200
    removed = await app.client.delete("/api/v1/projects/ml/members/admin")
    assert removed.status_code == 200, removed.text
    assert await _members(app) == [("bob", "admin", "manual")]


async def test_members_read_the_member_list_but_only_admins_change_it(app: RunningApp) -> None:
    await app.client.post("/api/v1/projects", json={"name": "ml"})
    await _user(app, "carol")
    await _user(app, "dave")
    await app.client.post("/api/v1/projects/ml/members", json={"user": "carol"})
    member = await _token(app, "carol", "ml", role="member")
    before = await count_rows(app)
    async with app.with_token(member) as client:
        assert (await client.get("/api/v1/projects/ml/members")).status_code == 200
        refused = await client.post("/api/v1/projects/ml/members", json={"user": "dave"})
        assert refused.status_code == 403
        assert "member.manage" in error_of(refused)["message"]
    assert await count_rows(app) == before


async def test_group_memberships_are_changed_at_the_idp(app: RunningApp) -> None:
    await app.client.post("/api/v1/projects", json={"name": "ml"})
    erin = await _user(app, "erin")
    project_id = (await app.client.get("/api/v1/projects/ml")).json()["id"]
    async with app.ctx.db.transaction() as session:
        session.add(
            MembershipRow(
                project_id=project_id,
                user_id=erin["id"],
                role="member",
                created_at=utcnow(),
                source="oidc-group",
            )
        )
    for method, body in (("PATCH", {"role": "admin"}), ("DELETE", None)):
        response = await app.client.request(method, "/api/v1/projects/ml/members/erin", json=body)
        assert response.status_code == 409, response.text
        assert "IdP group" in error_of(response)["message"]
    assert ("erin", "member", "oidc-group") in await _members(app)


async def test_users_are_the_owner_s(app: RunningApp) -> None:
    await _user(app, "frank", unix_name="frank")
    taken = await app.client.post("/api/v1/users", json={"name": "frank2", "unix_name": "frank"})
    assert taken.status_code == 409
    bad = await app.client.patch("/api/v1/users/frank", json={"unix_name": "Frank!"})
    assert bad.status_code == 422
    assert error_of(bad)["field"] == "unix_name"
    renamed = await app.client.patch("/api/v1/users/frank", json={"unix_name": "f_rank-2"})
    assert renamed.json()["unix_name"] == "f_rank-2"
    cleared = await app.client.patch("/api/v1/users/frank", json={"unix_name": None})
    assert cleared.json()["unix_name"] is None
    kept = await app.client.patch("/api/v1/users/frank", json={})
    assert kept.status_code == 200 and kept.json()["unix_name"] is None
    names = [u["name"] for u in (await app.client.get("/api/v1/users")).json()]
    assert names == ["admin", "frank"]
    async with app.ctx.db.session() as session:
        owner = await session.scalar(select(UserRow).where(UserRow.name == "admin"))
    assert owner is not None and owner.is_owner
