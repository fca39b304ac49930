"""The Checks tab: run an active check (dcgm-diag, NCCL, ib_write_bw, gpu-burn) on the
cluster's nodes, follow its runs, read each node's verdict and the raw output; the
cluster's acceptance runs, each report downloadable (HTML, or JSON whose SHA-256 the run
records) from the API's own report routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import ValidationError

import gpufleet.server.services.acceptance as acceptance_services
import gpufleet.server.services.checks as checks_services
from gpufleet.checks.models import CheckKind
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import CtxDep
from gpufleet.server.errors import describe_validation_errors
from gpufleet.server.schemas.checks import CheckRun, CreateCheckRunRequest
from gpufleet.server.services.auth import require
from gpufleet.server.web.context import ClusterPage, load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import WebUser, WebUserDep, first, read_form, set_flash

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

RUNS_PAGE = 50
ACCEPTANCE_RUNS = 20  # the latest; older reports stay reachable through the API
KIND_HELP = {
    CheckKind.DCGM_DIAG: "DCGM diagnostics on each node (level 1: seconds; 3: ~30 min)",
    CheckKind.NCCL: "NCCL all_reduce across the nodes' GPUs (NVLink and the fabric)",
    CheckKind.IB_WRITE_BW: "InfiniBand write bandwidth between node pairs, per HCA",
    CheckKind.GPU_BURN: "gpu-burn: every GPU at full load, compared with its model",
}


@router.get("/clusters/{cluster_id}/checks")
async def checks_tab(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    nodes: Annotated[str, Query(max_length=2000)] = "",
    cursor: Annotated[str, Query(max_length=36)] = "",
) -> Response:
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        runs: Page[CheckRun] = await checks_services.list_check_runs(
            session,
            caller=user.caller,
            cluster_id=page.cluster.id,
            cursor=cursor or None,
            limit=RUNS_PAGE,
        )
        acceptance = await acceptance_services.list_acceptance_runs(
            session, caller=user.caller, cluster_id=page.cluster.id, limit=ACCEPTANCE_RUNS
        )
    base = f"/clusters/{page.cluster.id}"
    return render_page(
        request,
        "tab_checks.html",
        page.context(
            user,
            "checks",
            runs=runs.items,
            next_url=f"{base}/checks?cursor={runs.next_cursor}" if runs.next_cursor else None,
            kinds=[(k, KIND_HELP[k]) for k in CheckKind],
            prefill_nodes=nodes,
            acceptance=acceptance.items,
            now=ctx.clock.now(),
        ),
    )


@router.post("/clusters/{cluster_id}/checks")
async def run_check(cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep) -> Response:
    form = await read_form(request, csrf=user.csrf)
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
    base = f"/clusters/{page.cluster.id}"
    request.state.form_next = request.state.form_next or f"{base}/checks"
    require(user.caller, Permission.CHECK_RUN, page.cluster.project_id)
    names = [n.strip() for n in first(form, "nodes").replace(",", " ").split() if n.strip()]
    level = first(form, "level").strip()
    try:
        kind = CheckKind(first(form, "check"))
        body = CreateCheckRunRequest(
            cluster=page.cluster.id,
            check=kind,
            nodes=names or None,
            level=int(level) if level and kind is CheckKind.DCGM_DIAG else None,
            force=first(form, "force") == "1",
        )
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            raise InvalidInput(describe_validation_errors(list(exc.errors()))[0]) from None
        raise InvalidInput(f"choose a check ({', '.join(CheckKind)})", field="check") from None
    async with ctx.db.transaction() as session:
        run = await checks_services.request_check_run(
            session, caller=user.caller, request=body, now=ctx.clock.now()
        )
    response = redirect(f"{base}/checks/{run.id}")
    set_flash(response, text=f"{run.kind} started on {len(run.nodes)} node(s).")
    return response


async def _run(
    ctx: CtxDep, user: WebUser, cluster_id: str, run_id: str
) -> tuple[ClusterPage, CheckRun]:
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        run = await checks_services.get_check_run(session, caller=user.caller, run_id=run_id)
    if run.cluster_id != page.cluster.id:
        raise NotFound(f"check run {run_id!r} not found in this cluster", field="check_id")
    return page, run


@router.get("/clusters/{cluster_id}/checks/{run_id}")
async def check_page(
    cluster_id: str, run_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    page, run = await _run(ctx, user, cluster_id, run_id)
    result = run.result or {}
    return render_page(
        request,
        "check.html",
        page.context(
            user,
            "checks",
            run=run,
            node_results=result.get("nodes", {}),
            run_reasons=result.get("reasons", []),
            now=ctx.clock.now(),
        ),
    )


@router.get("/clusters/{cluster_id}/checks/{run_id}/output")
async def check_output(
    cluster_id: str, run_id: str, ctx: CtxDep, user: WebUserDep
) -> PlainTextResponse:
    _page, run = await _run(ctx, user, cluster_id, run_id)
    async with ctx.db.reader() as session:
        text = await checks_services.get_check_output(session, caller=user.caller, run_id=run.id)
    headers = {
        "Content-Disposition": f'inline; filename="check-{run.id}.txt"',
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",  # tool output is shown as text, never as HTML
    }
    return PlainTextResponse(text or "(no output yet)", headers=headers)
