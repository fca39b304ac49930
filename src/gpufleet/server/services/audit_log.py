"""Reading the audit log: admins their projects' rows, the owner every row."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.access import AuditEntry
from gpufleet.core.errors import InvalidInput
from gpufleet.core.ids import is_id
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import AuditLogRow
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.projects import get_project_row_or_error


def audit_row_to_entry(row: AuditLogRow) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        ts=row.ts,
        actor=row.actor,
        action=row.action,
        object_type=row.object_type,
        object_id=row.object_id,
        project_id=row.project_id,
        source_ip=row.source_ip,
        result=row.result,
        request_id=row.request_id,
        detail=row.detail or {},
    )


async def query_audit(
    session: AsyncSession,
    *,
    project_ids: list[str] | None,
    actor: str | None = None,
    action: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[AuditEntry]:
    """Rows newest first. ``project_ids`` None: all rows (the owner), global ones too.

    ``action`` matches exactly, or a prefix when it ends in ``.`` or ``*``
    (``cluster.`` → every cluster action).
    """
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[AuditLogRow] = select(AuditLogRow)
    if project_ids is not None:
        query = query.where(AuditLogRow.project_id.in_(project_ids))
    if actor is not None:
        query = query.where(AuditLogRow.actor == actor)
    if action is not None:
        if action.endswith(("*", ".")):
            prefix = action.rstrip("*")
            query = query.where(AuditLogRow.action.startswith(prefix, autoescape=True))
        else:
            query = query.where(AuditLogRow.action == action)
    if since is not None:
        query = query.where(AuditLogRow.ts >= since)
    if until is not None:
        query = query.where(AuditLogRow.ts < until)
    if cursor is not None:
        query = query.where(AuditLogRow.id < cursor)
    rows = (await session.scalars(query.order_by(AuditLogRow.id.desc()).limit(limit + 1))).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[AuditEntry](
        items=[audit_row_to_entry(r) for r in rows], next_cursor=rows[-1].id if more else None
    )


async def list_audit(
    session: AsyncSession,
    *,
    caller: Caller,
    project_ref: str | None = None,
    actor: str | None = None,
    action: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[AuditEntry]:
    """Without ``project_ref``: every project where the caller reads the audit log; the
    owner also sees rows of no project (users, sessions, refusals of unknown objects)."""
    project_ids: list[str] | None
    if project_ref is not None:
        project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
        require(caller, Permission.AUDIT_READ, project.id)
        project_ids = [project.id]
    elif caller.acts_as_owner:
        project_ids = None
    else:
        visible = caller.visible_project_ids() or []
        project_ids = [p for p in visible if caller.can(Permission.AUDIT_READ, p)]
    return await query_audit(
        session,
        project_ids=project_ids,
        actor=actor,
        action=action,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
    )
