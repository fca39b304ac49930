"""Personal API tokens: list, revoke (creation is in ``services/auth.py``).

A token can be revoked by its user, by an admin of the project it is scoped to, and by
the platform owner — each only with a credential that has at least the token's power
and life (``core.credentials``), so a capped or short-lived token cannot take away a
stronger one. Revocation is checked on every request, so a revoked token fails at once
(401). The secret is never stored or shown again: only its first characters.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.credentials import check_revoke
from gpufleet.core.enums import Role
from gpufleet.core.errors import Forbidden, InvalidInput, NotFound
from gpufleet.core.ids import is_id
from gpufleet.core.models import ApiToken, CreatedToken
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import ApiTokenRow, MembershipRow, UserRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import (
    Caller,
    create_api_token,
    load_memberships,
    require,
    token_row_to_token,
)
from gpufleet.server.services.projects import get_project_row_or_error, get_user_row_or_error


def _with_user(row: ApiTokenRow, user_name: str | None) -> ApiToken:
    return token_row_to_token(row).model_copy(update={"user_name": user_name})


async def list_my_tokens(
    session: AsyncSession, *, caller: Caller, include_revoked: bool = False
) -> list[ApiToken]:
    query = select(ApiTokenRow).where(ApiTokenRow.user_id == caller.user_id)
    if not include_revoked:
        query = query.where(ApiTokenRow.revoked_at.is_(None))
    rows = await session.scalars(query.order_by(ApiTokenRow.created_at))
    return [_with_user(r, caller.user_name) for r in rows]


async def list_project_tokens(
    session: AsyncSession, *, caller: Caller, project_ref: str, include_revoked: bool = False
) -> list[ApiToken]:
    """Every user's tokens scoped to the project (its admins and the owner)."""
    project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
    require(caller, Permission.TOKEN_MANAGE, project.id)
    query = (
        select(ApiTokenRow, UserRow.name)
        .join(UserRow, UserRow.id == ApiTokenRow.user_id)
        .where(ApiTokenRow.project_id == project.id)
    )
    if not include_revoked:
        query = query.where(ApiTokenRow.revoked_at.is_(None))
    rows = await session.execute(query.order_by(ApiTokenRow.created_at))
    return [_with_user(row, name) for row, name in rows]


async def revoke_token(
    session: AsyncSession, *, caller: Caller, token_id: str, now: dt.datetime
) -> ApiToken:
    """Revoke now. Revoking a revoked token changes nothing and says so."""
    row = await session.get(ApiTokenRow, token_id) if is_id(token_id) else None
    if row is None:
        raise NotFound(f"token {token_id!r} not found", field="token_id")
    if row.user_id != caller.user_id and not caller.acts_as_owner:
        if row.project_id is None or caller.role_in(row.project_id) is None:
            raise NotFound(f"token {token_id!r} not found", field="token_id")
        if not caller.can(Permission.TOKEN_MANAGE, row.project_id):
            raise Forbidden("only the project's admins may revoke another user's token")
    user = await session.get(UserRow, row.user_id)
    user_name = user.name if user is not None else None
    already = row.revoked_at is not None
    if not already:
        target = await _as_caller(session, row=row, user=user)
        check_revoke(
            holder=caller.limits,
            holder_power=caller.power_in(row.project_id),
            target=target.limits,
            target_power=target.power_in(row.project_id),
        )
        row.revoked_at = now
    record_audit(
        session,
        actor=caller.actor,
        action="token.revoke",
        object_type="api_token",
        object_id=row.id,
        project_id=row.project_id,
        source_ip=caller.source_ip,
        detail={"name": row.name, "user": user_name, "prefix": row.prefix, "already": already},
    )
    return _with_user(row, user_name)


async def _as_caller(session: AsyncSession, *, row: ApiTokenRow, user: UserRow | None) -> Caller:
    """The token as the caller it presents (its power now, for the revocation rule)."""
    return Caller(
        user_id=row.user_id,
        user_name=user.name if user is not None else "",
        is_owner=user is not None and user.is_owner,
        token_id=row.id,
        token_project_id=row.project_id,
        token_role=Role(row.role) if row.role else None,
        memberships=await load_memberships(session, user_id=row.user_id) if user else {},
        token_expires_at=row.expires_at,
    )


async def create_token(
    session: AsyncSession,
    *,
    caller: Caller,
    name: str,
    project_ref: str | None,
    role: Role | None,
    expires_in_days: int | None,
    user_ref: str | None = None,
) -> CreatedToken:
    """A personal token for the caller, or (the owner only) for another user: on a server
    without OIDC, that is how a user gets their first token."""
    project_id = None
    if project_ref is not None:
        project_id = (await get_project_row_or_error(session, caller=caller, ref=project_ref)).id
    user_id = caller.user_id
    if user_ref is not None:
        user = await get_user_row_or_error(session, ref=user_ref)
        if user.id != caller.user_id:
            if not caller.acts_as_owner:
                raise Forbidden(
                    "only the platform owner may create tokens for others", field="user"
                )
            if project_id is None:
                raise InvalidInput("a token for another user needs a project", field="project")
            if await session.get(MembershipRow, (project_id, user.id)) is None:
                raise InvalidInput(
                    f"{user.name} is not in that project; add them first", field="user"
                )
        user_id = user.id
    return await create_api_token(
        session,
        caller=caller,
        user_id=user_id,
        name=name,
        project_id=project_id,
        role=role,
        expires_in_days=expires_in_days,
    )
