"""Projects: create, list, show; only the platform owner creates them."""

from __future__ import annotations

from apihelpers import count_rows, create_project, error_of
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow, EventRow, MembershipRow
from gpufleet.testing.app import RunningApp


async def test_create_project_writes_event_audit_and_admin_membership(app: RunningApp) -> None:
    response = await app.client.post(
        "/api/v1/projects", json={"name": "ml", "description": "training"}
    )
    assert response.status_code == 201, response.text
    project = response.json()
    assert project["name"] == "ml"
    assert project["description"] == "training"
    async with app.ctx.db.session() as session:
        events = (
            await session.scalars(select(EventRow).where(EventRow.kind == "project.created"))
        ).all()
        audits = (
            await session.scalars(select(AuditLogRow).where(AuditLogRow.action == "project.create"))
        ).all()
        memberships = (await session.scalars(select(MembershipRow))).all()
    assert [(e.project_id, e.actor) for e in events] == [(project["id"], "user:admin")]
    assert [(a.object_id, a.actor, a.result) for a in audits] == [
        (project["id"], "user:admin", "ok")
    ]
    assert [(m.project_id, m.role) for m in memberships] == [(project["id"], "admin")]


async def test_list_projects_sorted_by_name(app: RunningApp) -> None:
    for name in ("zeta", "alpha", "mid"):
        await create_project(app.client, name)
    response = await app.client.get("/api/v1/projects")
    assert response.status_code == 200
    page = response.json()
    assert [p["name"] for p in page["items"]] == ["alpha", "mid", "zeta"]
    assert page["next_cursor"] is None


async def test_show_project_by_name_and_by_id(app: RunningApp) -> None:
    project = await create_project(app.client, "ml")
    by_name = await app.client.get("/api/v1/projects/ml")
    by_id = await app.client.get(f"/api/v1/projects/{project['id']}")
    assert by_name.status_code == by_id.status_code == 200
    assert by_name.json() == by_id.json() == project


async def test_unknown_project_is_404(app: RunningApp) -> None:
    response = await app.client.get("/api/v1/projects/nope")
    assert response.status_code == 404
    assert error_of(response)["field"] == "project"


async def test_project_scoped_token_cannot_create_projects(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    created = await app.client.post("/api/v1/tokens", json={"project": "ml", "role": "admin"})
    assert created.status_code == 201, created.text
    before = await count_rows(app)
    async with app.with_token(created.json()["token"]) as admin:
        response = await admin.post("/api/v1/projects", json={"name": "other"})
    assert response.status_code == 403
    assert error_of(response)["code"] == "forbidden"
    assert await count_rows(app) == before
