"""Users: the platform owner's view (list, create, set Unix names)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

import gpufleet.server.services.users as users_services
from gpufleet.core.models import User
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.users import CreateUserRequest, UpdateUserRequest
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/users", tags=["users"])


@router.get("")
async def list_users(
    caller: Annotated[Caller, Allow(Permission.USER_READ)], ctx: CtxDep
) -> list[User]:
    async with ctx.db.reader() as session:
        return await users_services.list_users(session, caller=caller)


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_user(
    body: CreateUserRequest,
    caller: Annotated[Caller, Allow(Permission.USER_MANAGE)],
    ctx: CtxDep,
) -> User:
    """A user without OIDC (a server without an IdP, a service account)."""
    async with ctx.db.transaction() as session:
        return await users_services.create_user(
            session, caller=caller, name=body.name, email=body.email, unix_name=body.unix_name
        )


@router.patch("/{user_ref}")
async def update_user(
    user_ref: str,
    body: UpdateUserRequest,
    caller: Annotated[Caller, Allow(Permission.USER_MANAGE)],
    ctx: CtxDep,
) -> User:
    """Set a user's Unix name (``null`` removes it)."""
    async with ctx.db.transaction() as session:
        return await users_services.update_user(
            session,
            caller=caller,
            user_ref=user_ref,
            unix_name=body.unix_name,
            clear_unix_name="unix_name" in body.model_fields_set and body.unix_name is None,
        )
