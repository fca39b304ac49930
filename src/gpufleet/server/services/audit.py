"""The audit log: one row for every mutation, with who, what, when, from where, result.

Services write the rows of what they change, in the same transaction as the change
(``record_audit``). The request each row came from (``request_id``, also sent back as
``X-Request-ID``) and the client address come from the request context that
``server/requests.py`` sets for every HTTP request, so no service has to pass them on.
Refused attempts (403/404/409/422 after the caller was known) are written by that
middleware in a transaction of their own: the refused operation itself writes nothing.
"""

from __future__ import annotations

import contextvars
import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.clock import utcnow
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import AuditLogRow


@dataclass(frozen=True)
class AuditTarget:
    """What a guarded request is about, for the row of a refused attempt."""

    actor: str
    permission: str
    project_id: str | None
    object_type: str | None
    object_id: str | None


@dataclass
class RequestInfo:
    """One HTTP request, as the audit rows written during it see it."""

    request_id: str
    source_ip: str | None
    method: str
    path: str
    # Set by the permission dependency once it knows the caller.
    target: AuditTarget | None = None


current_request: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "gpufleet_request", default=None
)


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
    ts: dt.datetime | None = None,
) -> AuditLogRow:
    """Add an audit row to the session's transaction (written with the change itself),
    stamped ``ts`` (the caller's clock) or, when none is given, the wall clock.

    ``detail`` must never hold a secret (tokens, codes, cookies): audit rows are shown to
    project admins and kept for good.
    """
    info = current_request.get()
    row = AuditLogRow(
        id=new_id(),
        ts=ts or utcnow(),
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=object_id,
        project_id=project_id,
        source_ip=source_ip or (info.source_ip if info else None),
        result=result,
        request_id=info.request_id if info else None,
        detail=detail or {},
    )
    session.add(row)
    return row
