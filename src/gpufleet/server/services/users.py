"""Users, as the platform owner manages them.

Most users appear on their first OIDC login. The owner may also create users by hand
(a server without OIDC, a service account) and set anyone's Unix name: the account the
sudoers fragment and Slurm's AdminLevel name on the project's clusters.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.clock import utcnow
from gpufleet.core.errors import Conflict, Forbidden, Unauthorized
from gpufleet.core.ids import new_id
from gpufleet.core.models import CallerToken, Me, Membership, User
from gpufleet.server.db.tables import UserRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.projects import get_user_row_or_error


async def get_signed_in_user(session: AsyncSession, *, caller: Caller) -> User:
    """The caller's own user; Unauthorized if it is gone since the credential was read."""
    row = await session.get(UserRow, caller.user_id)
    if row is None:
        raise Unauthorized("your user no longer exists")
    return User.model_validate(row)


async def get_me(session: AsyncSession, *, caller: Caller) -> Me:
    """Who the credential belongs to, the projects they are in, and the token's scope."""
    return Me(
        user=await get_signed_in_user(session, caller=caller),
        memberships=[
            Membership(project_id=p, user_id=caller.user_id, role=r)
            for p, r in caller.memberships.items()
        ],
        token=CallerToken(
            id=caller.token_id, project_id=caller.token_project_id, role=caller.token_role
        ),
    )


def _require_owner(caller: Caller) -> None:
    if not caller.acts_as_owner:
        raise Forbidden("only the platform owner manages users")


async def list_users(session: AsyncSession, *, caller: Caller) -> list[User]:
    _require_owner(caller)
    rows = await session.scalars(select(UserRow).order_by(UserRow.name))
    return [User.model_validate(r) for r in rows]


async def _refuse_taken_unix_name(
    session: AsyncSession, *, unix_name: str, user_id: str | None
) -> None:
    holder = await session.scalar(select(UserRow).where(UserRow.unix_name == unix_name))
    if holder is not None and holder.id != user_id:
        raise Conflict(f"Unix name {unix_name!r} belongs to {holder.name}", field="unix_name")


async def create_user(
    session: AsyncSession,
    *,
    caller: Caller,
    name: str,
    email: str | None,
    unix_name: str | None,
) -> User:
    _require_owner(caller)
    if await session.scalar(select(UserRow.id).where(UserRow.name == name)) is not None:
        raise Conflict(f"a user named {name!r} already exists", field="name")
    if unix_name is not None:
        await _refuse_taken_unix_name(session, unix_name=unix_name, user_id=None)
    row = UserRow(
        id=new_id(),
        name=name,
        email=email,
        is_owner=False,
        unix_name=unix_name,
        created_at=utcnow(),
    )
    session.add(row)
    record_audit(
        session,
        actor=caller.actor,
        action="user.create",
        object_type="user",
        object_id=row.id,
        project_id=None,
        source_ip=caller.source_ip,
        detail={"name": name, "unix_name": unix_name},
    )
    return User.model_validate(row)


async def update_user(
    session: AsyncSession,
    *,
    caller: Caller,
    user_ref: str,
    unix_name: str | None,
    clear_unix_name: bool,
) -> User:
    """Set (or with ``clear_unix_name`` remove) a user's Unix name."""
    _require_owner(caller)
    row = await get_user_row_or_error(session, ref=user_ref)
    old = row.unix_name
    if clear_unix_name:
        row.unix_name = None
    elif unix_name is not None:
        await _refuse_taken_unix_name(session, unix_name=unix_name, user_id=row.id)
        row.unix_name = unix_name
    record_audit(
        session,
        actor=caller.actor,
        action="user.update",
        object_type="user",
        object_id=row.id,
        project_id=None,
        source_ip=caller.source_ip,
        detail={"name": row.name, "unix_name": {"from": old, "to": row.unix_name}},
    )
    return User.model_validate(row)
