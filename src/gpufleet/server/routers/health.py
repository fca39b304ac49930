from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.health as health_services
from gpufleet.core.models import HealthSummary
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import get_cluster_row_or_error

router = APIRouter(prefix="/health", tags=["health"])


@router.get("/summary")
async def health_summary(
    caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)],
    ctx: CtxDep,
    cluster: str | None = Query(default=None, max_length=36),
) -> HealthSummary:
    async with ctx.db.reader() as session:
        if cluster is not None:
            await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster)
        return await health_services.health_summary(
            session,
            caller=caller,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
            cluster_id=cluster,
        )
