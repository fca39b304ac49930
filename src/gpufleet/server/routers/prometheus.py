"""``/api/v1/projects/{project}/prometheus/api/v1/...``: Prometheus's query API, one
project's series only (services/prometheus_proxy.py; docs/grafana.md).

Any member of the project may read (``project.read``): a person with their token or
session, or the project's Grafana data source with a token scoped to the project
(``gpufleet grafana sync`` makes one). GET and POST (form) both, as Grafana sends either.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response

import gpufleet.server.services.prometheus_proxy as proxy_services
from gpufleet.core.errors import InvalidInput
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/projects/{project_ref}/prometheus/api/v1", tags=["prometheus"])

ReaderDep = Annotated[Caller, Allow(Permission.PROJECT_READ)]


async def _params(request: Request) -> list[tuple[str, str]]:
    params = list(request.query_params.multi_items())
    if request.method == "POST":
        # Prometheus's API takes a urlencoded form (what Grafana sends); read it here
        # rather than pull in a multipart parser for a format nobody sends to it.
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body = await request.body()
        if body and kind != "application/x-www-form-urlencoded":
            raise InvalidInput(
                "send the parameters urlencoded (application/x-www-form-urlencoded)",
                field="content-type",
            )
        params += parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return params


async def _answer(
    request: Request,
    ctx: CtxDep,
    caller: Caller,
    *,
    project_ref: str,
    endpoint: str,
    label_name: str | None = None,
) -> Response:
    answer = await proxy_services.proxy_prometheus(
        ctx.db,
        caller=caller,
        prometheus_url=ctx.settings.prometheus_url,
        timeout_s=ctx.settings.prometheus_timeout_s,
        project_ref=project_ref,
        endpoint=endpoint,
        params=await _params(request),
        label_name=label_name,
    )
    return Response(answer.body, status_code=answer.status_code, media_type=answer.content_type)


@router.get("/query", response_class=Response, operation_id="prometheus_query_get")
@router.post("/query", response_class=Response, operation_id="prometheus_query_post")
async def query(project_ref: str, request: Request, caller: ReaderDep, ctx: CtxDep) -> Response:
    return await _answer(request, ctx, caller, project_ref=project_ref, endpoint="query")


@router.get("/query_range", response_class=Response, operation_id="prometheus_query_range_get")
@router.post("/query_range", response_class=Response, operation_id="prometheus_query_range_post")
async def query_range(
    project_ref: str, request: Request, caller: ReaderDep, ctx: CtxDep
) -> Response:
    return await _answer(request, ctx, caller, project_ref=project_ref, endpoint="query_range")


@router.get("/series", response_class=Response, operation_id="prometheus_series_get")
@router.post("/series", response_class=Response, operation_id="prometheus_series_post")
async def series(project_ref: str, request: Request, caller: ReaderDep, ctx: CtxDep) -> Response:
    return await _answer(request, ctx, caller, project_ref=project_ref, endpoint="series")


@router.get("/labels", response_class=Response, operation_id="prometheus_labels_get")
@router.post("/labels", response_class=Response, operation_id="prometheus_labels_post")
async def labels(project_ref: str, request: Request, caller: ReaderDep, ctx: CtxDep) -> Response:
    return await _answer(request, ctx, caller, project_ref=project_ref, endpoint="labels")


@router.get("/label/{label_name}/values", response_class=Response)
async def label_values(
    project_ref: str, label_name: str, request: Request, caller: ReaderDep, ctx: CtxDep
) -> Response:
    return await _answer(
        request,
        ctx,
        caller,
        project_ref=project_ref,
        endpoint="label_values",
        label_name=label_name,
    )
