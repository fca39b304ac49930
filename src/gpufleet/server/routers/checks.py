"""Active check runs: run one, list, show, raw output, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

import gpufleet.server.services.checks as checks_services
from gpufleet.checks.models import CheckKind
from gpufleet.core.enums import CheckStatus
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.checks import CheckRun, CreateCheckRunRequest
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/checks", tags=["checks"])

Reader = Annotated[Caller, Allow(Permission.CHECK_READ)]
# Members run checks on their project's idle nodes; forcing onto busy nodes is checked in
# the service (admins only), since it depends on the body.
Runner = Annotated[Caller, Allow(Permission.CHECK_RUN)]


@router.post("", status_code=201)
async def run_check(body: CreateCheckRunRequest, caller: Runner, ctx: CtxDep) -> CheckRun:
    """Run a check on a cluster's nodes (members: on idle nodes; admins may ``force`` it
    onto nodes that run jobs). The run starts ``pending``; follow it with GET."""
    async with ctx.db.transaction() as session:
        return await checks_services.request_check_run(
            session, caller=caller, request=body, now=ctx.clock.now()
        )


@router.get("")
async def list_checks(
    caller: Reader,
    ctx: CtxDep,
    cluster: str | None = Query(default=None, max_length=36),
    status: list[CheckStatus] | None = Query(default=None),
    kind: CheckKind | None = None,
    parent: str | None = Query(default=None, max_length=36),
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Page[CheckRun]:
    """Newest first, without ``result`` (GET one run for it)."""
    async with ctx.db.reader() as session:
        return await checks_services.list_check_runs(
            session,
            caller=caller,
            cluster_id=cluster,
            status=status,
            kind=kind,
            parent_id=parent,
            cursor=cursor,
            limit=limit,
        )


@router.get("/{check_id}")
async def get_check(check_id: str, caller: Reader, ctx: CtxDep) -> CheckRun:
    async with ctx.db.reader() as session:
        return await checks_services.get_check_run(session, caller=caller, run_id=check_id)


@router.get("/{check_id}/output", response_class=PlainTextResponse)
async def get_check_output(check_id: str, caller: Reader, ctx: CtxDep) -> str:
    """The raw output of every command of the run, each under a ``==> id on node <==``
    header, as text."""
    async with ctx.db.reader() as session:
        return await checks_services.get_check_output(session, caller=caller, run_id=check_id)


@router.post("/{check_id}/cancel")
async def cancel_check(check_id: str, caller: Runner, ctx: CtxDep) -> CheckRun:
    async with ctx.db.transaction() as session:
        return await checks_services.cancel_check_run(
            session, caller=caller, run_id=check_id, now=ctx.clock.now()
        )
