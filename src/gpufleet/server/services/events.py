"""Events: the cluster and node timeline."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind
from gpufleet.core.errors import InvalidInput
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Event, Page
from gpufleet.server.db.tables import EventRow


def record_event(
    session: AsyncSession,
    *,
    kind: EventKind,
    message: str,
    project_id: str | None = None,
    cluster_id: str | None = None,
    node_id: str | None = None,
    actor: str | None = None,
    data: dict[str, Any] | None = None,
    ts: dt.datetime | None = None,
) -> EventRow:
    """Add an event to the session's transaction."""
    event_id = new_id()
    row = EventRow(
        id=event_id,
        ts=ts or dt.datetime.now(dt.UTC),
        kind=kind.value,
        message=message,
        project_id=project_id,
        cluster_id=cluster_id,
        node_id=node_id,
        actor=actor,
        data=data or {},
    )
    session.add(row)
    return row


def event_row_to_event(row: EventRow) -> Event:
    return Event(
        id=row.id,
        ts=row.ts,
        kind=EventKind(row.kind),
        message=row.message,
        project_id=row.project_id,
        cluster_id=row.cluster_id,
        node_id=row.node_id,
        actor=row.actor,
        data=row.data,
    )


async def list_events(
    session: AsyncSession,
    *,
    project_ids: list[str] | None,
    cluster_id: str | None = None,
    node_id: str | None = None,
    kinds: list[EventKind] | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[Event]:
    """Newest first. ``cursor`` is the id of the last event of the previous page.

    ``project_ids`` limits the listing to projects the caller may see (None: all).
    """
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[EventRow] = select(EventRow)
    if project_ids is not None:
        query = query.where(EventRow.project_id.in_(project_ids))
    if cluster_id:
        query = query.where(EventRow.cluster_id == cluster_id)
    if node_id:
        query = query.where(EventRow.node_id == node_id)
    if kinds:
        query = query.where(EventRow.kind.in_([k.value for k in kinds]))
    if since:
        query = query.where(EventRow.ts >= since)
    if until:
        query = query.where(EventRow.ts < until)
    if cursor:
        query = query.where(EventRow.id < cursor)
    rows = (await session.scalars(query.order_by(EventRow.id.desc()).limit(limit + 1))).all()
    items = [event_row_to_event(r) for r in rows[:limit]]
    next_cursor = items[-1].id if len(rows) > limit else None
    return Page[Event](items=items, next_cursor=next_cursor)
