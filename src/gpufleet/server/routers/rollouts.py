"""Stack rollouts: a cluster migrated to another stack inside maintenance windows, node
by node. Members read them; admins schedule, pause, resume, abort and roll nodes back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

import gpufleet.server.services.rollouts as rollout_services
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.rollouts import (
    CreateRolloutRequest,
    RollbackRequest,
    Rollout,
    RolloutActionRequest,
)
from gpufleet.server.services.auth import Caller

router = APIRouter(tags=["rollouts"])

Reader = Annotated[Caller, Allow(Permission.CLUSTER_READ)]
# A rollout reinstalls nodes: admins only.
Admin = Annotated[Caller, Allow(Permission.NODE_ACTION)]


@router.get("/clusters/{cluster_id}/rollouts")
async def list_rollouts(cluster_id: str, caller: Reader, ctx: CtxDep) -> list[Rollout]:
    """The cluster's rollouts, newest first, each with its nodes' progress."""
    async with ctx.db.reader() as session:
        return await rollout_services.list_rollouts(
            session, caller=caller, cluster_id=cluster_id, now=ctx.clock.now()
        )


@router.post("/clusters/{cluster_id}/rollouts", status_code=status.HTTP_201_CREATED)
async def create_rollout(
    cluster_id: str, body: CreateRolloutRequest, caller: Admin, ctx: CtxDep
) -> Rollout:
    """Schedule the cluster's migration to another stack; it starts when its window
    opens."""
    async with ctx.db.transaction() as session:
        return await rollout_services.create_rollout(
            session, caller=caller, cluster_id=cluster_id, request=body, now=ctx.clock.now()
        )


@router.get("/rollouts/{rollout_id}")
async def get_rollout(rollout_id: str, caller: Reader, ctx: CtxDep) -> Rollout:
    async with ctx.db.reader() as session:
        return await rollout_services.get_rollout(
            session, caller=caller, rollout_id=rollout_id, now=ctx.clock.now()
        )


@router.post("/rollouts/{rollout_id}/pause")
async def pause_rollout(
    rollout_id: str, body: RolloutActionRequest, caller: Admin, ctx: CtxDep
) -> Rollout:
    """No node starts until resumed; nodes under way finish."""
    async with ctx.db.transaction() as session:
        return await rollout_services.pause_rollout(
            session, caller=caller, rollout_id=rollout_id, request=body, now=ctx.clock.now()
        )


@router.post("/rollouts/{rollout_id}/resume")
async def resume_rollout(
    rollout_id: str, body: RolloutActionRequest, caller: Admin, ctx: CtxDep
) -> Rollout:
    async with ctx.db.transaction() as session:
        return await rollout_services.resume_rollout(
            session, caller=caller, rollout_id=rollout_id, request=body, now=ctx.clock.now()
        )


@router.post("/rollouts/{rollout_id}/abort")
async def abort_rollout(
    rollout_id: str, body: RolloutActionRequest, caller: Admin, ctx: CtxDep
) -> Rollout:
    """No node starts any more; nodes under way finish and return to service."""
    async with ctx.db.transaction() as session:
        return await rollout_services.abort_rollout(
            session, caller=caller, rollout_id=rollout_id, request=body, now=ctx.clock.now()
        )


@router.post("/rollouts/{rollout_id}/nodes/{node_id}/rollback")
async def rollback_node(
    rollout_id: str, node_id: str, body: RollbackRequest, caller: Admin, ctx: CtxDep
) -> Rollout:
    """Put one node back on the stack it came from (in the window, like the others)."""
    async with ctx.db.transaction() as session:
        return await rollout_services.rollback_node(
            session, caller=caller, rollout_id=rollout_id, node_id=node_id, request=body,
            now=ctx.clock.now(),
        )  # fmt: skip
