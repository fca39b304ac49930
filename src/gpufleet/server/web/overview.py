"""The console's front pages: every project and cluster the viewer can see."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

import gpufleet.server.services.clusters as clusters_services
import gpufleet.server.services.projects as projects_services
from gpufleet.core.errors import NotFound
from gpufleet.core.ids import is_id
from gpufleet.server.deps import CtxDep
from gpufleet.server.services.health import health_summary
from gpufleet.server.web.context import permissions
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import WebUserDep

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)


@router.get("/")
async def home(request: Request, ctx: CtxDep, user: WebUserDep) -> Response:
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        projects = await projects_services.list_projects(session, caller=user.caller)
        clusters = await clusters_services.list_clusters(
            session, caller=user.caller, staleness_s=ctx.settings.staleness_s, now=now
        )
        summary = await health_summary(
            session, caller=user.caller, staleness_s=ctx.settings.staleness_s, now=now
        )
    by_project: dict[str, list[object]] = {p.id: [] for p in projects.items}
    for cluster in clusters.items:
        by_project.setdefault(cluster.project_id, []).append(cluster)
    return render_page(
        request,
        "home.html",
        {
            "user": user,
            "projects": projects.items,
            "clusters": by_project,
            "summary": summary,
            "now": now,
        },
    )


@router.get("/projects/{project_ref}")
async def project_page(
    project_ref: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        project = await projects_services.get_project(session, caller=user.caller, ref=project_ref)
        clusters = await clusters_services.list_clusters(
            session,
            caller=user.caller,
            staleness_s=ctx.settings.staleness_s,
            now=now,
            project_ref=project.id,
        )
    return render_page(
        request,
        "project.html",
        {
            "user": user,
            "project": project,
            "clusters": clusters.items,
            "can": permissions(user.caller, project.id),
            "now": now,
        },
    )


@router.get("/clusters/{cluster_id}")
async def cluster_root(cluster_id: str) -> Response:
    if not is_id(cluster_id):
        raise NotFound(f"cluster {cluster_id!r} not found", field="cluster_id")
    return redirect(f"/clusters/{cluster_id}/health")
