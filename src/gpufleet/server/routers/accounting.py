"""Usage: GPU-hours from the copied job accounting."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.accounting as accounting_services
from gpufleet.core.models import GpuHours, UsageGroup
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/usage", tags=["usage"])


# None only stands for "not grouped by this": left out, a row has the keys asked for.
@router.get("/gpu-hours", response_model_exclude_none=True)
async def gpu_hours(
    caller: Annotated[Caller, Allow(Permission.USAGE_READ)],
    ctx: CtxDep,
    group_by: list[UsageGroup] = Query(default=[UsageGroup.PROJECT]),
    since: dt.datetime | None = Query(default=None, description="Default: 30 days ago."),
    until: dt.datetime | None = Query(default=None, description="Default: now."),
    project: str | None = Query(default=None, max_length=63),
    cluster: str | None = Query(default=None, max_length=36),
) -> GpuHours:
    """GPU-hours of finished jobs, grouped by project, cluster, user, account and/or day
    (a job counts on the day it ended, UTC)."""
    now = ctx.clock.now()
    until = _utc(until) if until is not None else now
    since = _utc(since) if since is not None else until - dt.timedelta(days=30)
    async with ctx.db.reader() as session:
        return await accounting_services.gpu_hours(
            session,
            caller=caller,
            group_by=group_by,
            since=since,
            until=until,
            project_ref=project,
            cluster_id=cluster,
        )


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
