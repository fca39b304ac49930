"""What the console's cluster pages read besides the API's services: the header every
cluster tab shows, and the versions of what a page shows.

Versions are small reads whose answer changes when the data behind a part of a page
changes. A page is rendered with them; the live poll returns them again, and the page's
script fetches the page anew for the parts whose version moved."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import RepairStatus
from gpufleet.core.models import Cluster, Project
from gpufleet.server.db.tables import (
    AcceptanceRunRow,
    CheckRunRow,
    FindingRow,
    GpuRow,
    NodeRow,
    ProjectRow,
    RepairRow,
)
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import cluster_row_to_cluster, get_cluster_row_or_error
from gpufleet.server.services.projects import project_row_to_project


async def repair_counts(session: AsyncSession, cluster_id: str) -> tuple[int, str]:
    """(repairs waiting for approval, a version that changes whenever any repair of the
    cluster changes: every status change and progress note bumps ``updated_at``)."""
    pending = await session.scalar(
        select(func.count())
        .select_from(RepairRow)
        .where(RepairRow.cluster_id == cluster_id, RepairRow.status == RepairStatus.PROPOSED.value)
    )
    total, latest = (
        await session.execute(
            select(func.count(), func.max(RepairRow.updated_at)).where(
                RepairRow.cluster_id == cluster_id
            )
        )
    ).one()
    return int(pending or 0), f"{total}:{latest.isoformat() if latest else ''}"


async def checks_version(session: AsyncSession, cluster_id: str) -> str:
    """Changes when a check run or an acceptance run of the cluster starts, moves or ends."""
    parts = []
    for table in (CheckRunRow, AcceptanceRunRow):
        total, latest = (
            await session.execute(
                select(func.count(), func.max(table.updated_at)).where(
                    table.cluster_id == cluster_id
                )
            )
        ).one()
        parts.append(f"{total}:{latest.isoformat() if latest else ''}")
    return "|".join(parts)


async def node_version(session: AsyncSession, node_id: str) -> str:
    """Changes when what a node's page shows (state, health, GPU health, open findings,
    repairs) changes; not on every report."""
    node = (
        await session.execute(
            select(NodeRow.state, NodeRow.health, NodeRow.updated_at).where(NodeRow.id == node_id)
        )
    ).one_or_none()
    gpus = (
        await session.execute(
            select(GpuRow.index, GpuRow.health).where(
                GpuRow.node_id == node_id, GpuRow.removed_at.is_(None)
            )
        )
    ).all()
    findings = (
        await session.execute(
            select(func.count(), func.max(FindingRow.last_seen)).where(
                FindingRow.node_id == node_id, FindingRow.cleared_at.is_(None)
            )
        )
    ).one()
    repairs = (
        await session.execute(
            select(func.count(), func.max(RepairRow.updated_at)).where(RepairRow.node_id == node_id)
        )
    ).one()
    parts = [repr(node), repr(sorted(gpus)), repr(tuple(findings)), repr(tuple(repairs))]
    return hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest()


def cluster_version(cluster: Cluster) -> str:
    """Changes with what a cluster page's header shows: status and health."""
    return f"{cluster.status}|{cluster.health}|{cluster.status_detail}"


async def cluster_versions(session: AsyncSession, cluster: Cluster) -> tuple[int, dict[str, str]]:
    """(repairs waiting for approval, the versions every cluster page is rendered with
    and the live poll compares: repairs, checks, cluster)."""
    pending, repairs = await repair_counts(session, cluster.id)
    return pending, {
        "repairs": repairs,
        "checks": await checks_version(session, cluster.id),
        "cluster": cluster_version(cluster),
    }


@dataclass(frozen=True)
class ClusterHeader:
    """What every cluster tab shows around its content."""

    cluster: Cluster  # without node counts: tabs that need them load their own
    project: Project
    pending_repairs: int
    versions: dict[str, str]  # what the page shows was read at these versions


async def load_cluster_header(
    session: AsyncSession, *, caller: Caller, cluster_id: str
) -> ClusterHeader:
    """NotFound for a cluster the caller cannot see (the same answer as a missing one)."""
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    project = await session.get(ProjectRow, row.project_id)
    assert project is not None  # clusters reference their project (RESTRICT)
    cluster = cluster_row_to_cluster(row)
    pending, versions = await cluster_versions(session, cluster)
    return ClusterHeader(
        cluster=cluster,
        project=project_row_to_project(project),
        pending_repairs=pending,
        versions=versions,
    )
