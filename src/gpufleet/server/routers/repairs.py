"""The repair queue, node actions, the breaker and the repair policy."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.repair_actions as actions
import gpufleet.server.services.repair_policy as policies
import gpufleet.server.services.repairs as repairs_services
from gpufleet.core.enums import RepairStatus
from gpufleet.core.models import Breaker, NodeActionResult, Page, Repair
from gpufleet.core.rbac import Permission
from gpufleet.core.repair.models import PolicyConfig, RepairKind
from gpufleet.core.repair.replay import ReplayReport
from gpufleet.server.context import AppContext
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.schemas.repairs import (
    ApproveRepairRequest,
    DismissRepairRequest,
    ForceRepairRequest,
    NodeActionRequest,
    RepairPolicyRequest,
    ReplayRequest,
    ResetBreakerRequest,
)
from gpufleet.server.services.auth import Caller

router = APIRouter(tags=["repairs"])


def _default(ctx: AppContext) -> PolicyConfig:
    return ctx.default_repair_policy


@router.get("/repairs")
async def list_repairs(
    caller: Annotated[Caller, Allow(Permission.REPAIR_READ)],
    ctx: CtxDep,
    cluster: str | None = Query(default=None, max_length=36),
    node: str | None = Query(default=None, max_length=36),
    status: list[RepairStatus] | None = Query(default=None),
    kind: RepairKind | None = None,
    open: bool = Query(default=False, description="Only proposed and in-flight repairs."),
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Page[Repair]:
    async with ctx.db.reader() as session:
        return await repairs_services.list_repairs(
            session,
            caller=caller,
            cluster_id=cluster,
            node_id=node,
            status=status,
            kind=kind,
            open_only=open,
            cursor=cursor,
            limit=limit,
        )


@router.get("/repairs/{repair_id}")
async def get_repair(
    repair_id: str, caller: Annotated[Caller, Allow(Permission.REPAIR_READ)], ctx: CtxDep
) -> Repair:
    async with ctx.db.reader() as session:
        return await repairs_services.get_repair(
            session, caller=caller, repair_id=repair_id, drivers=ctx.drivers
        )


@router.post("/repairs/{repair_id}/approve")
async def approve_repair(
    repair_id: str,
    body: ApproveRepairRequest,
    caller: Annotated[Caller, Allow(Permission.REPAIR_APPROVE)],
    ctx: CtxDep,
) -> Repair:
    """Approve a proposed repair (project admins). 409 while the breaker is tripped."""
    return await actions.approve_repair(
        ctx.db, caller=caller, repair_id=repair_id, request=body,
        default_policy=_default(ctx), now=ctx.clock.now(),
    )  # fmt: skip


@router.post("/repairs/{repair_id}/dismiss")
async def dismiss_repair(
    repair_id: str,
    body: DismissRepairRequest,
    caller: Annotated[Caller, Allow(Permission.REPAIR_APPROVE)],
    ctx: CtxDep,
) -> Repair:
    return await actions.dismiss_repair(
        ctx.db, caller=caller, repair_id=repair_id, request=body, now=ctx.clock.now()
    )


@router.post("/repairs/{repair_id}/force")
async def force_repair(
    repair_id: str,
    body: ForceRepairRequest,
    caller: Annotated[Caller, Allow(Permission.REPAIR_APPROVE)],
    ctx: CtxDep,
) -> Repair:
    """Kill the jobs still on a draining repair's node. Nothing else ever kills a job."""
    return await actions.force_repair(
        ctx.db, caller=caller, repair_id=repair_id, request=body, now=ctx.clock.now()
    )


@router.post("/nodes/{node_id}/actions")
async def node_action(
    node_id: str,
    body: NodeActionRequest,
    caller: Annotated[Caller, Allow(Permission.NODE_ACTION)],
    ctx: CtxDep,
) -> NodeActionResult:
    """cordon, uncordon, drain; or reboot, reprovision, replace, remove, reset_gpu, which
    run as an approved repair (the response names it)."""
    return await actions.node_action(
        ctx.db, caller=caller, node_id=node_id, request=body, drivers=ctx.drivers,
        default_policy=_default(ctx), staleness_s=ctx.settings.staleness_s,
        now=ctx.clock.now(),
    )  # fmt: skip


@router.get("/clusters/{cluster_id}/repair-breaker")
async def get_breaker(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.REPAIR_READ)], ctx: CtxDep
) -> Breaker:
    return await actions.show_breaker(
        ctx.db, caller=caller, cluster_id=cluster_id, default_policy=_default(ctx)
    )


@router.post("/clusters/{cluster_id}/repair-breaker/reset")
async def reset_breaker(
    cluster_id: str,
    body: ResetBreakerRequest,
    caller: Annotated[Caller, Allow(Permission.POLICY_MANAGE)],
    ctx: CtxDep,
) -> Breaker:
    return await actions.reset_cluster_breaker(
        ctx.db, caller=caller, cluster_id=cluster_id, request=body,
        default_policy=_default(ctx), now=ctx.clock.now(),
    )  # fmt: skip


@router.get("/projects/{project_ref}/repair-policy")
async def get_repair_policy(
    project_ref: str, caller: Annotated[Caller, Allow(Permission.REPAIR_READ)], ctx: CtxDep
) -> PolicyConfig:
    async with ctx.db.reader() as session:
        return await policies.get_policy(
            session, caller=caller, project_id=project_ref, default=_default(ctx)
        )


@router.put("/projects/{project_ref}/repair-policy")
async def set_repair_policy(
    project_ref: str,
    body: RepairPolicyRequest,
    caller: Annotated[Caller, Allow(Permission.POLICY_MANAGE)],
    ctx: CtxDep,
) -> PolicyConfig:
    """Replace the policy; fields left out take their defaults. Returns it as stored."""
    async with ctx.db.transaction() as session:
        return await policies.set_policy(
            session, caller=caller, project_id=project_ref, request=body, now=ctx.clock.now()
        )


@router.post("/projects/{project_ref}/repair-policy/replay")
async def replay_repair_policy(
    project_ref: str,
    body: ReplayRequest,
    caller: Annotated[Caller, Allow(Permission.REPAIR_READ)],
    ctx: CtxDep,
) -> ReplayReport:
    """Dry run: what a policy would have done over the stored findings of the last days.
    Changes nothing."""
    async with ctx.db.session() as session:
        return await policies.replay_policy(
            session, caller=caller, project_id=project_ref, request=body,
            default=_default(ctx), now=ctx.clock.now(),
        )  # fmt: skip
