"""OIDC logins on the store side: logins in flight, users by (issuer, sub), group roles.

A user is found by the issuer-qualified subject only (``<issuer>#<sub>``), never by
e-mail or name: an IdP account can never take over an existing gpufleet user by
claiming the same address. Memberships granted by an IdP group (``source`` =
``oidc-group``) follow the group at every login; memberships made by hand are left as
they are. Every change is an audit row.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import Role
from gpufleet.core.errors import InvalidInput, Unauthorized
from gpufleet.core.ids import new_id
from gpufleet.core.models import CreatedToken
from gpufleet.core.slurm_admins import unix_name_from
from gpufleet.server.db.tables import (
    MembershipRow,
    OidcLoginRow,
    OidcTokenUseRow,
    ProjectRow,
    UserRow,
)
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, create_api_token, hash_token, load_memberships
from gpufleet.server.services.oidc import IdTokenClaims
from gpufleet.server.services.projects import get_project_row_or_error
from gpufleet.server.services.sessions import CreatedSession, create_web_session

log = logging.getLogger(__name__)

LOGIN_TTL_S = 600.0  # time to get through the IdP's login page
GROUP_SOURCE = "oidc-group"
OIDC_ACTOR = "system:oidc"
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._@-]+")


@dataclass(frozen=True)
class PendingLogin:
    nonce: str
    code_verifier: str
    return_to: str


async def start_login(
    session: AsyncSession,
    *,
    state: str,
    nonce: str,
    code_verifier: str,
    return_to: str,
    now: dt.datetime,
) -> None:
    """Remember a login until its callback (by the state's hash); drop stale ones."""
    await session.execute(delete(OidcLoginRow).where(OidcLoginRow.expires_at <= now))
    session.add(
        OidcLoginRow(
            id=new_id(),
            state_hash=hash_token(state),
            nonce=nonce,
            code_verifier=code_verifier,
            return_to=return_to,
            created_at=now,
            expires_at=now + dt.timedelta(seconds=LOGIN_TTL_S),
        )
    )


async def take_login(session: AsyncSession, *, state: str, now: dt.datetime) -> PendingLogin:
    """The login this state belongs to, removed so that it can be used only once."""
    row = await session.scalar(
        select(OidcLoginRow).where(OidcLoginRow.state_hash == hash_token(state))
    )
    if row is None:
        raise InvalidInput(
            "unknown or already used login state; start again at /api/v1/auth/login",
            field="state",
        )
    await session.delete(row)
    if row.expires_at <= now:
        raise InvalidInput(
            "this login took too long; start again at /api/v1/auth/login", field="state"
        )
    return PendingLogin(nonce=row.nonce, code_verifier=row.code_verifier, return_to=row.return_to)


async def use_id_token_once(
    session: AsyncSession, *, token: str, expires_at: dt.datetime, now: dt.datetime
) -> None:
    """Refuse an ID token already exchanged for an API token (replay)."""
    await session.execute(delete(OidcTokenUseRow).where(OidcTokenUseRow.expires_at <= now))
    token_hash = hash_token(token)
    if await session.get(OidcTokenUseRow, token_hash) is not None:
        raise Unauthorized("this ID token was already exchanged; log in again", field="id_token")
    session.add(OidcTokenUseRow(token_hash=token_hash, expires_at=expires_at))
    try:
        await session.flush()
    except IntegrityError as exc:  # the same token, exchanged concurrently
        raise Unauthorized(
            "this ID token was already exchanged; log in again", field="id_token"
        ) from exc


def oidc_subject(claims: IdTokenClaims) -> str:
    # Issuers are URLs without fragments (OIDC Discovery §3), so '#' cannot be ambiguous.
    return f"{claims.issuer}#{claims.subject}"


async def _free_name(session: AsyncSession, claims: IdTokenClaims) -> str:
    base = claims.preferred_username or (claims.email or "").split("@")[0] or claims.subject
    base = _NAME_CHARS.sub("-", base).strip("-")[:100] or "user"
    if await session.scalar(select(UserRow.id).where(UserRow.name == base)) is None:
        return base
    # Someone (maybe from another issuer) has it: a stable suffix from the subject.
    suffix = hashlib.sha256(oidc_subject(claims).encode()).hexdigest()[:8]
    return f"{base}-{suffix}"


async def _free_unix_name(session: AsyncSession, claims: IdTokenClaims) -> str | None:
    """The account name on cluster nodes, from preferred_username; None when it is taken
    (the owner then sets one: two people must never share a Unix account)."""
    name = unix_name_from(claims.preferred_username, claims.email)
    if name is None:
        return None
    taken = await session.scalar(select(UserRow.id).where(UserRow.unix_name == name))
    return None if taken is not None else name


async def upsert_oidc_user(
    session: AsyncSession, *, claims: IdTokenClaims, now: dt.datetime, source_ip: str | None
) -> UserRow:
    """The gpufleet user of this (issuer, sub), created on first login."""
    subject = oidc_subject(claims)
    user = await session.scalar(select(UserRow).where(UserRow.oidc_subject == subject))
    if user is not None:
        if claims.email and claims.email != user.email:
            user.email = claims.email
        return user
    user = UserRow(
        id=new_id(),
        name=await _free_name(session, claims),
        email=claims.email,
        is_owner=False,
        oidc_subject=subject,
        unix_name=await _free_unix_name(session, claims),
        created_at=now,
    )
    session.add(user)
    await session.flush()
    record_audit(
        session,
        actor=OIDC_ACTOR,
        action="user.create",
        object_type="user",
        object_id=user.id,
        project_id=None,
        source_ip=source_ip,
        detail={"name": user.name, "issuer": claims.issuer, "unix_name": user.unix_name},
    )
    return user


def _wanted_roles(
    groups: tuple[str, ...], group_roles: dict[str, str]
) -> dict[str, tuple[Role, str]]:
    """Project name → (role, the group granting it) from the user's groups; admin wins."""
    wanted: dict[str, tuple[Role, str]] = {}
    for group in groups:
        target = group_roles.get(group)
        if target is None:
            continue
        project, _, role_name = target.partition(":")
        role = Role(role_name)
        if project not in wanted or wanted[project][0] is not Role.ADMIN:
            wanted[project] = (role, group)
    return wanted


async def sync_group_memberships(
    session: AsyncSession,
    *,
    user: UserRow,
    groups: tuple[str, ...],
    group_roles: dict[str, str],
    now: dt.datetime,
    source_ip: str | None,
) -> None:
    """Make the user's group-granted memberships match their groups right now."""
    wanted = _wanted_roles(groups, group_roles)
    projects = {
        p.name: p.id
        for p in await session.scalars(select(ProjectRow).where(ProjectRow.name.in_(wanted)))
    }
    for name in sorted(set(wanted) - set(projects)):
        log.warning("oidc: the group mapping names project %r, which does not exist", name)
    current = {
        m.project_id: m
        for m in await session.scalars(
            select(MembershipRow).where(MembershipRow.user_id == user.id)
        )
    }
    wanted_ids = {projects[name]: grant for name, grant in wanted.items() if name in projects}

    def audit(action: str, project_id: str, detail: dict[str, str]) -> None:
        record_audit(
            session,
            actor=OIDC_ACTOR,
            action=action,
            object_type="membership",
            object_id=user.id,
            project_id=project_id,
            source_ip=source_ip,
            detail={"user": user.name, **detail},
        )

    for project_id, (role, group) in wanted_ids.items():
        membership = current.get(project_id)
        if membership is None:
            session.add(
                MembershipRow(
                    project_id=project_id,
                    user_id=user.id,
                    role=role.value,
                    created_at=now,
                    source=GROUP_SOURCE,
                )
            )
            audit("membership.create", project_id, {"role": role.value, "group": group})
        elif membership.source == GROUP_SOURCE and membership.role != role.value:
            audit(
                "membership.update",
                project_id,
                {"from": membership.role, "role": role.value, "group": group},
            )
            membership.role = role.value
    for project_id, membership in current.items():
        if membership.source == GROUP_SOURCE and project_id not in wanted_ids:
            await session.delete(membership)
            audit("membership.delete", project_id, {"role": membership.role, "group": "(none now)"})


async def create_cli_token(
    session: AsyncSession,
    *,
    user: UserRow,
    project_ref: str | None,
    role: Role | None,
    name: str,
    expires_in_days: int,
    source_ip: str | None,
) -> CreatedToken:
    """The personal API token ``gpufleet login --oidc`` gets for a verified ID token.

    Without a project, the owner gets an unscoped token and a user in exactly one
    project a token for it; anyone else must name the project (tokens are scoped).
    """
    caller = Caller(
        user_id=user.id,
        user_name=user.name,
        is_owner=user.is_owner,
        token_id="",
        token_project_id=None,
        token_role=None,
        memberships=await load_memberships(session, user_id=user.id),
        source_ip=source_ip,
    )
    project_id: str | None = None
    if project_ref is not None:
        project_id = (await get_project_row_or_error(session, caller=caller, ref=project_ref)).id
    elif not caller.acts_as_owner:
        if len(caller.memberships) != 1:
            names = sorted(
                (
                    await session.scalars(
                        select(ProjectRow.name).where(ProjectRow.id.in_(caller.memberships))
                    )
                ).all()
            )
            raise InvalidInput(
                "name the project the token is for (--project): "
                + (", ".join(names) if names else "you are in no project yet; ask an admin"),
                field="project",
            )
        project_id = next(iter(caller.memberships))
    return await create_api_token(
        session,
        caller=caller,
        user_id=user.id,
        name=name,
        project_id=project_id,
        role=role,
        expires_in_days=expires_in_days,
    )


async def finish_login(
    session: AsyncSession,
    *,
    claims: IdTokenClaims,
    group_roles: dict[str, str],
    lifetime_s: float,
    now: dt.datetime,
    source_ip: str | None,
) -> CreatedSession:
    """After a verified callback: the user, their group roles, and a new console session."""
    user = await upsert_oidc_user(session, claims=claims, now=now, source_ip=source_ip)
    await sync_group_memberships(
        session,
        user=user,
        groups=claims.groups,
        group_roles=group_roles,
        now=now,
        source_ip=source_ip,
    )
    return await create_web_session(
        session, user=user, now=now, lifetime_s=lifetime_s, source_ip=source_ip
    )


async def exchange_id_token(
    session: AsyncSession,
    *,
    id_token: str,
    claims: IdTokenClaims,
    group_roles: dict[str, str],
    project_ref: str | None,
    role: Role | None,
    name: str,
    expires_in_days: int,
    now: dt.datetime,
    source_ip: str | None,
) -> CreatedToken:
    """The CLI's device login: a verified ID token, once, for a personal API token."""
    await use_id_token_once(session, token=id_token, expires_at=claims.expires_at, now=now)
    user = await upsert_oidc_user(session, claims=claims, now=now, source_ip=source_ip)
    await sync_group_memberships(
        session,
        user=user,
        groups=claims.groups,
        group_roles=group_roles,
        now=now,
        source_ip=source_ip,
    )
    return await create_cli_token(
        session,
        user=user,
        project_ref=project_ref,
        role=role,
        name=name,
        expires_in_days=expires_in_days,
        source_ip=source_ip,
    )
