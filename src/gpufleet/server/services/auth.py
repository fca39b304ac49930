"""API tokens and who is calling.

Tokens are 256-bit random secrets shown once; the store keeps only their SHA-256. A
request's token is looked up by its hash (an index probe), so no secret is ever compared
byte by byte against stored ones.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.clock import utcnow
from gpufleet.core.credentials import Limits, Power, check_mint, inherit_limits, power_of
from gpufleet.core.enums import Role
from gpufleet.core.errors import Forbidden, InvalidInput, Unauthorized
from gpufleet.core.ids import new_id
from gpufleet.core.models import ApiToken, CreatedToken
from gpufleet.core.rbac import Permission, is_allowed
from gpufleet.server.db.tables import ApiTokenRow, MembershipRow, UserRow
from gpufleet.server.services.audit import record_audit

API_TOKEN_PREFIX = "gpf_"  # noqa: S105 - a prefix, not a secret
NODE_TOKEN_PREFIX = "gpfn_"  # noqa: S105 - a prefix, not a secret
MAX_TOKEN_DAYS = 3650


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def generate_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Caller:
    """An authenticated user, as one token presents them."""

    user_id: str
    user_name: str
    is_owner: bool
    token_id: str
    token_project_id: str | None
    token_role: Role | None
    memberships: dict[str, Role] = field(default_factory=dict)
    source_ip: str | None = None
    # "session": a console login (token_id is the session's id; CSRF rules apply).
    auth_method: Literal["token", "session"] = "token"
    # When the credential stops working; None: never (or a console login through the
    # IdP, the user's full session). What it creates can live no longer.
    token_expires_at: dt.datetime | None = None

    @property
    def actor(self) -> str:
        return f"user:{self.user_name}"

    @property
    def acts_as_owner(self) -> bool:
        # A project-scoped or role-capped token never carries the owner's global power.
        return self.is_owner and self.token_project_id is None and self.token_role is None

    @property
    def limits(self) -> Limits:
        """The credential's own limits, which bound every credential it creates."""
        return Limits(
            project_id=self.token_project_id,
            role=self.token_role,
            expires_at=self.token_expires_at,
        )

    def power_in(self, project_id: str | None) -> Power:
        """What this credential can do now in a project; for None, the most it can do
        anywhere it reaches."""
        if self.acts_as_owner:
            return Power.OWNER
        if project_id is None:
            reach = [self.token_project_id] if self.token_project_id else list(self.memberships)
            return max((power_of(self.role_in(p)) for p in reach), default=Power.NONE)
        return power_of(self.role_in(project_id))

    def role_in(self, project_id: str) -> Role | None:
        """The caller's effective role in a project: membership, capped by the token scope."""
        if self.token_project_id is not None and self.token_project_id != project_id:
            return None
        role = self.memberships.get(project_id)
        if role is None and self.is_owner and self.token_project_id == project_id:
            role = Role.ADMIN
        if role is None:
            return None
        if self.token_role is Role.MEMBER:
            return Role.MEMBER
        return role

    def can(self, permission: Permission, project_id: str) -> bool:
        return is_allowed(
            role=self.role_in(project_id), is_owner=self.acts_as_owner, permission=permission
        )

    def visible_project_ids(self) -> list[str] | None:
        """Projects this caller may see; None means all (the platform owner)."""
        if self.acts_as_owner:
            return None
        if self.token_project_id is not None:
            return [self.token_project_id] if self.role_in(self.token_project_id) else []
        return list(self.memberships)


def token_row_to_token(row: ApiTokenRow) -> ApiToken:
    return ApiToken(
        id=row.id,
        user_id=row.user_id,
        name=row.name,
        project_id=row.project_id,
        role=Role(row.role) if row.role else None,
        prefix=row.prefix,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )


async def load_memberships(session: AsyncSession, *, user_id: str) -> dict[str, Role]:
    """The user's role in each project they are in."""
    rows = await session.scalars(select(MembershipRow).where(MembershipRow.user_id == user_id))
    return {m.project_id: Role(m.role) for m in rows}


# The token, its user and the user's memberships in one statement of plain columns (no
# ORM objects to build): every API request starts here, and on PostgreSQL each statement
# is a round trip. Built once: building the expression and its cache key each request
# cost more than running it.
_CALLER_BY_TOKEN = (
    select(
        ApiTokenRow.id,
        ApiTokenRow.revoked_at,
        ApiTokenRow.expires_at,
        ApiTokenRow.last_used_at,
        ApiTokenRow.project_id,
        ApiTokenRow.role,
        UserRow.id.label("user_id"),
        UserRow.name.label("user_name"),
        UserRow.is_owner,
        MembershipRow.project_id.label("member_of"),
        MembershipRow.role.label("member_role"),
    )
    .outerjoin(UserRow, UserRow.id == ApiTokenRow.user_id)
    .outerjoin(MembershipRow, MembershipRow.user_id == ApiTokenRow.user_id)
    .where(ApiTokenRow.token_hash == bindparam("token_hash"))
)


async def resolve_caller(
    session: AsyncSession, *, token: str, source_ip: str | None = None
) -> Caller:
    """The caller behind a bearer token, or ``Unauthorized``."""
    if not token.startswith(API_TOKEN_PREFIX):
        raise Unauthorized("not an API token (node tokens only work on agent endpoints)")
    found = (await session.execute(_CALLER_BY_TOKEN, {"token_hash": hash_token(token)})).all()
    now = utcnow()
    row = found[0] if found else None
    if row is None or row.revoked_at is not None:
        raise Unauthorized("invalid or revoked token")
    expires_at = row.expires_at
    if expires_at is not None and expires_at <= now:
        raise Unauthorized("token expired")
    if row.user_id is None:
        raise Unauthorized("token's user no longer exists")
    memberships = {r.member_of: Role(r.member_role) for r in found if r.member_of is not None}
    # last_used_at at minute resolution: one write per token per minute, not per request.
    if row.last_used_at is None or (now - row.last_used_at) > dt.timedelta(minutes=1):
        await session.execute(
            update(ApiTokenRow).where(ApiTokenRow.id == row.id).values(last_used_at=now)
        )
    return Caller(
        user_id=row.user_id,
        user_name=row.user_name,
        is_owner=bool(row.is_owner),
        token_id=row.id,
        token_project_id=row.project_id,
        token_role=Role(row.role) if row.role else None,
        memberships=memberships,
        source_ip=source_ip,
        token_expires_at=expires_at,
    )


async def create_api_token(
    session: AsyncSession,
    *,
    caller: Caller | None,
    user_id: str,
    name: str,
    project_id: str | None,
    role: Role | None,
    expires_in_days: int | None,
) -> CreatedToken:
    """Mint a token for ``user_id``. A caller can mint only within their own powers and
    their credential's limits (``core.credentials``): what the request leaves out (project,
    role, expiry) it inherits from the caller's credential."""
    if expires_in_days is not None and not 1 <= expires_in_days <= MAX_TOKEN_DAYS:
        raise InvalidInput(
            f"expires_in_days must be between 1 and {MAX_TOKEN_DAYS}", field="expires_in_days"
        )
    now = utcnow()
    expires_at = now + dt.timedelta(days=expires_in_days) if expires_in_days else None
    if caller is not None:
        wanted = inherit_limits(
            caller.limits, project_id=project_id, role=role, expires_at=expires_at
        )
        project_id, role, expires_at = wanted.project_id, wanted.role, wanted.expires_at
        if project_id is None and not caller.acts_as_owner:
            raise InvalidInput(
                "only the platform owner may create a token without a project", field="project"
            )
        check_mint(caller.limits, wanted)
        if project_id is not None:
            current = caller.role_in(project_id)
            if current is None and not caller.acts_as_owner:
                raise Forbidden("you are not in that project")
            if role is Role.ADMIN and current is not Role.ADMIN and not caller.acts_as_owner:
                raise Forbidden("a member cannot create an admin token", field="role")
    secret = generate_token(API_TOKEN_PREFIX)
    row = ApiTokenRow(
        id=new_id(),
        user_id=user_id,
        name=name,
        token_hash=hash_token(secret),
        prefix=secret[:12],
        project_id=project_id,
        role=role.value if role else None,
        created_at=now,
        expires_at=expires_at,
        revoked_at=None,
        last_used_at=None,
    )
    session.add(row)
    record_audit(
        session,
        actor=caller.actor if caller else "system:bootstrap",
        action="token.create",
        object_type="api_token",
        object_id=row.id,
        project_id=project_id,
        source_ip=caller.source_ip if caller else None,
        detail={
            "name": name,
            "role": role.value if role else None,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    return CreatedToken(token=secret, info=token_row_to_token(row))


async def bootstrap_owner(session: AsyncSession, *, name: str = "admin") -> CreatedToken | None:
    """On the very first start, create the platform owner and one token for them.

    Returns the token (to print once), or None when users already exist.
    """
    if await session.scalar(select(UserRow.id).limit(1)) is not None:
        return None
    user = UserRow(id=new_id(), name=name, email=None, is_owner=True, created_at=utcnow())
    session.add(user)
    await session.flush()
    record_audit(
        session,
        actor="system:bootstrap",
        action="user.create",
        object_type="user",
        object_id=user.id,
        project_id=None,
        detail={"name": name, "is_owner": True},
    )
    return await create_api_token(
        session,
        caller=None,
        user_id=user.id,
        name="bootstrap",
        project_id=None,
        role=None,
        expires_in_days=None,
    )


def require(caller: Caller, permission: Permission, project_id: str) -> None:
    """Raise unless the caller holds ``permission`` in the project.

    A caller who cannot even see the project gets NotFound from the lookup before this;
    here a visible project with too small a role gives Forbidden.
    """
    if not caller.can(permission, project_id):
        raise Forbidden(f"your role in this project does not allow {permission.value}")
