"""The audit log: one row for every mutation, with who, what, when, from where, result."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.clock import utcnow
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import AuditLogRow


def record_audit(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    object_type: str,
    object_id: str | None,
    project_id: str | None,
    source_ip: str | None = None,
    result: str = "ok",
    detail: dict[str, Any] | None = None,
) -> AuditLogRow:
    """Add an audit row to the session's transaction (written with the change itself)."""
    row = AuditLogRow(
        id=new_id(),
        ts=utcnow(),
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=object_id,
        project_id=project_id,
        source_ip=source_ip,
        result=result,
        detail=detail or {},
    )
    session.add(row)
    return row
