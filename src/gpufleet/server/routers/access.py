"""Sudo and Slurm admin rights on a cluster: for its nodes' agents and for people."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

import gpufleet.server.services.access as access_services
from gpufleet.core.rbac import Permission
from gpufleet.core.slurm_admins import AccessConfig
from gpufleet.server.deps import Allow, CtxDep, NodeCallerDep
from gpufleet.server.services.auth import Caller

router = APIRouter(tags=["access"])


@router.get("/agent/access")
async def agent_access(caller: NodeCallerDep, ctx: CtxDep) -> AccessConfig:
    """The node's cluster: the sudoers fragment for its project's admins and, on Slurm,
    each member's AdminLevel. The agent applies it when ``content_hash`` changes."""
    async with ctx.db.reader() as session:
        return await access_services.access_for_node(session, caller=caller)


@router.get("/clusters/{cluster_id}/access")
async def cluster_access(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.MEMBER_READ)], ctx: CtxDep
) -> AccessConfig:
    async with ctx.db.reader() as session:
        return await access_services.cluster_access(session, caller=caller, cluster_id=cluster_id)
