"""Faults in simulated nodes: ``gpufleet inject`` and the demo."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

import gpufleet.server.services.faults as faults_services
from gpufleet.core.agent_protocol import MAX_GPUS_PER_NODE
from gpufleet.core.faults import Fault
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.faults import InjectFaultRequest
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/nodes/{node_id}/faults", tags=["faults"])


@router.post("", status_code=status.HTTP_202_ACCEPTED)
async def inject_fault(
    node_id: str,
    body: InjectFaultRequest,
    caller: Annotated[Caller, Allow(Permission.NODE_ACTION)],
    ctx: CtxDep,
) -> Fault:
    """Inject a fault; 202: the node's agent reports the finding within about a second."""
    return await faults_services.inject_fault(
        ctx.db, caller=caller, drivers=ctx.drivers, node_id=node_id, request=body
    )


@router.get("")
async def list_faults(
    node_id: str, caller: Annotated[Caller, Allow(Permission.NODE_READ)], ctx: CtxDep
) -> list[Fault]:
    return await faults_services.list_faults(
        ctx.db, caller=caller, drivers=ctx.drivers, node_id=node_id
    )


@router.delete("/{signature}")
async def clear_fault(
    node_id: str,
    signature: str,
    caller: Annotated[Caller, Allow(Permission.NODE_ACTION)],
    ctx: CtxDep,
    gpu_index: int | None = Query(default=None, ge=0, lt=MAX_GPUS_PER_NODE),
) -> list[Fault]:
    """Clear the node's open faults of one signature (on one GPU if given)."""
    return await faults_services.clear_fault(
        ctx.db,
        caller=caller,
        drivers=ctx.drivers,
        node_id=node_id,
        signature_id=signature,
        gpu_index=gpu_index,
    )
