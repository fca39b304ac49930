"""Personal API tokens: create (shown once), list, revoke; and ``/me``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

import gpufleet.server.services.tokens as tokens_services
import gpufleet.server.services.users as users_services
from gpufleet.core.models import ApiToken, CreatedToken, Me
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep, SignedIn
from gpufleet.server.schemas.tokens import CreateTokenRequest
from gpufleet.server.services.auth import Caller

router = APIRouter(tags=["auth"])


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
async def create_token(
    body: CreateTokenRequest,
    caller: Annotated[Caller, Allow(Permission.TOKEN_CREATE)],
    ctx: CtxDep,
) -> CreatedToken:
    """The secret is in this answer and never again; the store keeps only its hash."""
    async with ctx.db.transaction() as session:
        return await tokens_services.create_token(
            session,
            caller=caller,
            name=body.name,
            project_ref=body.project,
            role=body.role,
            expires_in_days=body.expires_in_days,
            user_ref=body.user,
        )


@router.get("/tokens")
async def list_my_tokens(
    caller: SignedIn,
    ctx: CtxDep,
    revoked: bool = Query(default=False, description="Include revoked tokens."),
) -> list[ApiToken]:
    """The caller's own tokens (never their secrets)."""
    async with ctx.db.reader() as session:
        return await tokens_services.list_my_tokens(session, caller=caller, include_revoked=revoked)


@router.get("/projects/{project_ref}/tokens")
async def list_project_tokens(
    project_ref: str,
    caller: Annotated[Caller, Allow(Permission.TOKEN_MANAGE)],
    ctx: CtxDep,
    revoked: bool = Query(default=False, description="Include revoked tokens."),
) -> list[ApiToken]:
    """Every user's tokens scoped to the project."""
    async with ctx.db.reader() as session:
        return await tokens_services.list_project_tokens(
            session, caller=caller, project_ref=project_ref, include_revoked=revoked
        )


@router.delete("/tokens/{token_id}")
async def revoke_token(
    token_id: str,
    caller: Annotated[Caller, Allow(Permission.TOKEN_MANAGE, own=True)],
    ctx: CtxDep,
) -> ApiToken:
    """Revoke a token: your own, one scoped to a project you administer, or (the owner)
    any. It stops working at once."""
    async with ctx.db.transaction() as session:
        return await tokens_services.revoke_token(
            session, caller=caller, token_id=token_id, now=ctx.clock.now()
        )


@router.get("/me")
async def me(caller: SignedIn, ctx: CtxDep) -> Me:
    async with ctx.db.reader() as session:
        return await users_services.get_me(session, caller=caller)
