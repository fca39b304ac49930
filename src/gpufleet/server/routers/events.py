from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.events as events_services
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import InvalidInput
from gpufleet.core.models import Event, Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.nodes import get_node_row_or_error
from gpufleet.server.services.projects import get_project_row_or_error

router = APIRouter(prefix="/events", tags=["events"])


@router.get("")
async def list_events(
    caller: Annotated[Caller, Allow(Permission.EVENT_READ)],
    ctx: CtxDep,
    project: str | None = Query(default=None, max_length=63),
    cluster: str | None = Query(default=None, max_length=36),
    node: str | None = Query(default=None, max_length=36),
    kind: list[EventKind] | None = Query(default=None),
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Page[Event]:
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{name} needs a timezone (e.g. 2026-01-01T00:00:00Z)", field=name)
    async with ctx.db.reader() as session:
        visible = caller.visible_project_ids()
        if project is not None:
            visible = [(await get_project_row_or_error(session, caller=caller, ref=project)).id]
        if cluster is not None:
            await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster)
        if node is not None:
            await get_node_row_or_error(session, caller=caller, node_id=node)
        return await events_services.list_events(
            session,
            project_ids=visible,
            cluster_id=cluster,
            node_id=node,
            kinds=kind,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )
