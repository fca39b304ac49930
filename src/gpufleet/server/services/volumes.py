"""Storage volumes: a project's named storage (size, mount path), attached to clusters of
the same project. Members see them; admins create, resize, delete, attach and detach.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.access import Volume
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import ClusterStatus
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import ClusterRow, ProjectRow, VolumeAttachmentRow, VolumeRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.projects import get_project_row_for


async def _attached(session: AsyncSession, volume_ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {v: [] for v in volume_ids}
    if not volume_ids:
        return out
    rows = await session.execute(
        select(VolumeAttachmentRow.volume_id, VolumeAttachmentRow.cluster_id)
        .where(VolumeAttachmentRow.volume_id.in_(volume_ids))
        .order_by(VolumeAttachmentRow.cluster_id)
    )
    for volume_id, cluster_id in rows:
        out[volume_id].append(cluster_id)
    return out


def volume_row_to_volume(row: VolumeRow, cluster_ids: list[str]) -> Volume:
    return Volume(
        id=row.id,
        project_id=row.project_id,
        name=row.name,
        size_gb=row.size_gb,
        mount_path=row.mount_path,
        cluster_ids=cluster_ids,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def _volume(session: AsyncSession, row: VolumeRow) -> Volume:
    return volume_row_to_volume(row, (await _attached(session, [row.id]))[row.id])


async def get_volume_row_or_error(
    session: AsyncSession, *, project: ProjectRow, ref: str
) -> VolumeRow:
    """A volume of this project by id or name."""
    match = or_(VolumeRow.id == ref, VolumeRow.name == ref) if is_id(ref) else VolumeRow.name == ref
    row = await session.scalar(select(VolumeRow).where(VolumeRow.project_id == project.id, match))
    if row is None:
        raise NotFound(f"volume {ref!r} not found in project {project.name}", field="volume")
    return row


async def list_volumes(session: AsyncSession, *, caller: Caller, project_ref: str) -> list[Volume]:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_READ
    )
    rows = (
        await session.scalars(
            select(VolumeRow).where(VolumeRow.project_id == project.id).order_by(VolumeRow.name)
        )
    ).all()
    attached = await _attached(session, [r.id for r in rows])
    return [volume_row_to_volume(r, attached[r.id]) for r in rows]


async def get_volume(
    session: AsyncSession, *, caller: Caller, project_ref: str, volume_ref: str
) -> Volume:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_READ
    )
    return await _volume(
        session, await get_volume_row_or_error(session, project=project, ref=volume_ref)
    )


async def create_volume(
    session: AsyncSession,
    *,
    caller: Caller,
    project_ref: str,
    name: str,
    size_gb: int,
    mount_path: str,
) -> Volume:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_MANAGE
    )
    taken = await session.scalar(
        select(VolumeRow.id).where(VolumeRow.project_id == project.id, VolumeRow.name == name)
    )
    if taken is not None:
        raise Conflict(f"project {project.name} has a volume named {name!r}", field="name")
    now = utcnow()
    row = VolumeRow(
        id=new_id(),
        project_id=project.id,
        name=name,
        size_gb=size_gb,
        mount_path=mount_path,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    _audit(session, caller, "volume.create", row, {"size_gb": size_gb, "mount_path": mount_path})
    return volume_row_to_volume(row, [])


async def update_volume(
    session: AsyncSession,
    *,
    caller: Caller,
    project_ref: str,
    volume_ref: str,
    size_gb: int | None,
    mount_path: str | None,
) -> Volume:
    """Grow a volume or move its mount path (not while two attached volumes would clash)."""
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_MANAGE
    )
    row = await get_volume_row_or_error(session, project=project, ref=volume_ref)
    detail: dict[str, object] = {}
    if size_gb is not None and size_gb != row.size_gb:
        if size_gb < row.size_gb:
            raise InvalidInput(
                f"volumes only grow: {row.name} has {row.size_gb} GB; shrinking loses data",
                field="size_gb",
            )
        detail["size_gb"] = {"from": row.size_gb, "to": size_gb}
        row.size_gb = size_gb
    if mount_path is not None and mount_path != row.mount_path:
        for cluster_id in (await _attached(session, [row.id]))[row.id]:
            await _refuse_mount_clash(
                session, cluster_id=cluster_id, mount_path=mount_path, volume_id=row.id
            )
        detail["mount_path"] = {"from": row.mount_path, "to": mount_path}
        row.mount_path = mount_path
    row.updated_at = utcnow()
    _audit(session, caller, "volume.update", row, detail)
    return await _volume(session, row)


async def delete_volume(
    session: AsyncSession, *, caller: Caller, project_ref: str, volume_ref: str
) -> Volume:
    """Delete a volume that is attached nowhere (detach it first)."""
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_MANAGE
    )
    row = await get_volume_row_or_error(session, project=project, ref=volume_ref)
    volume = await _volume(session, row)
    if volume.cluster_ids:
        raise Conflict(
            f"volume {row.name} is attached to {len(volume.cluster_ids)} cluster(s); "
            "detach it first",
            field="volume",
        )
    await session.delete(row)
    _audit(session, caller, "volume.delete", row, {"size_gb": row.size_gb})
    return volume


async def _refuse_mount_clash(
    session: AsyncSession, *, cluster_id: str, mount_path: str, volume_id: str | None = None
) -> None:
    clash = await session.scalar(
        select(VolumeRow.name)
        .join(VolumeAttachmentRow, VolumeAttachmentRow.volume_id == VolumeRow.id)
        .where(
            VolumeAttachmentRow.cluster_id == cluster_id,
            VolumeRow.mount_path == mount_path,
            VolumeRow.id != (volume_id or ""),
        )
    )
    if clash is not None:
        raise Conflict(
            f"volume {clash} is already mounted at {mount_path} on that cluster",
            field="mount_path",
        )


async def attach_volume(
    session: AsyncSession, *, caller: Caller, project_ref: str, volume_ref: str, cluster_id: str
) -> Volume:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_MANAGE
    )
    row = await get_volume_row_or_error(session, project=project, ref=volume_ref)
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    if cluster.project_id != project.id:
        raise InvalidInput(
            f"cluster {cluster.name} is in another project; a volume attaches only to its "
            "own project's clusters",
            field="cluster",
        )
    if ClusterStatus(cluster.status) in (ClusterStatus.DELETING, ClusterStatus.DELETED):
        raise Conflict(f"cluster {cluster.name} is {cluster.status}", field="cluster")
    if await session.get(VolumeAttachmentRow, (row.id, cluster.id)) is not None:
        raise Conflict(f"volume {row.name} is already attached to {cluster.name}", field="cluster")
    await _refuse_mount_clash(
        session, cluster_id=cluster.id, mount_path=row.mount_path, volume_id=row.id
    )
    session.add(VolumeAttachmentRow(volume_id=row.id, cluster_id=cluster.id, created_at=utcnow()))
    _audit(
        session, caller, "volume.attach", row, {"cluster": cluster.name, "cluster_id": cluster.id}
    )
    await session.flush()
    return await _volume(session, row)


async def detach_volume(
    session: AsyncSession, *, caller: Caller, project_ref: str, volume_ref: str, cluster_id: str
) -> Volume:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.VOLUME_MANAGE
    )
    row = await get_volume_row_or_error(session, project=project, ref=volume_ref)
    attachment = (
        await session.get(VolumeAttachmentRow, (row.id, cluster_id)) if is_id(cluster_id) else None
    )
    if attachment is None:
        raise NotFound(f"volume {row.name} is not attached to {cluster_id!r}", field="cluster_id")
    await session.delete(attachment)
    _audit(session, caller, "volume.detach", row, {"cluster_id": cluster_id})
    await session.flush()
    return await _volume(session, row)


def _audit(
    session: AsyncSession, caller: Caller, action: str, row: VolumeRow, detail: dict[str, object]
) -> None:
    record_audit(
        session,
        actor=caller.actor,
        action=action,
        object_type="volume",
        object_id=row.id,
        project_id=row.project_id,
        source_ip=caller.source_ip,
        detail={"name": row.name, **detail},
    )


async def volumes_of_cluster(session: AsyncSession, *, cluster: ClusterRow) -> list[Volume]:
    rows = (
        await session.scalars(
            select(VolumeRow)
            .join(VolumeAttachmentRow, VolumeAttachmentRow.volume_id == VolumeRow.id)
            .where(VolumeAttachmentRow.cluster_id == cluster.id)
            .order_by(VolumeRow.name)
        )
    ).all()
    attached = await _attached(session, [r.id for r in rows])
    return [volume_row_to_volume(r, attached[r.id]) for r in rows]
