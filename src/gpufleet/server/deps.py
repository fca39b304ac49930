"""FastAPI dependencies: the app context and the authenticated caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gpufleet.core.errors import Unauthorized
from gpufleet.server.context import AppContext
from gpufleet.server.services.auth import Caller, resolve_caller


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


async def get_caller(request: Request, ctx: CtxDep) -> Caller:
    token = bearer_token(request)
    source_ip = request.client.host if request.client else None
    async with ctx.db.transaction() as session:
        return await resolve_caller(session, token=token, source_ip=source_ip)


CallerDep = Annotated[Caller, Depends(get_caller)]
