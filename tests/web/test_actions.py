"""Console forms work without JavaScript (POST → redirect), each checks the session's
CSRF token first, and the roles are the API's: a member sees no approve button, and a
member's approve is refused by the console and by the API alike."""

from __future__ import annotations

import httpx
from sqlalchemy import func, select, update
from webhelpers import browser, hidden, log_in, member_token

from gpufleet.server.db.tables import ApiTokenRow, AuditLogRow, RepairRow
from gpufleet.testing.fleet import SimFleet


async def _csrf(client: httpx.AsyncClient, path: str) -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    return hidden(page.text, "csrf")


async def _repair_status(fleet: SimFleet, repair_id: str) -> str:
    return str((await fleet.repair(repair_id))["status"])


async def test_a_form_without_its_csrf_token_changes_nothing(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    await fleet.inject("train-001", "xid-79")
    repair = await fleet.until(lambda: fleet.proposed_for("train-001"), what="a proposal")
    base = f"/clusters/{fleet.cluster_id}"
    node = fleet.nodes["train-002"]["id"]
    for path, data in (
        (f"{base}/repairs/{repair['id']}/approve", {"reason": "x"}),
        (f"{base}/repairs/{repair['id']}/dismiss", {"reason": "x"}),
        (f"{base}/nodes/{node}/actions", {"action": "cordon", "reason": "x"}),
        (f"{base}/configuration", {"acceptance_tests": "1", "autoscale_max": "9"}),
        (f"{base}/checks", {"check": "dcgm-diag"}),
        ("/logout", {}),
    ):
        for csrf in (None, "0" * 64):
            form = dict(data) if csrf is None else {**data, "csrf": csrf}
            response = await admin.post(path, data=form)
            assert response.status_code == 403, f"{path} csrf={csrf}: {response.status_code}"
            assert "CSRF" in response.text
    assert await _repair_status(fleet, repair["id"]) == "proposed"
    assert (await fleet.app.client.get(f"/api/v1/nodes/{node}")).json()["state"] == "in_service"
    cluster = (await fleet.app.client.get(f"/api/v1/clusters/{fleet.cluster_id}")).json()
    assert cluster["autoscale_max"] is None
    assert (await admin.get("/")).status_code == 200  # still logged in


async def test_node_actions_and_repair_decisions_work_without_javascript(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    base = f"/clusters/{fleet.cluster_id}"
    node = fleet.nodes["train-002"]["id"]
    node_page = f"{base}/nodes/{node}"
    csrf = await _csrf(admin, node_page)
    # The no-JS confirmation page, then its form.
    confirm = await admin.get(f"{node_page}/actions/cordon")
    assert confirm.status_code == 200 and "Cordon train-002?" in confirm.text
    done = await admin.post(
        f"{node_page}/actions",
        data={"csrf": csrf, "action": "cordon", "reason": "fan noise", "next": node_page},
    )
    assert done.status_code == 303 and done.headers["location"] == node_page
    shown = await admin.get(node_page)
    assert "Cordon: train-002 is now cordoned." in shown.text  # the flash, once
    assert "is now cordoned" not in (await admin.get(node_page)).text
    assert (await fleet.app.client.get(f"/api/v1/nodes/{node}")).json()["state"] == "cordoned"
    await admin.post(
        f"{node_page}/actions", data={"csrf": csrf, "action": "uncordon", "reason": "fixed"}
    )
    assert (await fleet.app.client.get(f"/api/v1/nodes/{node}")).json()["state"] == "in_service"
    # A bad request says what was wrong, links back to the form's page, changes nothing.
    refused = await admin.post(
        f"{node_page}/actions",
        data={"csrf": csrf, "action": "cordon", "reason": "", "next": node_page},
    )
    assert refused.status_code == 422
    assert "reason" in refused.text.split('role="alert"')[1][:300]
    assert f'href="{node_page}"' in refused.text

    # Approve one recommendation, dismiss another, through the console's forms.
    await fleet.inject("train-001", "xid-79")
    first = await fleet.until(lambda: fleet.proposed_for("train-001"), what="a proposal")
    await fleet.inject("train-000", "xid-79")
    second = await fleet.until(lambda: fleet.proposed_for("train-000"), what="a proposal")
    assert (await admin.get(f"{base}/repairs/{first['id']}/approve")).status_code == 200
    approved = await admin.post(
        f"{base}/repairs/{first['id']}/approve",
        data={"csrf": csrf, "reason": "", "next": f"{base}/repairs"},
    )
    assert approved.status_code == 303
    assert await _repair_status(fleet, first["id"]) != "proposed"
    dismissed = await admin.post(
        f"{base}/repairs/{second['id']}/dismiss", data={"csrf": csrf, "reason": "known flake"}
    )
    assert dismissed.status_code == 303
    assert await _repair_status(fleet, second["id"]) == "rejected"
    decided = (await fleet.repair(second["id"]))["decided_by"]
    assert decided == "user:admin"  # the session's user, as the API would record it

    # Configuration: startup scripts, the acceptance opt-out, autoscaling bounds.
    saved = await admin.post(
        f"{base}/configuration",
        data={"csrf": csrf, "acceptance_tests": ["0", "1"], "script": ["echo one", "", "echo two"],
              "autoscale_min": "1", "autoscale_max": "8", "reason": "bounds"},
    )  # fmt: skip
    assert saved.status_code == 303
    cluster = (await fleet.app.client.get(f"/api/v1/clusters/{fleet.cluster_id}")).json()
    assert cluster["startup_scripts"] == ["echo one", "echo two"]
    assert (cluster["autoscale_min"], cluster["autoscale_max"]) == (1, 8)
    assert cluster["acceptance_tests"] is True
    bad = await admin.post(
        f"{base}/configuration",
        data={"csrf": csrf, "acceptance_tests": "0", "autoscale_min": "9", "autoscale_max": "2"},
    )
    assert bad.status_code == 422
    assert "autoscale_min" in bad.text.split('role="alert"')[1][:300]
    cluster = (await fleet.app.client.get(f"/api/v1/clusters/{fleet.cluster_id}")).json()
    assert (cluster["autoscale_min"], cluster["autoscale_max"]) == (1, 8)


async def test_a_member_gets_no_approve_button_and_is_refused_everywhere(fleet: SimFleet) -> None:
    await fleet.inject("train-001", "xid-79")
    repair = await fleet.until(lambda: fleet.proposed_for("train-001"), what="a proposal")
    base = f"/clusters/{fleet.cluster_id}"
    async with browser(fleet.app) as member:
        assert (await log_in(member, await member_token(fleet.app))).status_code == 303
        queue = await member.get(f"{base}/repairs")
        assert repair["id"] in queue.text and "/approve" not in queue.text
        csrf = hidden(queue.text, "csrf")
        # The console refuses the form a member forges...
        forged = await member.post(
            f"{base}/repairs/{repair['id']}/approve", data={"csrf": csrf, "reason": "me"}
        )
        assert forged.status_code == 403
        assert (await member.get(f"{base}/repairs/{repair['id']}/approve")).status_code == 403
        # ...and the API refuses the same session (cookie + CSRF header), and the token.
        api = await member.post(
            f"/api/v1/repairs/{repair['id']}/approve",
            json={"reason": "me"},
            headers={"X-CSRF-Token": member.cookies["gpufleet_csrf"]},
        )
        assert api.status_code == 403, api.text
        token = fleet.app.with_token(await member_token(fleet.app))
        async with token:
            refused = await token.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
        assert refused.status_code == 403
    assert await _repair_status(fleet, repair["id"]) == "proposed"
    async with fleet.app.ctx.db.session() as session:
        approvals = await session.scalar(
            select(func.count())
            .select_from(AuditLogRow)
            .where(AuditLogRow.action == "repair.status", AuditLogRow.result == "ok")
        )
        status = await session.scalar(select(RepairRow.status).where(RepairRow.id == repair["id"]))
    assert status == "proposed" and not approvals


async def test_login_by_token(fleet: SimFleet) -> None:
    async with browser(fleet.app) as client:
        bad = await log_in(client, "gpf_not-a-token")
        assert bad.status_code == 401 and "invalid or revoked token" in bad.text
        node_token = await log_in(client, "gpfn_node-token")
        assert node_token.status_code == 401
        assert "gpufleet_session" not in client.cookies
        # The login form's own CSRF value must come back with it.
        page = await client.get("/login")
        forged = await client.post(
            "/login", data={"login_csrf": "guess", "token": fleet.app.owner_token}
        )
        assert forged.status_code == 403 and "gpufleet_session" not in client.cookies
        assert hidden(page.text, "login_csrf")
        # An open redirect is not possible through next.
        ok = await log_in(client, fleet.app.owner_token, next_path="//evil.example/x")
        assert ok.status_code == 303 and ok.headers["location"] == "/"
        cookies = ok.headers.get_list("set-cookie")
        session = next(c for c in cookies if c.startswith("gpufleet_session="))
        assert "HttpOnly" in session and "Secure" in session and "SameSite=lax" in session
        # Logout ends the session server-side: the old cookie no longer works.
        old = client.cookies["gpufleet_session"]
        csrf = await _csrf(client, "/")
        out = await client.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/login"
    async with browser(fleet.app) as replay:
        replay.cookies.set("gpufleet_session", old, domain="gpufleet.test")
        assert (await replay.get("/")).status_code == 303


async def test_a_token_session_has_the_token_scope_and_ends_with_it(fleet: SimFleet) -> None:
    """The owner's member-scoped token gives a member's console, not the owner's; revoking
    the token ends the session at once."""
    created = await fleet.app.client.post(
        "/api/v1/tokens", json={"project": "ml", "role": "member", "name": "console"}
    )
    token = created.json()
    async with browser(fleet.app) as client:
        assert (await log_in(client, token["token"])).status_code == 303
        me = await client.get("/api/v1/auth/me")
        assert me.status_code == 200 and me.json()["auth_method"] == "session"
        csrf = client.cookies["gpufleet_csrf"]
        # Owner powers are capped by the token: no project creation through this session.
        made = await client.post(
            "/api/v1/projects", json={"name": "nope"}, headers={"X-CSRF-Token": csrf}
        )
        assert made.status_code in (403, 404), made.text
        config = (await client.get(f"/clusters/{fleet.cluster_id}/configuration")).text
        assert "Only project admins can change" in config
        async with fleet.app.ctx.db.transaction() as session:
            await session.execute(
                update(ApiTokenRow)
                .where(ApiTokenRow.id == token["info"]["id"])
                .values(revoked_at=fleet.clock.now())
            )
        gone = await client.get("/")
        assert gone.status_code == 303 and gone.headers["location"].startswith("/login")
