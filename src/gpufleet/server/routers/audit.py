"""The audit log, for project admins (their projects' rows) and the owner (all rows)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.audit_log as audit_services
from gpufleet.core.access import AuditEntry
from gpufleet.core.errors import InvalidInput
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("")
async def list_audit(
    caller: Annotated[Caller, Allow(Permission.AUDIT_READ)],
    ctx: CtxDep,
    project: str | None = Query(default=None, max_length=63),
    actor: str | None = Query(default=None, max_length=128, description="e.g. user:alice"),
    action: str | None = Query(
        default=None, max_length=64, description="exact, or a prefix ending in . or *"
    ),
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Page[AuditEntry]:
    """Newest first; ``cursor`` is the last page's ``next_cursor``."""
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{name} needs a timezone (e.g. 2026-01-01T00:00:00Z)", field=name)
    async with ctx.db.reader() as session:
        return await audit_services.list_audit(
            session,
            caller=caller,
            project_ref=project,
            actor=actor,
            action=action,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )
