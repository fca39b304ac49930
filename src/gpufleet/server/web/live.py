"""Live updates by polling: the browser asks every few seconds what changed.

``GET /clusters/{id}/live?grid=<etag>&after=<event id>`` answers with the grid cells
that changed since the browser's version (or the whole grid when nodes came or went),
the counts, the "needs attention" table, and the events after the one it has.

Why polling, not server-sent events: the server would poll the store for changes anyway
(nothing pushes them in-process across replicas), an open SSE stream keeps uvicorn from
shutting down until it ends, and a plain GET works through every proxy. However many
people watch, a cluster's grid is read about once a second: grids are cached for
``GRID_TTL_S`` and the last few versions are kept to diff a browser's version against.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

import gpufleet.server.services.events as events_services
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import GpufleetError, InvalidInput
from gpufleet.core.ids import is_id
from gpufleet.core.models import Cluster, Event
from gpufleet.server.context import AppContext
from gpufleet.server.deps import CtxDep
from gpufleet.server.errors import error_body, status_for
from gpufleet.server.services.clusters import get_cluster_or_error
from gpufleet.server.services.console import cluster_versions, node_version
from gpufleet.server.services.health_grid import HealthGrid, load_health_grid
from gpufleet.server.services.nodes import get_node_row_or_error
from gpufleet.server.web.grid import attention, gpu_problems, grid_changes, render_grid
from gpufleet.server.web.session import LoginRequired, web_user
from gpufleet.server.web.templating import render_text

router = APIRouter(include_in_schema=False)

GRID_TTL_S = 1.0  # one store read per cluster per second, however many people watch
KEPT_VERSIONS = 16  # grids kept per cluster to diff a browser's version against
KEPT_CLUSTERS = 256
EVENTS_PER_POLL = 50
ATTENTION_ROWS = 200  # the "needs attention" table shows at most this many nodes


@dataclass
class _ClusterGrids:
    current: HealthGrid | None = None
    loaded_at: float = 0.0
    versions: OrderedDict[str, HealthGrid] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class GridCache:
    """Recent health grids per cluster, in this process."""

    def __init__(self, *, ttl_s: float = GRID_TTL_S, kept: int = KEPT_VERSIONS) -> None:
        self.ttl_s = ttl_s
        self.kept = kept
        self._clusters: OrderedDict[str, _ClusterGrids] = OrderedDict()

    def _entry(self, cluster_id: str) -> _ClusterGrids:
        entry = self._clusters.get(cluster_id)
        if entry is None:
            entry = self._clusters[cluster_id] = _ClusterGrids()
            while len(self._clusters) > KEPT_CLUSTERS:
                self._clusters.popitem(last=False)
        return entry

    def version(self, cluster_id: str, etag: str) -> HealthGrid | None:
        entry = self._clusters.get(cluster_id)
        return None if entry is None else entry.versions.get(etag)

    def remember(self, grid: HealthGrid) -> None:
        """Keep a grid a page was rendered with, so its first poll gets a diff."""
        versions = self._entry(grid.cluster_id).versions
        versions[grid.etag] = grid
        versions.move_to_end(grid.etag)
        while len(versions) > self.kept:
            versions.popitem(last=False)

    async def get(self, ctx: AppContext, cluster: Cluster) -> HealthGrid:
        """The cluster's grid; read again when the cached one is older than the TTL.
        The caller has checked that the viewer may see the cluster."""
        entry = self._entry(cluster.id)
        loop = asyncio.get_running_loop()
        async with entry.lock:  # concurrent pollers of one cluster share one read
            if entry.current is not None and loop.time() - entry.loaded_at < self.ttl_s:
                return entry.current
            async with ctx.db.reader() as session:
                grid = await load_health_grid(
                    session, cluster=cluster, staleness_s=ctx.settings.staleness_s,
                    now=ctx.clock.now(),
                )  # fmt: skip
            entry.current, entry.loaded_at = grid, loop.time()
            self.remember(grid)
            return grid


def grid_cache(request: Request) -> GridCache:
    cache: GridCache | None = getattr(request.app.state, "console_grids", None)
    if cache is None:
        cache = request.app.state.console_grids = GridCache()
    return cache


def attention_html(grid: HealthGrid, *, base: str) -> str:
    nodes = attention(grid)
    return render_text(
        "_attention.html",
        {"rows": [(n, gpu_problems(n)) for n in nodes[:ATTENTION_ROWS]],
         "more": max(0, len(nodes) - ATTENTION_ROWS), "base": base},
    )  # fmt: skip


def events_html(events: list[Event], *, base: str) -> list[str]:
    return [render_text("_event.html", {"e": e, "base": base}) for e in events]


@router.get("/clusters/{cluster_id}/live")
async def live(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    grid: Annotated[str, Query(max_length=64)] = "",
    after: Annotated[str, Query(max_length=36)] = "",
    kind: Annotated[list[EventKind] | None, Query()] = None,
    node: Annotated[str, Query(max_length=36)] = "",
) -> JSONResponse:
    """What changed since the browser's grid version and its newest event."""
    try:
        user = await web_user(request, ctx)
    except LoginRequired:
        return JSONResponse(
            error_body("unauthorized", "your session ended; log in again"), status_code=401
        )
    try:
        if (after and not is_id(after)) or (node and not is_id(node)):
            raise InvalidInput("after and node are ids this server issued")
        async with ctx.db.reader() as session:
            cluster = await get_cluster_or_error(session, caller=user.caller, cluster_id=cluster_id)
            events = None
            if after:
                page = await events_services.list_events(
                    session, project_ids=[cluster.project_id], cluster_id=cluster.id,
                    node_id=node or None, kinds=kind, limit=EVENTS_PER_POLL,
                )  # fmt: skip
                events = [e for e in page.items if e.id > after]
            pending, versions = await cluster_versions(session, cluster)
            if node:
                _row, node_cluster = await get_node_row_or_error(
                    session, caller=user.caller, node_id=node
                )
                if node_cluster.id != cluster.id:
                    raise InvalidInput("that node is not in this cluster", field="node")
                versions["node"] = await node_version(session, node)
        cache = grid_cache(request)
        # Pages without the grid (the Events tab) send no etag and cost no grid read.
        current = await cache.get(ctx, cluster) if grid else None
    except GpufleetError as exc:
        return JSONResponse(
            error_body(exc.code, exc.message, exc.field), status_code=status_for(exc)
        )
    base = f"/clusters/{cluster.id}"
    body: dict[str, Any] = {"pending_repairs": pending, "versions": versions}
    if current is not None:
        body.update(etag=current.etag, cells=current.counts(), nodes=current.node_counts())
        if grid != current.etag:
            changes = grid_changes(cache.version(cluster.id, grid), current)
            if changes is None:
                body["grid_html"] = str(render_grid(current, base=base))
            else:
                body["changes"] = changes
            body["attention_html"] = attention_html(current, base=base)
    if events is not None:
        body["events"] = events_html(list(reversed(events)), base=base)  # oldest first
        body["events_more"] = len(events) >= EVENTS_PER_POLL
        if events:
            body["last_event"] = events[0].id
    return JSONResponse(body, headers={"Cache-Control": "no-store"})
