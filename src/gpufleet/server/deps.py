"""FastAPI dependencies: the app context and the authenticated caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gpufleet.core.errors import Unauthorized
from gpufleet.server.context import AppContext
from gpufleet.server.services.auth import Caller, resolve_caller
from gpufleet.server.services.sessions import (
    CSRF_HEADER,
    SAFE_METHODS,
    SESSION_COOKIE,
    check_csrf,
    resolve_session_caller,
)


async def get_ctx(request: Request) -> AppContext:  # async: no threadpool hop per request
    ctx: AppContext = request.app.state.ctx
    return ctx


CtxDep = Annotated[AppContext, Depends(get_ctx)]


def bearer_token(request: Request) -> str:  # called directly, not as a dependency
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    return token.strip()


def client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


async def get_caller(request: Request, ctx: CtxDep) -> Caller:
    """The caller by bearer token, else by console session cookie (with CSRF rules).

    A bearer token wins when both come: API clients are never subject to the cookie's
    CSRF check, and a browser cannot be made to send an Authorization header cross-site.
    """
    source_ip = client_ip(request)
    secret = request.cookies.get(SESSION_COOKIE)
    if "authorization" in request.headers or not secret:
        token = bearer_token(request)
        async with ctx.db.transaction() as session:
            return await resolve_caller(session, token=token, source_ip=source_ip)
    if request.method not in SAFE_METHODS:
        check_csrf(secret=secret, header=request.headers.get(CSRF_HEADER))
    async with ctx.db.transaction() as session:
        return await resolve_session_caller(
            session, secret=secret, now=ctx.clock.now(), source_ip=source_ip
        )


CallerDep = Annotated[Caller, Depends(get_caller)]
