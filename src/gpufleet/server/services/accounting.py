"""GPU-hours from the jobs the accounting loop copied: by project, cluster, user, account
and day. Only the caller's projects count; a job counts on the day it ended (UTC)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.errors import InvalidInput
from gpufleet.core.models import GpuHours, GpuHoursRow, UsageGroup
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import ClusterRow, JobRow, ProjectRow
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.projects import get_project_row_or_error

MAX_SPAN = dt.timedelta(days=366)


async def gpu_hours(
    session: AsyncSession,
    *,
    caller: Caller,
    group_by: list[UsageGroup],
    since: dt.datetime,
    until: dt.datetime,
    project_ref: str | None = None,
    cluster_id: str | None = None,
) -> GpuHours:
    """GPU-hours and jobs per group, rows sorted by their keys, and the totals."""
    if until <= since:
        raise InvalidInput("until must be after since", field="until")
    if until - since > MAX_SPAN:
        raise InvalidInput("at most 366 days per query", field="since")
    query = (
        select(
            ProjectRow.name,
            ClusterRow.name,
            JobRow.user_name,
            JobRow.account,
            JobRow.ended_at,
            JobRow.gpu_hours,
        )
        .join(ClusterRow, ClusterRow.id == JobRow.cluster_id)
        .join(ProjectRow, ProjectRow.id == ClusterRow.project_id)
        .where(JobRow.ended_at >= since, JobRow.ended_at < until)
    )
    visible = caller.visible_project_ids()
    if visible is not None:
        query = query.where(
            ClusterRow.project_id.in_(
                [p for p in visible if caller.can(Permission.CLUSTER_READ, p)]
            )
        )
    if project_ref is not None:
        project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
        query = query.where(ClusterRow.project_id == project.id)
    if cluster_id is not None:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        query = query.where(JobRow.cluster_id == cluster.id)
    groups = list(dict.fromkeys(group_by))
    sums: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0])
    total, jobs = 0.0, 0
    for project_name, cluster_name, user, account, ended, hours in await session.execute(query):
        values: dict[UsageGroup, str] = {
            UsageGroup.PROJECT: str(project_name),
            UsageGroup.CLUSTER: str(cluster_name),
            UsageGroup.USER: str(user),
            UsageGroup.ACCOUNT: str(account),
            UsageGroup.DAY: ended.astimezone(dt.UTC).date().isoformat() if ended else "",
        }
        key = tuple(values[g] for g in groups)
        sums[key][0] += hours
        sums[key][1] += 1
        total += hours
        jobs += 1
    rows = [
        GpuHoursRow.model_validate(
            {**{g.value: k for g, k in zip(groups, key, strict=True)},
             "gpu_hours": round(s[0], 4), "jobs": int(s[1])}
        )
        for key, s in sorted(sums.items())
    ]  # fmt: skip
    return GpuHours(
        group_by=groups,
        since=since,
        until=until,
        rows=rows,
        total_gpu_hours=round(total, 4),
        jobs=jobs,
    )
