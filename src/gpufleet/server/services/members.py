"""Project members: who is in a project, with which role.

Admins add, change and remove members by hand (``source`` = ``manual``). Memberships an
IdP group grants (``oidc-group``) follow the group at every login, so they are changed
at the IdP, not here: a hand edit would be undone at the next login. A project always
keeps at least one admin.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.access import GROUP_SOURCE, MANUAL_SOURCE, Member
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import Role
from gpufleet.core.errors import Conflict, NotFound
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import MembershipRow, ProjectRow, UserRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.projects import get_project_row_or_error, get_user_row_or_error


def member_of(membership: MembershipRow, user: UserRow) -> Member:
    return Member(
        project_id=membership.project_id,
        user_id=user.id,
        user_name=user.name,
        email=user.email,
        unix_name=user.unix_name,
        role=Role(membership.role),
        source=membership.source,
        created_at=membership.created_at,
    )


async def list_members(session: AsyncSession, *, caller: Caller, project_ref: str) -> list[Member]:
    project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
    require(caller, Permission.MEMBER_READ, project.id)
    rows = await session.execute(
        select(MembershipRow, UserRow)
        .join(UserRow, UserRow.id == MembershipRow.user_id)
        .where(MembershipRow.project_id == project.id)
        .order_by(UserRow.name)
    )
    return [member_of(m, u) for m, u in rows]


async def _locked_project(session: AsyncSession, *, caller: Caller, project_ref: str) -> ProjectRow:
    """The project, locked for this transaction (PostgreSQL), so two admins demoting each
    other at once cannot leave it without one."""
    project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
    require(caller, Permission.MEMBER_MANAGE, project.id)
    await session.refresh(project, with_for_update=True)
    return project


async def _membership_or_error(
    session: AsyncSession, *, project: ProjectRow, user_ref: str
) -> tuple[MembershipRow, UserRow]:
    user = await get_user_row_or_error(session, ref=user_ref)
    membership = await session.get(MembershipRow, (project.id, user.id))
    if membership is None:
        raise NotFound(f"{user.name} is not a member of project {project.name}", field="user")
    return membership, user


def _refuse_group_membership(membership: MembershipRow, user: UserRow) -> None:
    if membership.source == GROUP_SOURCE:
        raise Conflict(
            f"{user.name}'s role comes from an IdP group (GPUFLEET_OIDC_GROUP_ROLES) and "
            "follows it at every login; change the group at the IdP or the mapping",
            field="user",
        )


async def _refuse_last_admin(
    session: AsyncSession, *, project: ProjectRow, membership: MembershipRow
) -> None:
    if membership.role != Role.ADMIN.value:
        return
    admins = await session.scalar(
        select(func.count())
        .select_from(MembershipRow)
        .where(MembershipRow.project_id == project.id, MembershipRow.role == Role.ADMIN.value)
    )
    if (admins or 0) <= 1:
        raise Conflict(
            f"project {project.name} must keep at least one admin; make another admin first",
            field="role",
        )


async def add_member(
    session: AsyncSession, *, caller: Caller, project_ref: str, user_ref: str, role: Role
) -> Member:
    project = await _locked_project(session, caller=caller, project_ref=project_ref)
    user = await get_user_row_or_error(session, ref=user_ref)
    existing = await session.get(MembershipRow, (project.id, user.id))
    if existing is not None:
        raise Conflict(
            f"{user.name} is already a {existing.role} of project {project.name}", field="user"
        )
    membership = MembershipRow(
        project_id=project.id,
        user_id=user.id,
        role=role.value,
        created_at=utcnow(),
        source=MANUAL_SOURCE,
    )
    session.add(membership)
    _audit(session, caller, "membership.create", project, user, {"role": role.value})
    return member_of(membership, user)


async def change_member_role(
    session: AsyncSession, *, caller: Caller, project_ref: str, user_ref: str, role: Role
) -> Member:
    project = await _locked_project(session, caller=caller, project_ref=project_ref)
    membership, user = await _membership_or_error(session, project=project, user_ref=user_ref)
    _refuse_group_membership(membership, user)
    if role is not Role.ADMIN:
        await _refuse_last_admin(session, project=project, membership=membership)
    old = membership.role
    membership.role = role.value
    _audit(session, caller, "membership.update", project, user, {"from": old, "role": role.value})
    return member_of(membership, user)


async def remove_member(
    session: AsyncSession, *, caller: Caller, project_ref: str, user_ref: str
) -> Member:
    project = await _locked_project(session, caller=caller, project_ref=project_ref)
    membership, user = await _membership_or_error(session, project=project, user_ref=user_ref)
    _refuse_group_membership(membership, user)
    await _refuse_last_admin(session, project=project, membership=membership)
    removed = member_of(membership, user)
    await session.delete(membership)
    _audit(session, caller, "membership.delete", project, user, {"role": membership.role})
    return removed


def _audit(
    session: AsyncSession,
    caller: Caller,
    action: str,
    project: ProjectRow,
    user: UserRow,
    detail: dict[str, str],
) -> None:
    record_audit(
        session,
        actor=caller.actor,
        action=action,
        object_type="membership",
        object_id=user.id,
        project_id=project.id,
        source_ip=caller.source_ip,
        detail={"user": user.name, **detail},
    )
