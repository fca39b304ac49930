"""Acceptance runs and their reports. Members read; admins run the suite."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

import gpufleet.server.services.acceptance as acceptance_services
from gpufleet.core.acceptance import AcceptanceRun, AcceptanceTrigger
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.acceptance import RunAcceptanceRequest
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services.auth import Caller

router = APIRouter(tags=["acceptance"])

Reader = Annotated[Caller, Allow(Permission.CLUSTER_READ)]
# Running the suite takes nodes out of the scheduler's hands for a while: admins only.
Runner = Annotated[Caller, Allow(Permission.NODE_ACTION)]


@router.get("/clusters/{cluster_id}/acceptance")
async def list_acceptance_runs(
    cluster_id: str,
    caller: Reader,
    ctx: CtxDep,
    trigger: AcceptanceTrigger | None = None,
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=50, ge=1, le=1000),
) -> Page[AcceptanceRun]:
    """The cluster's acceptance runs, newest first."""
    async with ctx.db.reader() as session:
        return await acceptance_services.list_acceptance_runs(
            session, caller=caller, cluster_id=cluster_id, trigger=trigger, cursor=cursor,
            limit=limit,
        )  # fmt: skip


@router.post("/clusters/{cluster_id}/acceptance", status_code=status.HTTP_202_ACCEPTED)
async def run_acceptance(
    cluster_id: str, body: RunAcceptanceRequest, caller: Runner, ctx: CtxDep
) -> AcceptanceRun:
    """Run the cluster's suite now (admins). The run is carried out in the background;
    poll ``GET /acceptance/{id}``."""
    async with ctx.db.transaction() as session:
        return await acceptance_services.request_acceptance_run(
            session, caller=caller, cluster_id=cluster_id, request=body, now=ctx.clock.now()
        )


@router.get("/acceptance/{acceptance_id}")
async def get_acceptance_run(acceptance_id: str, caller: Reader, ctx: CtxDep) -> AcceptanceRun:
    async with ctx.db.reader() as session:
        return await acceptance_services.get_acceptance_run(
            session, caller=caller, run_id=acceptance_id
        )


@router.get(
    "/acceptance/{acceptance_id}/report.json",
    responses={200: {"content": {"application/json": {}}}, 304: {}, 409: {}},
)
async def get_report_json(
    acceptance_id: str, request: Request, caller: Reader, ctx: CtxDep
) -> Response:
    """The report as canonical JSON; ``ETag`` is its SHA-256 (the run's
    ``report_sha256``), so ``sha256sum`` of the download matches it."""
    return await _report(acceptance_id, request, caller, ctx, as_html=False)


@router.get(
    "/acceptance/{acceptance_id}/report.html",
    responses={200: {"content": {"text/html": {}}}, 304: {}, 409: {}},
)
async def get_report_html(
    acceptance_id: str, request: Request, caller: Reader, ctx: CtxDep
) -> Response:
    """The report as one self-contained page (no external assets, no scripts); ``ETag``
    is the SHA-256 of the JSON report it renders."""
    return await _report(acceptance_id, request, caller, ctx, as_html=True)


async def _report(
    acceptance_id: str, request: Request, caller: Reader, ctx: CtxDep, *, as_html: bool
) -> Response:
    async with ctx.db.reader() as session:
        body, digest = await acceptance_services.get_report(
            session, caller=caller, run_id=acceptance_id, as_html=as_html
        )
    etag = f'"{digest}"'
    headers = {
        "ETag": etag,
        "Cache-Control": "private, max-age=0, must-revalidate",
        "Content-Disposition": f'inline; filename="acceptance-{acceptance_id}.'
        f'{"html" if as_html else "json"}"',
    }
    if as_html:
        # The page needs nothing from anywhere: say so to the browser too.
        headers["Content-Security-Policy"] = (
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'"
        )
    if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    media = "text/html; charset=utf-8" if as_html else "application/json"
    return Response(content=body, media_type=media, headers=headers)
