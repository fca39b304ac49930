"""Who gets sudo and Slurm admin rights on a cluster: its project's admins.

Rendered from the memberships on request (``core.slurm_admins``), so a membership change
reaches the nodes at their agents' next fetch; nothing is stored per cluster.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import Role, SchedulerKind
from gpufleet.core.rbac import Permission
from gpufleet.core.slurm_admins import AccessConfig, render_access
from gpufleet.server.db.tables import ClusterRow, MembershipRow, ProjectRow, UserRow
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.node_callers import NodeCaller


async def render_cluster_access(session: AsyncSession, *, cluster: ClusterRow) -> AccessConfig:
    project = await session.get(ProjectRow, cluster.project_id)
    assert project is not None  # the foreign key
    rows = (
        await session.execute(
            select(MembershipRow.role, UserRow.name, UserRow.unix_name)
            .join(UserRow, UserRow.id == MembershipRow.user_id)
            .where(MembershipRow.project_id == project.id)
        )
    ).all()
    return render_access(
        cluster_id=cluster.id,
        cluster_name=cluster.name,
        project_id=project.id,
        project_name=project.name,
        slurm=cluster.scheduler == SchedulerKind.SLURM.value,
        admins=[(name, unix) for role, name, unix in rows if role == Role.ADMIN.value],
        members=[(name, unix) for _, name, unix in rows],
    )


async def access_for_node(session: AsyncSession, *, caller: NodeCaller) -> AccessConfig:
    """What the calling node applies: its own cluster's, nothing else."""
    cluster = await session.get(ClusterRow, caller.cluster_id)
    assert cluster is not None  # the foreign key
    return await render_cluster_access(session, cluster=cluster)


async def cluster_access(session: AsyncSession, *, caller: Caller, cluster_id: str) -> AccessConfig:
    """The same, for people: who the cluster's nodes give sudo and Slurm admin to."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.MEMBER_READ, cluster.project_id)
    return await render_cluster_access(session, cluster=cluster)
