"""The accounting loop: copy finished jobs from each cluster's scheduler into the store,
and note the GPUs its pending jobs wait for (``ClusterRow.pending_gpus``).

Incremental and idempotent. The watermark is derived, not stored: the newest ``ended_at``
already copied for the cluster, less an overlap window, so jobs that reach the
scheduler's accounting late (Slurm's slurmdbd was down; a job's record is written after
its end) are still picked up. Rows are keyed by (cluster, scheduler job id) and upserted,
so re-reading the overlap, restarting gpufleet or the scheduler's database never makes a
duplicate, and a requeued job keeps one row that ends up with its final run. A scheduler
that cannot answer is retried next pass; nothing is skipped.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus
from gpufleet.core.errors import DriverError
from gpufleet.core.ids import new_id
from gpufleet.schedulers.base import SchedJob
from gpufleet.server.db.tables import ClusterRow, JobRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)

_LIVE = [ClusterStatus.READY.value, ClusterStatus.DEGRADED.value, ClusterStatus.PROVISIONING.value]


def gpu_hours(job: SchedJob) -> float:
    if job.started_at is None or job.ended_at is None or job.gpus <= 0:
        return 0.0
    seconds = max(0.0, (job.ended_at - job.started_at).total_seconds())
    return job.gpus * seconds / 3600.0


class AccountingLoop(LoopService):
    name = "accounting"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        overlap_s: float = 3600.0,
        first_lookback_s: float = 7 * 86400.0,
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.overlap_s = overlap_s  # how late a job's record may reach the scheduler's DB
        self.first_lookback_s = first_lookback_s  # a new cluster's history copied at first
        self.copied = 0

    async def run_once(self) -> None:
        async with self.db.session() as session:
            clusters = list(
                await session.scalars(select(ClusterRow).where(ClusterRow.status.in_(_LIVE)))
            )
        for cluster in clusters:
            try:
                await self.copy_cluster(cluster)
                await self.read_demand(cluster)
            except DriverError as exc:  # the scheduler is down: try again next pass
                log.warning("accounting: cluster %s: %s", cluster.name, exc.message)
            except Exception:
                log.exception("accounting: cluster %s failed this pass", cluster.name)

    async def read_demand(self, cluster: ClusterRow) -> int:
        """Store the GPUs the cluster's jobs wait for (``Scheduler.pending_gpu_demand``:
        jobs more nodes would start), for ``/metrics`` and the cluster's API object."""
        pending = await scheduler_for(self.drivers, cluster).pending_gpu_demand()
        async with self.db.transaction() as session:
            row = await session.get(ClusterRow, cluster.id)
            if row is not None:
                row.pending_gpus, row.pending_read_at = pending, self.clock.now()
        return pending

    async def copy_cluster(self, cluster: ClusterRow) -> int:
        """Copy the jobs that ended since the watermark. Returns rows written."""
        async with self.db.session() as session:
            newest = await session.scalar(
                select(func.max(JobRow.ended_at)).where(JobRow.cluster_id == cluster.id)
            )
        now = self.clock.now()
        since = (
            newest - dt.timedelta(seconds=self.overlap_s)
            if newest is not None
            else now - dt.timedelta(seconds=self.first_lookback_s)
        )
        jobs = await scheduler_for(self.drivers, cluster).accounting_since(since)
        if not jobs:
            return 0
        async with self.db.transaction() as session:
            written = await _upsert(session, cluster_id=cluster.id, jobs=jobs)
        self.copied += written
        return written


def _values(job: SchedJob) -> dict[str, object]:
    """The job row's copied columns, as the scheduler reports them now."""
    return {
        "name": job.name[:255],
        "user_name": job.user[:128],
        "account": job.account[:128],
        "state": job.state[:32],
        "nodes": list(job.nodes),
        "gpus": job.gpus,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "gpu_hours": gpu_hours(job),
        "exit_code": job.exit_code,
    }


async def _upsert(session: AsyncSession, *, cluster_id: str, jobs: list[SchedJob]) -> int:
    latest: dict[str, SchedJob] = {}
    for job in jobs:  # a requeued job appears once per run: keep its last
        seen = latest.get(job.job_id)
        if seen is None or (job.ended_at or dt.datetime.min.replace(tzinfo=dt.UTC)) >= (
            seen.ended_at or dt.datetime.min.replace(tzinfo=dt.UTC)
        ):
            latest[job.job_id] = job
    existing = {
        row.scheduler_job_id: row
        for row in await session.scalars(
            select(JobRow).where(
                JobRow.cluster_id == cluster_id, JobRow.scheduler_job_id.in_(list(latest))
            )
        )
    }
    written = 0
    for job_id, job in sorted(latest.items()):
        row = existing.get(job_id)
        if row is None:
            row = JobRow(id=new_id(), cluster_id=cluster_id, scheduler_job_id=job_id)
            session.add(row)
        elif row.ended_at is not None and job.ended_at is not None and row.ended_at > job.ended_at:
            continue  # an older run of a requeued job: the row has the newer one
        values = _values(job)
        if all(getattr(row, name) == value for name, value in values.items()):
            continue  # already copied as it is (the overlap window reads it again)
        # Otherwise write it all: slurmdbd may correct a record it got while it was down
        # (seen on 22.05: User=root at first, the submitting --uid user a little later).
        for name, value in values.items():
            setattr(row, name, value)
        written += 1
    return written
