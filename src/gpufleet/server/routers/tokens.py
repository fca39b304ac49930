from __future__ import annotations

from typing import Any

from fastapi import APIRouter, status
from sqlalchemy import select

import gpufleet.server.services.auth as auth_services
from gpufleet.core.models import CreatedToken, Membership, User
from gpufleet.server.db.tables import UserRow
from gpufleet.server.deps import CallerDep, CtxDep
from gpufleet.server.schemas.tokens import CreateTokenRequest
from gpufleet.server.services.projects import get_project_row_or_error

router = APIRouter(tags=["auth"])


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
async def create_token(body: CreateTokenRequest, caller: CallerDep, ctx: CtxDep) -> CreatedToken:
    async with ctx.db.transaction() as session:
        project_id = None
        if body.project is not None:
            project_id = (
                await get_project_row_or_error(session, caller=caller, ref=body.project)
            ).id
        return await auth_services.create_api_token(
            session,
            caller=caller,
            user_id=caller.user_id,
            name=body.name,
            project_id=project_id,
            role=body.role,
            expires_in_days=body.expires_in_days,
        )


@router.get("/me")
async def me(caller: CallerDep, ctx: CtxDep) -> dict[str, Any]:
    async with ctx.db.session() as session:
        user = await session.scalar(select(UserRow).where(UserRow.id == caller.user_id))
    assert user is not None
    return {
        "user": User.model_validate(user).model_dump(mode="json"),
        "memberships": [
            Membership(project_id=p, user_id=caller.user_id, role=r).model_dump(mode="json")
            for p, r in caller.memberships.items()
        ],
        "token": {
            "id": caller.token_id,
            "project_id": caller.token_project_id,
            "role": caller.token_role.value if caller.token_role else None,
        },
    }
