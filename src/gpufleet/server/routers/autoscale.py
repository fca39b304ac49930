"""A cluster's autoscaling: its settings, the changes of size made, and Slurm's power
saving calls (``gpufleet slurm resume|suspend`` as ResumeProgram/SuspendProgram).

Reading needs ``cluster.read``; changing settings and powering nodes need
``cluster.create`` (project admins: the token Slurm's programs use is an admin's)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from gpufleet.core.autoscaling import (
    AutoscaleAction,
    AutoscaleMode,
    AutoscaleSettings,
    PowerAction,
    PowerResult,
)
from gpufleet.core.enums import SchedulerKind
from gpufleet.core.errors import Conflict
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.autoscale import PowerRequest, SetAutoscaleRequest
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services import autoscale as autoscale_services
from gpufleet.server.services import autoscale_settings, power_saving
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error

router = APIRouter(prefix="/clusters/{cluster_id}", tags=["autoscale"])


@router.get("/autoscale")
async def get_autoscale(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)], ctx: CtxDep
) -> AutoscaleSettings:
    async with ctx.db.reader() as session:
        return await autoscale_settings.get_autoscale(session, caller=caller, cluster_id=cluster_id)


@router.put("/autoscale")
async def set_autoscale(
    cluster_id: str,
    body: SetAutoscaleRequest,
    caller: Annotated[Caller, Allow(Permission.CLUSTER_CREATE)],
    ctx: CtxDep,
) -> AutoscaleSettings:
    """Change the fields given (admins): mode (off | gpufleet | cluster-autoscaler |
    slurm), bounds, thresholds, cooldowns, step."""
    async with ctx.db.transaction() as session:
        return await autoscale_settings.set_autoscale(
            session, caller=caller, cluster_id=cluster_id, request=body, now=ctx.clock.now()
        )


@router.get("/autoscale/actions")
async def list_autoscale_actions(
    cluster_id: str,
    caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)],
    ctx: CtxDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[
        str | None, Query(pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION)
    ] = None,
) -> Page[AutoscaleAction]:
    """The cluster's changes of size, newest first."""
    async with ctx.db.reader() as session:
        return await autoscale_services.list_autoscale_actions(
            session, caller=caller, cluster_id=cluster_id, limit=limit, cursor=cursor
        )


@router.post("/power", status_code=status.HTTP_202_ACCEPTED)
async def power_nodes(
    cluster_id: str,
    body: PowerRequest,
    caller: Annotated[Caller, Allow(Permission.CLUSTER_CREATE)],
    ctx: CtxDep,
) -> PowerResult:
    """Slurm's power saving: ``resume`` gets machines for the named cloud nodes (the
    answer comes at once; the machines come in the background), ``suspend`` gives them
    back. Only for a Slurm cluster whose autoscaling mode is ``slurm``. The answer names
    the action started; none when there was nothing to do (every node already up or on
    its way, or already gone)."""
    async with ctx.db.transaction() as session:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        require(caller, Permission.CLUSTER_CREATE, cluster.project_id)
        await session.refresh(cluster, with_for_update=True)
        policy = await autoscale_settings.get_autoscale(
            session, caller=caller, cluster_id=cluster_id
        )
        if SchedulerKind(cluster.scheduler) is not SchedulerKind.SLURM or (
            policy.mode is not AutoscaleMode.SLURM
        ):
            raise Conflict(
                f"cluster {cluster.name}: power saving needs a Slurm cluster with autoscaling "
                f"mode slurm (it is {cluster.scheduler}, mode {policy.mode.value})"
            )
        now = ctx.clock.now()
        if body.action is PowerAction.RESUME:
            action = await power_saving.power_resume(
                session, cluster=cluster, names=body.nodes,
                jobs=[j.job_id for j in body.jobs], actor=caller.actor, now=now,
            )  # fmt: skip
        else:
            action = await power_saving.power_suspend(
                session, cluster=cluster, names=body.nodes, actor=caller.actor, now=now
            )
        record_audit(
            session,
            actor=caller.actor,
            action=f"cluster.power_{body.action.value}",
            object_type="cluster",
            object_id=cluster.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={
                "nodes": list(body.nodes),
                "jobs": [j.job_id for j in body.jobs],
                "action_id": action.id if action is not None else None,
                "reason": body.reason,
            },
            ts=now,
        )
        if action is None:
            verb = "up or on their way" if body.action is PowerAction.RESUME else "gone"
            return PowerResult(detail=f"nothing to do: {', '.join(body.nodes)} already {verb}")
        model = autoscale_services.action_to_model(action)
        return PowerResult(action=model, detail="; ".join(model.reasons))
