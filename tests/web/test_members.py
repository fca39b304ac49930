"""The members page: admins add people, change their role and remove them through the
console's forms (the members service, as the API does); members only read it; a project
keeps its last admin."""

from __future__ import annotations

import httpx
from webhelpers import browser, hidden, log_in, member_token

from gpufleet.testing.fleet import SimFleet


async def _members(fleet: SimFleet) -> dict[str, str]:
    response = await fleet.app.client.get("/api/v1/projects/ml/members")
    assert response.status_code == 200, response.text
    return {m["user_name"]: m["role"] for m in response.json()}


async def test_an_admin_manages_members_from_the_console(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    created = await fleet.app.client.post("/api/v1/users", json={"name": "bob"})
    assert created.status_code == 201, created.text
    bob = created.json()["id"]
    page = await admin.get("/projects/ml/members")
    assert page.status_code == 200 and "Add a member" in page.text
    csrf = hidden(page.text, "csrf")
    added = await admin.post(
        "/projects/ml/members", data={"csrf": csrf, "user": "bob", "role": "member"}
    )
    assert added.status_code == 303
    assert (
        "bob is now a member of the project." in (await admin.get(added.headers["location"])).text
    )
    assert (await _members(fleet))["bob"] == "member"
    again = await admin.post(
        "/projects/ml/members", data={"csrf": csrf, "user": "bob", "role": "admin"}
    )
    assert again.status_code == 409 and "already a member" in again.text
    nobody = await admin.post(
        "/projects/ml/members", data={"csrf": csrf, "user": "zed", "role": "member"}
    )
    assert nobody.status_code in (404, 422) and "zed" in nobody.text  # the service's answer
    promoted = await admin.post(
        f"/projects/ml/members/{bob}/role", data={"csrf": csrf, "role": "admin"}
    )
    assert promoted.status_code == 303 and (await _members(fleet))["bob"] == "admin"
    removed = await admin.post(f"/projects/ml/members/{bob}/remove", data={"csrf": csrf})
    assert removed.status_code == 303 and "bob" not in await _members(fleet)
    # The project keeps its last admin: the owner (admin of ml) cannot be removed.
    owner = (await fleet.app.client.get("/api/v1/me")).json()["user"]["id"]
    last = await admin.post(f"/projects/ml/members/{owner}/remove", data={"csrf": csrf})
    assert last.status_code == 409 and "at least one admin" in last.text
    assert 'href="/projects/ml/members"' in last.text  # the way back


async def test_a_member_reads_the_members_page_and_changes_nothing(fleet: SimFleet) -> None:
    async with browser(fleet.app) as member:
        assert (await log_in(member, await member_token(fleet.app))).status_code == 303
        page = await member.get("/projects/ml/members")
        assert page.status_code == 200 and "admin" in page.text
        assert "Add a member" not in page.text and "/remove" not in page.text
        refused = await member.post(
            "/projects/ml/members",
            data={"csrf": hidden(page.text, "csrf"), "user": "admin", "role": "member"},
        )
        assert refused.status_code == 403
