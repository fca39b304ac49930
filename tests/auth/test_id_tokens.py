"""ID token verification, through POST /auth/device-token (the CLI's exchange).

Bad tokens are made two ways: signed by the real IdP's current key with one claim wrong
(its test-only /_test/sign), or by a key of our own, or not signed at all. Every one is
refused with a message that names what was wrong; the well-formed control is accepted.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey
from oidc_env import Idp, OidcAppFactory
from sqlalchemy import select

from gpufleet.server.db.tables import ApiTokenRow, AuditLogRow
from gpufleet.testing.app import RunningApp

EXCHANGE = "/api/v1/auth/device-token"


def _claims(idp: Idp, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": idp.issuer,
        "aud": "gpufleet-cli",
        "sub": "erin",
        "iat": now,
        "exp": now + 600,
        "preferred_username": "erin",
        "groups": ["ml-users"],
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _current_kid(idp: Idp) -> str:
    return str(idp.jwks()["keys"][0]["kid"])


def _bad_tokens(idp: Idp) -> dict[str, tuple[str, str]]:
    """Case → (token, what the refusal must say)."""
    now = int(time.time())
    ours = RSAKey.generate_key(2048)

    def ours_signed(kid: str, **changes: Any) -> str:
        return jwt.encode({"alg": "RS256", "kid": kid}, _claims(idp, **changes), ours)

    hs_key = OctKey.import_key(b"the-client-secret-guessed-or-leaked!")
    cases: dict[str, Callable[[], tuple[str, str]]] = {
        "forged (our key, the IdP's kid)": lambda: (
            ours_signed(_current_kid(idp)),
            "bad signature",
        ),
        "unknown kid": lambda: (ours_signed("k-nobody-knows"), "does not publish"),
        "expired": lambda: (idp.sign(_claims(idp, iat=now - 7200, exp=now - 3600)), "expired"),
        "wrong audience": lambda: (idp.sign(_claims(idp, aud="another-app")), "audience"),
        "the console's audience": lambda: (idp.sign(_claims(idp, aud="gpufleet")), "audience"),
        "wrong issuer": lambda: (
            idp.sign(_claims(idp, iss="https://idp.evil.example")),
            "issuer",
        ),
        "alg none": lambda: (
            f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(_claims(idp))}.",
            "alg 'none' is not accepted",
        ),
        "HS256": lambda: (
            jwt.encode({"alg": "HS256"}, _claims(idp), hs_key),
            "alg 'HS256' is not accepted",
        ),
        "several audiences, azp someone else": lambda: (
            idp.sign(_claims(idp, aud=["gpufleet-cli", "other"], azp="other")),
            "authorized party",
        ),
        "not valid yet": lambda: (idp.sign(_claims(idp, nbf=now + 3600)), "not valid yet"),
        "issued in the future": lambda: (
            idp.sign(_claims(idp, iat=now + 3600, exp=now + 7200)),
            "future",
        ),
        "too old for the exchange": lambda: (
            idp.sign(_claims(idp, iat=now - 1800, exp=now + 600)),
            "get a fresh one",
        ),
        "no subject": lambda: (idp.sign(_claims(idp, sub=None)), "'sub'"),
        "no exp": lambda: (idp.sign(_claims(idp, exp=None)), "'exp'"),
        "not a JWT": lambda: ("not-a-jwt", "not a signed JWT"),
    }
    return {name: make() for name, make in cases.items()}


async def test_bad_id_tokens_are_refused(oidc_app: RunningApp, oidc_provider: Idp) -> None:
    async with oidc_app.anonymous() as client:
        for case, (token, reason) in _bad_tokens(oidc_provider).items():
            response = await client.post(EXCHANGE, json={"id_token": token})
            assert response.status_code == 401, (case, response.text)
            message = response.json()["error"]["message"]
            assert message.startswith("ID token refused"), (case, message)
            assert reason in message, (case, message)
    async with oidc_app.ctx.db.session() as session:
        assert (await session.scalars(select(ApiTokenRow.name))).all() == ["bootstrap"]


async def test_a_good_id_token_buys_one_scoped_api_token_once(
    oidc_app: RunningApp, oidc_provider: Idp
) -> None:
    token = oidc_provider.sign(_claims(oidc_provider))
    async with oidc_app.anonymous() as client:
        created = await client.post(EXCHANGE, json={"id_token": token, "name": "laptop"})
        assert created.status_code == 201, created.text
        replay = await client.post(EXCHANGE, json={"id_token": token})
    assert replay.status_code == 401 and "already exchanged" in replay.json()["error"]["message"]
    body = created.json()
    assert body["token"].startswith("gpf_") and body["info"]["name"] == "laptop"
    # erin is in one project (ml-users → ml:member): the token is scoped to it.
    async with oidc_app.with_token(body["token"]) as api:
        me = (await api.get("/api/v1/me")).json()
        projects = (await api.get("/api/v1/projects")).json()["items"]
    assert me["user"]["name"] == "erin" and [p["name"] for p in projects] == ["ml"]
    assert me["token"]["project_id"] == projects[0]["id"]
    async with oidc_app.ctx.db.session() as session:
        audit = (await session.scalars(select(AuditLogRow.action))).all()
    assert {"user.create", "membership.create", "token.create"} <= set(audit)


async def test_exchange_names_the_project_when_it_cannot_guess(
    oidc_app: RunningApp, oidc_provider: Idp
) -> None:
    lonely = oidc_provider.sign(_claims(oidc_provider, sub="frank", groups=[]))
    both = oidc_provider.sign(
        _claims(oidc_provider, sub="gina", groups=["ml-users"], preferred_username="gina")
    )
    async with oidc_app.anonymous() as client:
        response = await client.post(EXCHANGE, json={"id_token": lonely})
        assert response.status_code == 422
        assert "no project yet" in response.json()["error"]["message"]
        elsewhere = await client.post(EXCHANGE, json={"id_token": both, "project": "infra"})
        assert elsewhere.status_code == 404  # gina is not in infra: it does not exist for her


async def test_the_exchange_is_rate_limited(
    oidc_app_factory: OidcAppFactory, oidc_provider: Idp
) -> None:
    async with oidc_app_factory(auth_rate_limit_per_min=2) as app, app.anonymous() as client:
        codes = [
            (await client.post(EXCHANGE, json={"id_token": "x.y.z"})).status_code for _ in range(3)
        ]
    assert codes == [401, 401, 429]
