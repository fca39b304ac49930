"""Storage volumes of a project, and their attachments to the project's clusters."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

import gpufleet.server.services.volumes as volumes_services
from gpufleet.core.access import Volume
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.volumes import (
    AttachVolumeRequest,
    CreateVolumeRequest,
    UpdateVolumeRequest,
)
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/projects/{project_ref}/volumes", tags=["volumes"])

Reader = Annotated[Caller, Allow(Permission.VOLUME_READ)]


@router.get("")
async def list_volumes(project_ref: str, caller: Reader, ctx: CtxDep) -> list[Volume]:
    async with ctx.db.reader() as session:
        return await volumes_services.list_volumes(session, caller=caller, project_ref=project_ref)


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_volume(
    project_ref: str,
    body: CreateVolumeRequest,
    caller: Annotated[Caller, Allow(Permission.VOLUME_MANAGE)],
    ctx: CtxDep,
) -> Volume:
    async with ctx.db.transaction() as session:
        return await volumes_services.create_volume(
            session,
            caller=caller,
            project_ref=project_ref,
            name=body.name,
            size_gb=body.size_gb,
            mount_path=body.mount_path,
        )


@router.get("/{volume_ref}")
async def get_volume(project_ref: str, volume_ref: str, caller: Reader, ctx: CtxDep) -> Volume:
    async with ctx.db.reader() as session:
        return await volumes_services.get_volume(
            session, caller=caller, project_ref=project_ref, volume_ref=volume_ref
        )


@router.patch("/{volume_ref}")
async def update_volume(
    project_ref: str,
    volume_ref: str,
    body: UpdateVolumeRequest,
    caller: Annotated[Caller, Allow(Permission.VOLUME_MANAGE)],
    ctx: CtxDep,
) -> Volume:
    """Grow it (never shrink) or move its mount path."""
    async with ctx.db.transaction() as session:
        return await volumes_services.update_volume(
            session,
            caller=caller,
            project_ref=project_ref,
            volume_ref=volume_ref,
            size_gb=body.size_gb,
            mount_path=body.mount_path,
        )


@router.delete("/{volume_ref}")
async def delete_volume(
    project_ref: str,
    volume_ref: str,
    caller: Annotated[Caller, Allow(Permission.VOLUME_MANAGE)],
    ctx: CtxDep,
) -> Volume:
    """409 while it is attached to a cluster."""
    async with ctx.db.transaction() as session:
        return await volumes_services.delete_volume(
            session, caller=caller, project_ref=project_ref, volume_ref=volume_ref
        )


@router.post("/{volume_ref}/attachments", status_code=status.HTTP_201_CREATED)
async def attach_volume(
    project_ref: str,
    volume_ref: str,
    body: AttachVolumeRequest,
    caller: Annotated[Caller, Allow(Permission.VOLUME_MANAGE)],
    ctx: CtxDep,
) -> Volume:
    """Attach to a cluster of the same project; 409 if another volume has its mount path."""
    async with ctx.db.transaction() as session:
        return await volumes_services.attach_volume(
            session,
            caller=caller,
            project_ref=project_ref,
            volume_ref=volume_ref,
            cluster_id=body.cluster,
        )


@router.delete("/{volume_ref}/attachments/{cluster_id}")
async def detach_volume(
    project_ref: str,
    volume_ref: str,
    cluster_id: str,
    caller: Annotated[Caller, Allow(Permission.VOLUME_MANAGE)],
    ctx: CtxDep,
) -> Volume:
    async with ctx.db.transaction() as session:
        return await volumes_services.detach_volume(
            session,
            caller=caller,
            project_ref=project_ref,
            volume_ref=volume_ref,
            cluster_id=cluster_id,
        )
