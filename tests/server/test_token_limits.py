"""A credential never gives more than it holds: a token creates tokens only within its
own project scope, role cap and expiry (what a request leaves out it inherits), and
revokes only tokens with no more power and no longer life than its own."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest
from apihelpers import count_rows, create_project, error_of
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow
from gpufleet.testing.app import RunningApp


async def _created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def _mint(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/api/v1/tokens", json={"name": "t", **body})


async def _add_member(client: httpx.AsyncClient, user: str) -> httpx.Response:
    return await client.post("/api/v1/projects/ml/members", json={"user": user, "role": "admin"})


@pytest.fixture
async def ada(app: RunningApp) -> dict[str, Any]:
    """ada, an admin of ml, with an uncapped, never-expiring token of ml (made by the
    owner, as a server without OIDC hands out first tokens)."""
    await create_project(app.client, "ml")
    for name in ("ada", "carol", "dave"):
        assert (await app.client.post("/api/v1/users", json={"name": name})).status_code == 201
    added = await app.client.post(
        "/api/v1/projects/ml/members", json={"user": "ada", "role": "admin"}
    )
    assert added.status_code == 201, added.text
    created = await _created(await _mint(app.client, user="ada", project="ml"))
    return {"token": created["token"], "id": created["info"]["id"]}


@pytest.mark.parametrize("who", ["project-admin", "owner"])
async def test_a_capped_expiring_token_cannot_mint_more_than_itself(
    app: RunningApp, ada: dict[str, Any], who: str
) -> None:
    """The issue's escalation, for a plain project admin and for the platform owner."""
    full = app.with_token(ada["token"] if who == "project-admin" else app.owner_token)
    async with full as client:
        cap = await _created(await _mint(client, project="ml", role="member", expires_in_days=1))
    cap_expiry = cap["info"]["expires_at"]
    async with app.with_token(cap["token"]) as capped:
        assert (await _add_member(capped, "carol")).status_code == 403  # right
        before = await count_rows(app)
        # Asking for more than the cap, or a longer life, is refused and says why.
        refusals = {
            "role": await _mint(capped, project="ml", role="admin"),
            "expires_in_days": await _mint(capped, project="ml", expires_in_days=30),
            "user": await _mint(capped, project="ml", role="member", user="carol"),
        }
        for field, refused in refusals.items():
            assert refused.status_code == 403, (field, refused.text)
            assert error_of(refused)["field"] == field
        assert "capped at member" in error_of(refusals["role"])["message"]
        assert "outlives it" in error_of(refusals["expires_in_days"])["message"]
        assert await count_rows(app) == before
        # Left out, the cap and the expiry are inherited: the new token is no stronger.
        new = await _created(await _mint(capped, project="ml"))
        unscoped = await _created(await _mint(capped))
        same = await _created(await _mint(capped, project="ml", role="member"))
    for made in (new, unscoped, same):
        assert made["info"]["role"] == "member"
        assert made["info"]["project_id"] == cap["info"]["project_id"]
        assert made["info"]["expires_at"] == cap_expiry
        async with app.with_token(made["token"]) as client:
            refused = await _add_member(client, "carol")
            assert refused.status_code == 403, refused.text  # wrong before the fix
            assert (await client.get("/api/v1/projects/ml")).status_code == 200
    async with app.ctx.db.session() as session:
        denied = (
            await session.scalars(
                select(AuditLogRow).where(
                    AuditLogRow.action.like("%token%"), AuditLogRow.result == "denied"
                )
            )
        ).all()
    assert len(denied) >= 3


async def test_an_expiring_token_mints_only_tokens_that_end_no_later(
    app: RunningApp, ada: dict[str, Any]
) -> None:
    async with app.with_token(ada["token"]) as client:
        week = await _created(await _mint(client, project="ml", expires_in_days=7))
    async with app.with_token(week["token"]) as client:
        inherited = await _created(await _mint(client, project="ml"))
        shorter = await _created(await _mint(client, project="ml", expires_in_days=1))
        longer = await _mint(client, project="ml", expires_in_days=8)
        forever = await _mint(client, project="ml", role="admin", expires_in_days=3650)
        # Its own power is untouched: it is an uncapped admin token.
        assert (await _add_member(client, "dave")).status_code == 201
    assert inherited["info"]["expires_at"] == week["info"]["expires_at"]
    assert inherited["info"]["role"] is None
    end = dt.datetime.fromisoformat(shorter["info"]["expires_at"])
    assert end < dt.datetime.fromisoformat(week["info"]["expires_at"])
    for refused in (longer, forever):
        assert refused.status_code == 403, refused.text
        assert error_of(refused)["field"] == "expires_in_days"


async def test_a_weaker_token_cannot_revoke_a_stronger_one(
    app: RunningApp, ada: dict[str, Any]
) -> None:
    ada_full = ada["id"]
    async with app.with_token(ada["token"]) as client:
        cap = await _created(await _mint(client, project="ml", role="member", expires_in_days=1))
        admin_capped = await _created(await _mint(client, project="ml", role="admin"))
        week = await _created(await _mint(client, project="ml", expires_in_days=7))
    async with app.with_token(cap["token"]) as capped:
        child = await _created(await _mint(capped, project="ml"))
        for target in (ada_full, admin_capped["info"]["id"], week["info"]["id"]):
            refused = await capped.delete(f"/api/v1/tokens/{target}")
            assert refused.status_code == 403, refused.text
            assert error_of(refused)["field"] == "token_id"
        assert "power" in error_of(await capped.delete(f"/api/v1/tokens/{ada_full}"))["message"]
        # Its equal (its own child) it may revoke.
        assert (await capped.delete(f"/api/v1/tokens/{child['info']['id']}")).status_code == 200
    async with app.with_token(week["token"]) as weekly:
        refused = await weekly.delete(f"/api/v1/tokens/{ada_full}")
        assert refused.status_code == 403
        assert "outlives it" in error_of(refused)["message"]
        assert (await weekly.delete(f"/api/v1/tokens/{cap['info']['id']}")).status_code == 200
    async with app.with_token(ada["token"]) as client:
        assert (await client.get("/api/v1/me")).status_code == 200  # untouched
        assert (await client.delete(f"/api/v1/tokens/{week['info']['id']}")).status_code == 200
        assert (await client.delete(f"/api/v1/tokens/{ada_full}")).status_code == 200
    async with app.with_token(admin_capped["token"]) as client:
        assert (await client.get("/api/v1/me")).status_code == 200


async def test_a_capped_owner_token_has_no_owner_power(app: RunningApp) -> None:
    capped = await _created(await _mint(app.client, role="member"))
    async with app.with_token(capped["token"]) as client:
        refused = await client.post("/api/v1/projects", json={"name": "x"})
        assert refused.status_code == 403, refused.text
        assert (await client.get("/api/v1/users")).status_code == 403
        assert (await _mint(client, role="admin")).status_code == 403
