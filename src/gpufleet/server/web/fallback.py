"""Console paths that match no page: an HTML 404 rather than the API's JSON one.
Included last, so every real page matches first."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gpufleet.core.errors import NotFound
from gpufleet.server.web.routing import HtmlRoute

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)


@router.get("/clusters/{cluster_id}/{rest:path}")
@router.get("/projects/{project_ref}/{rest:path}")
async def no_such_page(rest: str) -> Response:
    raise NotFound(f"there is no console page {rest!r} here")
