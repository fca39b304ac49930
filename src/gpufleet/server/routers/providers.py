"""A cluster's providers: reach every host of its inventory, changing nothing.

Needs ``host.read`` (project admins): the answer shows BMC power and what the management
path said, and the check opens the hosts' credentials.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

import gpufleet.server.services.providers as providers_services
from gpufleet.core.providers import ProvidersCheckResult
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.providers import CheckProvidersRequest
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/clusters/{cluster_id}/providers", tags=["providers"])


@router.post("/check")
async def check_providers(
    cluster_id: str,
    caller: Annotated[Caller, Allow(Permission.HOST_READ)],
    ctx: CtxDep,
    body: CheckProvidersRequest | None = None,
) -> ProvidersCheckResult:
    """Each host's reachability and power through the cluster's provider (or the one in
    the body). An unreachable host is a row, not an error; a provider with no reach check
    (sim) is a 422."""
    return await providers_services.check_providers(
        ctx.db,
        caller=caller,
        cluster_id=cluster_id,
        provider=body.provider if body is not None else None,
        drivers=ctx.drivers,
        now=ctx.clock.now(),
    )
