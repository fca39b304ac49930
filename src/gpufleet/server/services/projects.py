"""Projects: the collaboration and isolation boundary."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.access import MANUAL_SOURCE
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import EventKind, Role
from gpufleet.core.errors import Conflict, Forbidden, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Page, Project
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import MembershipRow, ProjectRow, UserRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.events import record_event


def project_row_to_project(row: ProjectRow) -> Project:
    return Project(id=row.id, name=row.name, description=row.description, created_at=row.created_at)


async def get_project_row_or_error(
    session: AsyncSession, *, caller: Caller, ref: str, field: str = "project"
) -> ProjectRow:
    """A project by id or name that the caller can see; NotFound otherwise (no leak)."""
    query = select(ProjectRow).where(
        or_(ProjectRow.id == ref, ProjectRow.name == ref) if is_id(ref) else ProjectRow.name == ref
    )
    row = await session.scalar(query)
    if row is None or not caller.can(Permission.PROJECT_READ, row.id):
        raise NotFound(f"project {ref!r} not found", field=field)
    return row


async def get_project_row_for(
    session: AsyncSession, *, caller: Caller, ref: str, permission: Permission
) -> ProjectRow:
    """A project the caller can see (NotFound otherwise) and holds ``permission`` in
    (Forbidden otherwise)."""
    project = await get_project_row_or_error(session, caller=caller, ref=ref)
    require(caller, permission, project.id)
    return project


async def get_user_row_or_error(session: AsyncSession, *, ref: str, field: str = "user") -> UserRow:
    """A user by id or name."""
    match = or_(UserRow.id == ref, UserRow.name == ref) if is_id(ref) else UserRow.name == ref
    row = await session.scalar(select(UserRow).where(match))
    if row is None:
        raise NotFound(f"user {ref!r} not found", field=field)
    return row


async def list_projects(session: AsyncSession, *, caller: Caller) -> Page[Project]:
    query = select(ProjectRow).order_by(ProjectRow.name)
    visible = caller.visible_project_ids()
    if visible is not None:
        query = query.where(ProjectRow.id.in_(visible))
    rows = (await session.scalars(query)).all()
    return Page[Project](items=[project_row_to_project(r) for r in rows], next_cursor=None)


async def create_project(
    session: AsyncSession,
    *,
    caller: Caller,
    name: str,
    description: str,
    first_admin: str | None = None,
) -> Project:
    """Only the platform owner creates projects; they name the first admin (default: self)
    by user id or name."""
    if not caller.acts_as_owner:
        raise Forbidden("only the platform owner can create projects")
    if await session.scalar(select(ProjectRow.id).where(ProjectRow.name == name)):
        raise Conflict(f"a project named {name!r} already exists", field="name")
    admin_id = caller.user_id
    if first_admin is not None:
        admin_id = (await get_user_row_or_error(session, ref=first_admin, field="first_admin")).id
    now = utcnow()
    row = ProjectRow(id=new_id(), name=name, description=description, created_at=now)
    session.add(row)
    await session.flush()
    session.add(
        MembershipRow(
            project_id=row.id,
            user_id=admin_id,
            role=Role.ADMIN.value,
            created_at=now,
            source=MANUAL_SOURCE,
        )
    )
    record_event(
        session,
        kind=EventKind.PROJECT_CREATED,
        message=f"project {name} created",
        project_id=row.id,
        actor=caller.actor,
    )
    record_audit(
        session,
        actor=caller.actor,
        action="project.create",
        object_type="project",
        object_id=row.id,
        project_id=row.id,
        source_ip=caller.source_ip,
        detail={"name": name, "first_admin": admin_id},
    )
    return project_row_to_project(row)


async def get_project(session: AsyncSession, *, caller: Caller, ref: str) -> Project:
    row = await get_project_row_or_error(session, caller=caller, ref=ref)
    require(caller, Permission.PROJECT_READ, row.id)
    return project_row_to_project(row)
