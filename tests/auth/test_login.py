"""The console login through a real OIDC provider: code flow with PKCE, sessions, CSRF."""

from __future__ import annotations

import httpx
import pytest
from flows import approve_at_idp, begin_login, log_in, query_of, set_cookies, with_query
from oidc_env import APP_URL, DEV_URL, Idp, OidcAppFactory, browser_for
from pydantic import ValidationError
from sqlalchemy import select, update

from gpufleet.core.clock import FakeClock
from gpufleet.server.db.tables import AuditLogRow, MembershipRow, OidcLoginRow, UserRow
from gpufleet.server.settings import ServerSettings
from gpufleet.testing.app import RunningApp

CLUSTER = {"project": "ml", "name": "train", "size": 1}


async def _audit_actions(app: RunningApp) -> list[tuple[str, str]]:
    async with app.ctx.db.session() as session:
        rows = await session.scalars(select(AuditLogRow).order_by(AuditLogRow.ts))
        return [(r.actor, r.action) for r in rows]


async def test_full_login_grants_the_group_role_and_logout_ends_the_session(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        authorize = await begin_login(browser, next_path="/clusters")
        params = query_of(authorize)
        assert authorize.startswith(oidc_app.ctx.settings.oidc_issuer or "-")
        assert (params["response_type"], params["client_id"]) == ("code", "gpufleet")
        assert params["code_challenge_method"] == "S256" and len(params["code_challenge"]) == 43
        assert params["state"] and params["nonce"] and params["state"] != params["nonce"]

        response = await browser.get(await approve_at_idp(idp_client, authorize, login="alice"))
        assert response.status_code == 303, response.text
        assert response.headers["location"] == "/clusters"

        me = (await browser.get("/api/v1/auth/me")).json()
        assert me["user"]["name"] == "alice" and me["user"]["email"] == "alice@example.test"
        assert me["user"]["unix_name"] == "alice"  # from preferred_username
        assert me["auth_method"] == "session" and not me["user"]["is_owner"]
        csrf = me["csrf_token"]
        assert csrf == browser.cookies["gpufleet_csrf"]
        projects = (await browser.get("/api/v1/projects")).json()["items"]
        assert [p["name"] for p in projects] == ["ml"]  # fleet-admins → ml:admin only
        assert [m["role"] for m in me["memberships"]] == ["admin"]

        # The mapped role allows an admin action in ml, with the CSRF header...
        created = await browser.post(
            "/api/v1/clusters", json=CLUSTER, headers={"X-CSRF-Token": csrf}
        )
        assert created.status_code == 201, created.text
        # ...and nothing in a project alice is not in: it does not even exist for her.
        assert (await browser.get("/api/v1/projects/infra")).status_code == 404
        other = await browser.post(
            "/api/v1/clusters",
            json={**CLUSTER, "project": "infra"},
            headers={"X-CSRF-Token": csrf},
        )
        assert other.status_code == 404
        # Creating a project is the platform owner's: 403.
        denied = await browser.post(
            "/api/v1/projects", json={"name": "mine"}, headers={"X-CSRF-Token": csrf}
        )
        assert denied.status_code == 403

        session_cookie = browser.cookies["gpufleet_session"]
        out = await browser.post("/api/v1/auth/logout", headers={"X-CSRF-Token": csrf})
        assert out.status_code == 204
        assert "gpufleet_session" not in browser.cookies
    # The old cookie is dead on the server side too, not only forgotten by the browser.
    async with browser_for(oidc_app) as replay:
        replay.cookies.set("gpufleet_session", session_cookie, domain="gpufleet.test")
        after = await replay.get("/api/v1/auth/me")
        assert after.status_code == 401
        assert "session ended" in after.json()["error"]["message"]

    actions = await _audit_actions(oidc_app)
    assert ("system:oidc", "user.create") in actions
    assert ("system:oidc", "membership.create") in actions
    assert ("user:alice", "session.create") in actions
    assert ("user:alice", "cluster.create") in actions  # the session's caller is audited
    assert ("user:alice", "session.revoke") in actions


async def test_session_cookies_are_httponly_secure_samesite(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        started = await browser.get("/api/v1/auth/login")
        login_cookie = set_cookies(started)["gpufleet_login"]
        assert login_cookie["httponly"] and login_cookie["secure"]
        assert login_cookie["samesite"].lower() == "lax"  # type: ignore[union-attr]
        assert login_cookie["path"] == "/api/v1/auth"
        callback = await approve_at_idp(idp_client, started.headers["location"], login="alice")
        response = await browser.get(callback)
        cookies = set_cookies(response)
    session, csrf = cookies["gpufleet_session"], cookies["gpufleet_csrf"]
    assert session["httponly"] and session["secure"] and session["path"] == "/"
    assert str(session["samesite"]).lower() == "lax"
    assert str(session["value"]).startswith("gpfs_")
    assert int(str(session["max-age"])) == int(oidc_app.ctx.settings.session_lifetime_s)
    # The CSRF cookie is for the console's script to read; still Secure and Lax.
    assert not csrf["httponly"] and csrf["secure"] and str(csrf["samesite"]).lower() == "lax"
    async with oidc_app.ctx.db.session() as db:
        hashes = [r for r in await db.scalars(select(AuditLogRow.detail))]
    assert all(str(session["value"]) not in str(d) for d in hashes)


async def test_plain_http_on_loopback_may_turn_secure_off(
    oidc_app_factory: OidcAppFactory, idp_client: httpx.AsyncClient
) -> None:
    async with (
        oidc_app_factory(public_url=DEV_URL, session_cookie_secure=False) as app,
        browser_for(app, base_url=DEV_URL) as browser,
    ):
        response = await log_in(browser, idp_client)
        assert response.status_code == 303, response.text
        assert not set_cookies(response)["gpufleet_session"]["secure"]
        assert (await browser.get("/api/v1/auth/me")).status_code == 200
    with pytest.raises(ValidationError, match="only for http:// on loopback"):
        ServerSettings(public_url="https://fleet.example.com", session_cookie_secure=False)
    with pytest.raises(ValidationError, match="only for http:// on loopback"):
        ServerSettings(public_url="http://fleet.example.com", session_cookie_secure=False)


async def test_cookie_post_without_the_csrf_header_is_refused(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client)).status_code == 303
        missing = await browser.post("/api/v1/clusters", json=CLUSTER)
        assert missing.status_code == 403
        assert "X-CSRF-Token" in missing.json()["error"]["message"]
        wrong = await browser.post(
            "/api/v1/clusters", json=CLUSTER, headers={"X-CSRF-Token": "0" * 64}
        )
        assert wrong.status_code == 403
        logout = await browser.post("/api/v1/auth/logout")
        assert logout.status_code == 403  # logout is a state change too
        assert (await browser.get("/api/v1/auth/me")).status_code == 200  # GET needs none
    # A bearer-token call needs no CSRF header, even when a cookie tags along.
    async with oidc_app.with_token(oidc_app.owner_token) as api:
        api.cookies.set("gpufleet_session", "gpfs_whatever", domain="test")
        created = await api.post("/api/v1/clusters", json=CLUSTER)
        assert created.status_code == 201, created.text


async def test_member_group_gets_member_role_and_losing_the_group_removes_it(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient, oidc_provider: Idp
) -> None:
    sub = "carol"
    oidc_provider.set_user(sub, preferred_username=sub, groups=["ml-users"])
    created = await oidc_app.client.post("/api/v1/clusters", json=CLUSTER)
    cluster_id = created.json()["id"]
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client, login=sub)).status_code == 303
        csrf = browser.cookies["gpufleet_csrf"]
        assert (await browser.get(f"/api/v1/clusters/{cluster_id}")).status_code == 200
        delete = await browser.delete(
            f"/api/v1/clusters/{cluster_id}", headers={"X-CSRF-Token": csrf}
        )
        assert delete.status_code == 403  # a member may not delete clusters

    oidc_provider.set_user(sub, preferred_username=sub, groups=["fleet-admins"])
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client, login=sub)).status_code == 303
        me = (await browser.get("/api/v1/auth/me")).json()
        assert [m["role"] for m in me["memberships"]] == ["admin"]

    oidc_provider.set_user(sub, preferred_username=sub, groups=[])
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client, login=sub)).status_code == 303
        assert (await browser.get(f"/api/v1/clusters/{cluster_id}")).status_code == 404
        assert (await browser.get("/api/v1/auth/me")).json()["memberships"] == []

    actions = [a for actor, a in await _audit_actions(oidc_app) if actor == "system:oidc"]
    assert actions.count("membership.create") == 1
    assert actions.count("membership.update") == 1
    assert actions.count("membership.delete") == 1


async def test_memberships_made_by_hand_are_not_touched_by_groups(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient, oidc_provider: Idp
) -> None:
    oidc_provider.set_user("dave", preferred_username="dave", groups=[])
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client, login="dave")).status_code == 303
    infra = (await oidc_app.client.get("/api/v1/projects/infra")).json()
    async with oidc_app.ctx.db.transaction() as session:
        user = await session.scalar(select(UserRow).where(UserRow.name == "dave"))
        assert user is not None
        assert user.oidc_subject == f"{oidc_provider.issuer}#dave"
        session.add(
            MembershipRow(
                project_id=infra["id"], user_id=user.id, role="member", created_at=user.created_at
            )
        )
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client, login="dave")).status_code == 303
        assert [p["name"] for p in (await browser.get("/api/v1/projects")).json()["items"]] == [
            "infra"
        ]


async def test_an_idp_user_never_takes_over_a_local_user_by_name(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient, oidc_provider: Idp
) -> None:
    # The bootstrap owner is called "admin"; an IdP account called admin is someone else.
    oidc_provider.set_user("admin", preferred_username="admin", groups=[])
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client, login="admin")).status_code == 303
        me = (await browser.get("/api/v1/auth/me")).json()
    assert me["user"]["name"].startswith("admin-") and not me["user"]["is_owner"]
    assert me["user"]["unix_name"] == "admin"  # the owner has none: it is free


async def test_state_mismatch_is_refused(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        callback = await approve_at_idp(idp_client, await begin_login(browser), login="alice")
        wrong = await browser.get(with_query(callback, state="not-the-state"))
        assert wrong.status_code == 422 and wrong.json()["error"]["field"] == "state"
    # A callback in a browser that never started this login (login CSRF) is refused too.
    async with browser_for(oidc_app) as other_browser:
        foreign = await other_browser.get(callback)
        assert foreign.status_code == 422 and foreign.json()["error"]["field"] == "state"
        assert "gpufleet_session" not in other_browser.cookies


async def test_replayed_code_and_replayed_callback_are_refused(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        callback = await approve_at_idp(idp_client, await begin_login(browser), login="alice")
        assert (await browser.get(callback)).status_code == 303
        # The same callback again, even with the login cookie put back: the state is used up.
        browser.cookies.set(
            "gpufleet_login",
            query_of(callback)["state"],
            domain="gpufleet.test",
            path="/api/v1/auth",
        )
        again = await browser.get(callback)
        assert again.status_code == 422 and "already used" in again.json()["error"]["message"]
        # A new login, but the old code: the IdP refuses to redeem a code twice.
        fresh = query_of(await begin_login(browser))
        replay = await browser.get(with_query(callback, state=fresh["state"]))
        assert replay.status_code == 401
        assert "invalid_grant" in replay.json()["error"]["message"]


async def test_pkce_verifier_mismatch_is_refused(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        callback = await approve_at_idp(idp_client, await begin_login(browser), login="alice")
        async with oidc_app.ctx.db.transaction() as session:
            await session.execute(update(OidcLoginRow).values(code_verifier="x" * 43))
        response = await browser.get(callback)
    assert response.status_code == 401
    assert "invalid_grant" in response.json()["error"]["message"]


async def test_nonce_mismatch_is_refused(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient
) -> None:
    async with browser_for(oidc_app) as browser:
        callback = await approve_at_idp(idp_client, await begin_login(browser), login="alice")
        async with oidc_app.ctx.db.transaction() as session:
            await session.execute(update(OidcLoginRow).values(nonce="another-login"))
        response = await browser.get(callback)
    assert response.status_code == 401
    assert "nonce" in response.json()["error"]["message"]
    assert "gpufleet_session" not in set_cookies(response)


async def test_a_rotated_signing_key_is_fetched_and_the_next_login_works(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient, oidc_provider: Idp, clock: FakeClock
) -> None:
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client)).status_code == 303
    new_kid = oidc_provider.rotate_keys()
    clock.advance(oidc_app.ctx.settings.oidc_jwks_refetch_min_s + 1)  # JWKS TTL is 1 h
    async with browser_for(oidc_app) as browser:
        response = await log_in(browser, idp_client)
        assert response.status_code == 303, response.text
        assert (await browser.get("/api/v1/auth/me")).status_code == 200
    assert oidc_app.ctx.oidc is not None and new_kid in oidc_app.ctx.oidc._keys


async def test_public_client_login_with_pkce_only(
    oidc_app_factory: OidcAppFactory, idp_client: httpx.AsyncClient
) -> None:
    async with (
        oidc_app_factory(oidc_client_id="gpufleet-public", oidc_client_secret_file=None) as app,
        browser_for(app) as browser,
    ):
        response = await log_in(browser, idp_client)
        assert response.status_code == 303, response.text
        assert (await browser.get("/api/v1/auth/me")).json()["user"]["name"] == "alice"


async def test_sessions_expire(
    oidc_app: RunningApp, idp_client: httpx.AsyncClient, clock: FakeClock
) -> None:
    async with browser_for(oidc_app) as browser:
        assert (await log_in(browser, idp_client)).status_code == 303
        clock.advance(oidc_app.ctx.settings.session_lifetime_s + 1)
        response = await browser.get("/api/v1/auth/me")
    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]


async def test_login_redirects_only_to_paths_on_this_server(oidc_app: RunningApp) -> None:
    async with browser_for(oidc_app) as browser:
        for bad in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
            response = await browser.get("/api/v1/auth/login", params={"next": bad})
            assert response.status_code == 422, bad
            assert response.json()["error"]["field"] == "next"


async def test_idp_error_on_the_callback_is_reported(oidc_app: RunningApp) -> None:
    async with browser_for(oidc_app) as browser:
        response = await browser.get(
            "/api/v1/auth/callback",
            params={"error": "access_denied", "error_description": "user said no"},
        )
    assert response.status_code == 401
    assert "access_denied (user said no)" in response.json()["error"]["message"]


async def test_login_endpoints_are_rate_limited_per_client(
    oidc_app_factory: OidcAppFactory,
) -> None:
    async with oidc_app_factory(auth_rate_limit_per_min=3) as app:
        async with browser_for(app) as browser:
            for _ in range(3):
                assert (await browser.get("/api/v1/auth/login")).status_code == 302
            limited = await browser.get("/api/v1/auth/login")
            assert limited.status_code == 429
            assert limited.json()["error"]["code"] == "rate_limited"
            assert int(limited.headers["retry-after"]) >= 1
            assert (await browser.get("/api/v1/auth/callback")).status_code == 429
        # Another client is not affected.
        other = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app.app, client=("10.0.0.9", 4000)),
            base_url=APP_URL,
        )
        async with other:
            assert (await other.get("/api/v1/auth/login")).status_code == 302


async def test_login_is_off_without_oidc_settings(app: RunningApp) -> None:
    async with app.anonymous() as client:
        assert (await client.get("/api/v1/auth/config")).json()["oidc"] is False
        response = await client.get("/api/v1/auth/login")
        assert response.status_code == 404
        assert "GPUFLEET_OIDC_ISSUER" in response.json()["error"]["message"]
    me = (await app.client.get("/api/v1/auth/me")).json()
    assert me["auth_method"] == "token" and me["csrf_token"] is None
