"""Cluster tabs that only read: Health and Events. (Nodes, Repairs, Configuration,
Utilization and Checks have their own modules.)"""

from __future__ import annotations

import datetime as dt
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response

import gpufleet.server.services.events as events_services
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import InvalidInput
from gpufleet.core.ids import is_id
from gpufleet.server.deps import CtxDep
from gpufleet.server.services.nodes import get_node_row_or_error
from gpufleet.server.web.context import load_cluster_page
from gpufleet.server.web.grid import LABELLED_MAX_NODES, render_grid
from gpufleet.server.web.live import attention_html, grid_cache
from gpufleet.server.web.routing import HtmlRoute, render_page
from gpufleet.server.web.session import WebUserDep

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

NO_EVENT = "00000000-0000-0000-0000-000000000000"  # "after nothing": every event is newer
RECENT_EVENTS = 10
EVENTS_PAGE = 50
SINCE_CHOICES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}

# The filter menu of the Events tab: kinds grouped the way an operator thinks of them.
EVENT_GROUPS: dict[str, list[EventKind]] = {
    "Health": [EventKind.NODE_HEALTH, EventKind.CLUSTER_HEALTH, EventKind.FINDING_OPENED,
               EventKind.FINDING_CLEARED],
    "Repairs": [EventKind.REPAIR_PROPOSED, EventKind.REPAIR_UPDATED, EventKind.REPAIR_STATUS,
                EventKind.REPAIR_STEP, EventKind.INCIDENT_OPENED, EventKind.BREAKER_TRIPPED,
                EventKind.BREAKER_RESET],
    "Nodes": [EventKind.NODE_STATE, EventKind.NODE_ACTION, EventKind.NODE_CREATED,
              EventKind.NODE_PROVISIONED, EventKind.NODE_REGISTERED,
              EventKind.NODE_GPUS_CHANGED, EventKind.NODE_DAEMON, EventKind.NODE_CLEANUP,
              EventKind.NODE_GPU_STATE],
    "Cluster": [EventKind.CLUSTER_CREATED, EventKind.CLUSTER_STATUS, EventKind.PROVIDER_ERROR,
                EventKind.FAULT_INJECTED, EventKind.FAULT_CLEARED],
}  # fmt: skip


@router.get("/clusters/{cluster_id}/health")
async def health_tab(cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep) -> Response:
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        events = await events_services.list_events(
            session,
            project_ids=[page.cluster.project_id],
            cluster_id=page.cluster.id,
            limit=RECENT_EVENTS,
        )
    grid = await grid_cache(request).get(ctx, page.cluster)
    base = f"/clusters/{page.cluster.id}"
    return render_page(
        request,
        "tab_health.html",
        page.context(
            user,
            "health",
            grid=grid,
            grid_html=render_grid(grid, base=base),
            labelled=len(grid.nodes) <= LABELLED_MAX_NODES,
            cells=grid.counts(),
            nodes_by_health=grid.node_counts(),
            attention_html=attention_html(grid, base=base),
            events=events.items,
        ),
    )


@router.get("/clusters/{cluster_id}/events")
async def events_tab(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    kind: Annotated[list[EventKind] | None, Query()] = None,
    node: Annotated[str, Query(max_length=36)] = "",
    since: Annotated[str, Query(max_length=8)] = "",
    cursor: Annotated[str, Query(max_length=36)] = "",
) -> Response:
    """The timeline, newest first, with filters; live when showing the newest page."""
    if since and since not in SINCE_CHOICES:
        raise InvalidInput(f"since must be one of {', '.join(SINCE_CHOICES)}", field="since")
    if node and not is_id(node):
        raise InvalidInput("node must be a node id", field="node")
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        node_name = None
        if node:
            node_row, node_cluster = await get_node_row_or_error(
                session, caller=user.caller, node_id=node
            )
            if node_cluster.id != page.cluster.id:
                raise InvalidInput("that node is not in this cluster", field="node")
            node_name = node_row.name
        listed = await events_services.list_events(
            session,
            project_ids=[page.cluster.project_id],
            cluster_id=page.cluster.id,
            node_id=node or None,
            kinds=kind,
            since=now - dt.timedelta(seconds=SINCE_CHOICES[since]) if since else None,
            cursor=cursor or None,
            limit=EVENTS_PAGE,
        )
    filters: list[tuple[str, str]] = [("kind", k.value) for k in kind or []]
    if node:
        filters.append(("node", node))
    if since:
        filters.append(("since", since))
    base = f"/clusters/{page.cluster.id}"
    next_url = (
        f"{base}/events?{urlencode([*filters, ('cursor', listed.next_cursor)])}"
        if listed.next_cursor
        else None
    )
    first_page_url = f"{base}/events?{urlencode(filters)}" if cursor else None
    live_query = urlencode([(k, v) for k, v in filters if k in ("kind", "node")])
    return render_page(
        request,
        "tab_events.html",
        page.context(
            user,
            "events",
            events=listed.items,
            groups=EVENT_GROUPS,
            chosen={k.value for k in kind or []},
            node=node,
            node_name=node_name,
            since=since,
            since_choices=list(SINCE_CHOICES),
            next_url=next_url,
            first_page_url=first_page_url,
            live=not cursor,  # only the newest page grows live
            live_query=live_query,
            after=listed.items[0].id if listed.items else NO_EVENT,
            filtered=bool(filters),
        ),
    )
