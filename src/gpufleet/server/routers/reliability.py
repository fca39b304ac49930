"""Reliability: GPU-hours lost, MTTR and MTBF, from the fleet's own history."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.reliability as reliability_services
from gpufleet.core.rbac import Permission
from gpufleet.core.reliability import ReliabilityReport
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/reliability", tags=["reliability"])


@router.get("")
async def reliability_report(
    caller: Annotated[Caller, Allow(Permission.REPAIR_READ)],
    ctx: CtxDep,
    since: dt.datetime | None = Query(default=None, description="Default: 30 days ago."),
    until: dt.datetime | None = Query(default=None, description="Default: now."),
    project: str | None = Query(default=None, max_length=63),
    cluster: str | None = Query(default=None, max_length=36),
) -> ReliabilityReport:
    """Where the window's GPU-hours went: each outage (a node out of service) put down to
    the repair or finding behind it, summed by signature, GPU model, day, cluster and
    host, with MTTR (detection to back in service) and MTBF (in-service node-hours per
    failure); jobs that failed on a node as it broke are counted apart."""
    now = ctx.clock.now()
    until = _utc(until) if until is not None else now
    since = _utc(since) if since is not None else until - dt.timedelta(days=30)
    async with ctx.db.reader() as session:
        return await reliability_services.reliability(
            session,
            caller=caller,
            since=since,
            until=until,
            project_ref=project,
            cluster_id=cluster,
        )


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
