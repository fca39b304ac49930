"""Login through the organisation's OIDC provider; console sessions; the CLI's exchange.

``/auth/login`` → the IdP (state, nonce, PKCE S256) → ``/auth/callback`` → a session
cookie. ``/auth/device-token`` turns an ID token the CLI got by the device grant into a
personal API token. The flow's logic lives in services/oidc.py, logins.py, sessions.py.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import RedirectResponse

import gpufleet.server.services.logins as login_services
import gpufleet.server.services.sessions as session_services
import gpufleet.server.services.users as users_services
from gpufleet.core.errors import InvalidInput, NotFound, Unauthorized
from gpufleet.core.models import AuthConfig, CreatedToken, Membership
from gpufleet.server.context import AppContext
from gpufleet.server.deps import CtxDep, SignedIn, client_ip
from gpufleet.server.errors import ERROR_DESCRIPTIONS
from gpufleet.server.limits import RateLimiter
from gpufleet.server.schemas.auth import AuthMe, CreateDeviceTokenRequest
from gpufleet.server.services.oidc import OidcConfig, OidcRelyingParty

router = APIRouter(prefix="/auth", tags=["auth"])

LOGIN_COOKIE = "gpufleet_login"
LOGIN_COOKIE_PATH = "/api/v1/auth"
DEVICE_TOKEN_MAX_AGE_S = 300.0  # the CLI exchanges its ID token right after the grant


def relying_party(ctx: AppContext) -> OidcRelyingParty:
    if ctx.oidc is None:
        config = OidcConfig.from_settings(ctx.settings)
        if config is None:
            raise NotFound(
                "OIDC login is not configured on this server (set GPUFLEET_OIDC_ISSUER and "
                "GPUFLEET_OIDC_CLIENT_ID); use a personal API token"
            )
        ctx.oidc = OidcRelyingParty(config, clock=ctx.clock)
    return ctx.oidc


# The login routes: 404 where no OIDC provider is configured, 429 from ``limit``.
LOGIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "OIDC login is not configured on this server"},
    429: {"description": ERROR_DESCRIPTIONS[429]},
}


def limit(ctx: AppContext, request: Request, what: str) -> None:
    if ctx.login_limiter is None:
        ctx.login_limiter = RateLimiter(per_minute=ctx.settings.auth_rate_limit_per_min)
    ctx.login_limiter.check(client_ip(request) or "unknown", what=what)


def _safe_return_to(value: str) -> str:
    # Only paths on this server: anything else would make the login an open redirect.
    if not value.startswith("/") or value.startswith("//") or "\\" in value or len(value) > 1000:
        raise InvalidInput("next must be a path on this server, like /clusters", field="next")
    return value


def _set_cookie(
    response: Response,
    ctx: AppContext,
    request: Request,
    name: str,
    value: str,
    *,
    max_age: int,
    path: str = "/",
    httponly: bool = True,
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=path,
        secure=ctx.settings.cookies_secure(scheme=request.url.scheme),
        httponly=httponly,
        samesite="lax",  # sent on the IdP's top-level redirect back, not on cross-site POSTs
    )


@router.get("/config")
async def auth_config(ctx: CtxDep) -> AuthConfig:
    """How to log in here: the issuer and the CLI's client (public values only)."""
    if not ctx.settings.oidc_issuer or not ctx.settings.oidc_client_id:
        return AuthConfig(oidc=False)
    rp = relying_party(ctx)
    metadata = await rp.metadata()
    return AuthConfig(
        oidc=True,
        issuer=rp.config.issuer,
        cli_client_id=rp.config.cli_client_id,
        scopes=rp.config.scopes,
        device_authorization_endpoint=metadata.device_authorization_endpoint,
        token_endpoint=metadata.token_endpoint,
    )


@router.get(
    "/login",
    status_code=status.HTTP_302_FOUND,
    response_class=RedirectResponse,
    responses=LOGIN_RESPONSES,
)
async def login(
    request: Request, ctx: CtxDep, next_path: Annotated[str, Query(alias="next")] = "/"
) -> RedirectResponse:
    """Send the browser to the IdP; the state also goes into a short-lived cookie."""
    limit(ctx, request, "login")
    return_to = _safe_return_to(next_path)
    rp = relying_party(ctx)
    state, nonce, verifier = (
        secrets.token_urlsafe(32),
        secrets.token_urlsafe(32),
        secrets.token_urlsafe(48),
    )
    url = await rp.authorization_url(state=state, nonce=nonce, verifier=verifier)
    async with ctx.db.transaction() as session:
        await login_services.start_login(
            session,
            state=state,
            nonce=nonce,
            code_verifier=verifier,
            return_to=return_to,
            now=ctx.clock.now(),
        )
    response = RedirectResponse(url, status_code=status.HTTP_302_FOUND)
    _set_cookie(
        response,
        ctx,
        request,
        LOGIN_COOKIE,
        state,
        max_age=int(login_services.LOGIN_TTL_S),
        path=LOGIN_COOKIE_PATH,
    )
    return response


@router.get(
    "/callback",
    status_code=status.HTTP_303_SEE_OTHER,
    response_class=RedirectResponse,
    responses=LOGIN_RESPONSES,
)
async def callback(
    request: Request,
    ctx: CtxDep,
    code: str | None = None,
    state: str | None = None,
    error: str | None = None,
    error_description: str | None = None,
    iss: str | None = None,
) -> RedirectResponse:
    """The IdP's redirect back: check state, trade the code, verify, start a session."""
    limit(ctx, request, "login callback")
    rp = relying_party(ctx)
    if error:
        raise Unauthorized(
            f"the identity provider refused the login: {error[:100]}"
            + (f" ({error_description[:300]})" if error_description else ""),
        )
    if not code or not state:
        raise InvalidInput("the callback needs code and state from the identity provider")
    browser_state = request.cookies.get(LOGIN_COOKIE, "")
    if not hmac.compare_digest(browser_state.encode(), state.encode()):
        # Binds the callback to the browser that started the login (login CSRF).
        raise InvalidInput(
            "state does not match the login this browser started; start again at "
            "/api/v1/auth/login",
            field="state",
        )
    if iss is not None and iss != rp.config.issuer:  # RFC 9207 mix-up defence
        raise Unauthorized(f"the response came from issuer {iss!r}, not {rp.config.issuer!r}")
    async with ctx.db.transaction() as session:  # consumed even if the rest fails
        pending = await login_services.take_login(session, state=state, now=ctx.clock.now())
    id_token = await rp.exchange_code(code, verifier=pending.code_verifier)
    claims = await rp.verify_id_token(id_token, audience=rp.config.client_id, nonce=pending.nonce)
    async with ctx.db.transaction() as session:
        created = await login_services.finish_login(
            session,
            claims=claims,
            group_roles=ctx.settings.oidc_group_roles,
            lifetime_s=ctx.settings.session_lifetime_s,
            now=ctx.clock.now(),
            source_ip=client_ip(request),
        )
    response = RedirectResponse(pending.return_to, status_code=status.HTTP_303_SEE_OTHER)
    lifetime = int(ctx.settings.session_lifetime_s)
    _set_cookie(
        response, ctx, request, session_services.SESSION_COOKIE, created.secret, max_age=lifetime
    )
    # Readable by the console's script, which echoes it in the X-CSRF-Token header.
    _set_cookie(
        response,
        ctx,
        request,
        session_services.CSRF_COOKIE,
        created.csrf_token,
        max_age=lifetime,
        httponly=False,
    )
    response.delete_cookie(LOGIN_COOKIE, path=LOGIN_COOKIE_PATH)
    return response


@router.post("/logout", status_code=status.HTTP_204_NO_CONTENT)
async def logout(request: Request, caller: SignedIn, ctx: CtxDep) -> Response:
    """End this console session (needs the CSRF header, like every cookie POST)."""
    async with ctx.db.transaction() as session:
        await session_services.revoke_web_session(session, caller=caller, now=ctx.clock.now())
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    secure = ctx.settings.cookies_secure(scheme=request.url.scheme)
    for name in (session_services.SESSION_COOKIE, session_services.CSRF_COOKIE):
        response.delete_cookie(name, path="/", secure=secure, httponly=True, samesite="lax")
    return response


@router.get("/me")
async def me(request: Request, caller: SignedIn, ctx: CtxDep) -> AuthMe:
    async with ctx.db.reader() as session:
        user = await users_services.get_signed_in_user(session, caller=caller)
        expires_at = None
        if caller.auth_method == "session":
            expires_at = await session_services.get_session_expiry(
                session, session_id=caller.token_id
            )
    secret = request.cookies.get(session_services.SESSION_COOKIE)
    return AuthMe(
        user=user,
        memberships=[
            Membership(project_id=p, user_id=caller.user_id, role=r)
            for p, r in sorted(caller.memberships.items())
        ],
        auth_method=caller.auth_method,
        expires_at=expires_at,
        csrf_token=(
            session_services.csrf_token_for(secret)
            if caller.auth_method == "session" and secret
            else None
        ),
    )


@router.post("/device-token", status_code=status.HTTP_201_CREATED, responses=LOGIN_RESPONSES)
async def device_token(
    body: CreateDeviceTokenRequest, request: Request, ctx: CtxDep
) -> CreatedToken:
    """Exchange a fresh ID token (for the CLI's client) for a personal API token."""
    limit(ctx, request, "device-token")
    rp = relying_party(ctx)
    claims = await rp.verify_id_token(
        body.id_token,
        audience=rp.config.cli_client_id,
        nonce=None,
        max_age_s=DEVICE_TOKEN_MAX_AGE_S,
    )
    async with ctx.db.transaction() as session:
        return await login_services.exchange_id_token(
            session,
            id_token=body.id_token,
            claims=claims,
            group_roles=ctx.settings.oidc_group_roles,
            project_ref=body.project,
            role=body.role,
            name=body.name,
            expires_in_days=ctx.settings.cli_token_days,
            now=ctx.clock.now(),
            source_ip=client_ip(request),
        )
