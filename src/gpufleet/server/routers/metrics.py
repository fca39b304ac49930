"""``GET /metrics``: the Prometheus scrape target (docs/metrics.md).

Fleet-wide numbers (every project's nodes, findings and repairs), so a plain project
member or admin may not read them: the platform owner may (``metrics.read``), and so may
the scrape token in ``metrics_token_file``, which reads this route and nothing else: the
credential Prometheus holds.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from gpufleet.core.rbac import Permission
from gpufleet.server.deps import CtxDep, Guard
from gpufleet.server.schemas.prometheus import ScrapeTargetGroup
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.metrics import render_metrics, scrape_token_matches
from gpufleet.server.services.prometheus_targets import list_scrape_targets

router = APIRouter(tags=["metrics"])

_OWNER = Guard(Permission.METRICS_READ)
SCRAPE_TOKEN_ACTOR = "metrics-token"  # noqa: S105 - who scraped, not a secret


async def metrics_reader(request: Request, ctx: CtxDep) -> str:
    """Who reads /metrics: the scrape token, else a caller holding ``metrics.read``
    (401 without credentials, 403 for a user without the permission)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    scrape = scheme.lower() == "bearer" and token != ""
    if scrape and scrape_token_matches(ctx.settings.metrics_token_file, token):
        return SCRAPE_TOKEN_ACTOR
    caller = await _OWNER(request, ctx)
    return caller.actor


@router.get("/metrics", response_class=Response, include_in_schema=False)
async def metrics(_reader: Annotated[str, Depends(metrics_reader)], ctx: CtxDep) -> Response:
    body = await render_metrics(
        ctx.db,
        now=ctx.clock.now(),
        mttr_window_s=ctx.settings.metrics_mttr_window_s,
        ingest=ctx.ingest.stats,
    )
    return Response(content=body, media_type=CONTENT_TYPE_PLAIN_0_0_4)


class ScrapeTokenOrOwner(Guard):
    """``metrics.read`` (the owner), or the scrape token: what /metrics accepts, as the
    route's one guard. The scrape token resolves to no Caller: the route gets None."""

    async def __call__(self, request: Request, ctx: CtxDep) -> Caller | None:  # type: ignore[override]
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        scrape = scheme.lower() == "bearer" and token != ""
        if scrape and scrape_token_matches(ctx.settings.metrics_token_file, token):
            return None
        return await super().__call__(request, ctx)


# Under /api/v1 (the API's error shapes and the route matrix); /metrics itself stays at
# the root where Prometheus expects it.
api_router = APIRouter(prefix="/prometheus", tags=["metrics"])


@api_router.get("/targets")
async def list_prometheus_targets(
    _caller: Annotated[Caller | None, Depends(ScrapeTokenOrOwner(Permission.METRICS_READ))],
    ctx: CtxDep,
) -> list[ScrapeTargetGroup]:
    """Prometheus HTTP service discovery (``http_sd_configs``): every node whose agent
    runs, as ``hostname:agent_metrics_port`` labelled project, cluster and node."""
    return await list_scrape_targets(ctx.db, port=ctx.settings.agent_metrics_port)
