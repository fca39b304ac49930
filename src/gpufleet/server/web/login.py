"""Console login and logout: single sign-on through the IdP, or a personal API token.

SSO is the API's own flow (``/api/v1/auth/login`` → IdP → callback → session cookie).
The token form trades a valid API token for a session with that token's scope
(``create_web_session_from_token``), with the same cookies as the SSO callback.

The login form has no session yet, so its CSRF defence is a double-submit value: a
random cookie set with the form must come back in the form (a cross-site page can make
the browser POST, but cannot read or set our cookie). It stops login CSRF: a page
logging you in as someone else.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

import gpufleet.server.services.sessions as session_services
from gpufleet.core.errors import Forbidden, Unauthorized
from gpufleet.server.deps import CtxDep, client_ip
from gpufleet.server.limits import RateLimiter
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import (
    WebUserDep,
    clear_session_cookies,
    first,
    read_form,
    safe_next,
    set_flash,
    set_session_cookies,
)

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

LOGIN_CSRF_COOKIE = "gpufleet_login_csrf"
LOGIN_CSRF_TTL_S = 3600


def _login_page(
    request: Request,
    ctx: CtxDep,
    *,
    next_path: str,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    nonce = secrets.token_urlsafe(24)
    sso = bool(ctx.settings.oidc_issuer and ctx.settings.oidc_client_id)
    response = render_page(
        request,
        "login.html",
        {
            "user": None,
            "next": next_path,
            "login_csrf": nonce,
            "sso": sso,
            "error": error,
        },
        status_code=status_code,
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        nonce,
        max_age=LOGIN_CSRF_TTL_S,
        path="/login",
        secure=ctx.settings.cookies_secure(scheme=request.url.scheme),
        httponly=True,
        samesite="strict",  # only ever needed by a same-site form post
    )
    return response


@router.get("/login")
async def login_page(
    request: Request,
    ctx: CtxDep,
    next_path: Annotated[str, Query(alias="next", max_length=1000)] = "/",
) -> Response:
    return _login_page(request, ctx, next_path=safe_next(next_path))


@router.post("/login")
async def login_with_token(request: Request, ctx: CtxDep) -> Response:
    form = await read_form(request, csrf=None)
    next_path = safe_next(first(form, "next"))
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    sent = first(form, "login_csrf")
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise Forbidden(
            "the login form expired or was not sent from this console; reload it and try again"
        )
    if ctx.login_limiter is None:  # shared with /api/v1/auth: one budget per client
        ctx.login_limiter = RateLimiter(per_minute=ctx.settings.auth_rate_limit_per_min)
    ctx.login_limiter.check(client_ip(request) or "unknown", what="console login")
    token = first(form, "token").strip()
    if not token:
        return _login_page(
            request, ctx, next_path=next_path, error="Paste an API token.", status_code=422
        )
    try:
        async with ctx.db.transaction() as session:
            created = await session_services.create_web_session_from_token(
                session,
                token=token,
                now=ctx.clock.now(),
                lifetime_s=ctx.settings.session_lifetime_s,
                source_ip=client_ip(request),
            )
    except Unauthorized as exc:
        return _login_page(request, ctx, next_path=next_path, error=exc.message, status_code=401)
    response = redirect(next_path)
    max_age = max(1, int((created.expires_at - ctx.clock.now()).total_seconds()))
    set_session_cookies(
        response, ctx, request, secret=created.secret, csrf=created.csrf_token, max_age=max_age
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
    return response


@router.post("/logout")
async def logout(request: Request, ctx: CtxDep, user: WebUserDep) -> Response:
    await read_form(request, csrf=user.csrf)
    async with ctx.db.transaction() as session:
        await session_services.revoke_web_session(session, caller=user.caller, now=ctx.clock.now())
    response = redirect("/login")
    clear_session_cookies(response, ctx, request)
    set_flash(response, text="You are logged out.")
    return response
