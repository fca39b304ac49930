"""A project's host inventory: import, list, show, bind a node to its host.

Reading needs ``host.read`` and changing ``host.manage``, both project admins': BMC
addresses and pinned host keys are the management plane, which members do not use.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.hosts as hosts_services
from gpufleet.core.inventory import Host, HostImportResult
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.inventory import (
    BindHostRequest,
    ImportHostsRequest,
    SetHostStateRequest,
)
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/projects/{project_ref}/hosts", tags=["hosts"])

Reader = Annotated[Caller, Allow(Permission.HOST_READ)]
Manager = Annotated[Caller, Allow(Permission.HOST_MANAGE)]


@router.get("")
async def list_hosts(
    project_ref: str,
    caller: Reader,
    ctx: CtxDep,
    cluster: str | None = Query(default=None, max_length=36),
) -> list[Host]:
    async with ctx.db.reader() as session:
        return await hosts_services.list_hosts(
            session, caller=caller, project_ref=project_ref, cluster_id=cluster
        )


@router.post("/import")
async def import_hosts(
    project_ref: str, body: ImportHostsRequest, caller: Manager, ctx: CtxDep
) -> HostImportResult:
    """Create or update hosts by hostname, all or nothing (a bad row: 422 naming it)."""
    async with ctx.db.transaction() as session:
        return await hosts_services.import_hosts(
            session, caller=caller, project_ref=project_ref, specs=body.hosts, now=ctx.clock.now()
        )


@router.get("/{host_ref}")
async def get_host(project_ref: str, host_ref: str, caller: Reader, ctx: CtxDep) -> Host:
    async with ctx.db.reader() as session:
        return await hosts_services.get_host(
            session, caller=caller, project_ref=project_ref, host_ref=host_ref
        )


@router.post("/{host_ref}/bind")
async def bind_host(
    project_ref: str, host_ref: str, body: BindHostRequest, caller: Manager, ctx: CtxDep
) -> Host:
    """Bind a node to this host (nodes are also bound when they report its hostname)."""
    async with ctx.db.transaction() as session:
        return await hosts_services.bind_host(
            session,
            caller=caller,
            project_ref=project_ref,
            host_ref=host_ref,
            node_id=body.node_id,
            now=ctx.clock.now(),
        )


@router.post("/{host_ref}/state")
async def set_host_state(
    project_ref: str, host_ref: str, body: SetHostStateRequest, caller: Manager, ctx: CtxDep
) -> Host:
    """Out of service (maintenance), back to the spare pool, or into service."""
    async with ctx.db.transaction() as session:
        return await hosts_services.set_host_state(
            session,
            caller=caller,
            project_ref=project_ref,
            host_ref=host_ref,
            target=body.state,
            reason=body.reason,
            now=ctx.clock.now(),
        )
