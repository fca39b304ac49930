"""``SimScheduler``: the ``Scheduler`` driver over a ``SimWorld``'s workload manager.

One world serves every sim cluster. Node names are only unique within a cluster, so the
server should use ``for_cluster(cluster_id)``; the unscoped scheduler refuses a name that
two clusters share rather than guess.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from gpufleet.core.autoscale import PendingWork
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import (
    DRAIN_REASON_PREFIX,
    SchedJob,
    SchedNode,
    SchedNodeState,
)
from gpufleet.sim.models import SimInstanceState, SimJob, SimNodeStatus
from gpufleet.sim.world import SimWorld


def to_sched_node(status: SimNodeStatus) -> SchedNode:
    """Map the sim's flags to one Slurm-like state: down > drain > boot state > jobs."""
    busy = bool(status.job_ids)
    reason = status.reason
    if status.down:
        state = SchedNodeState.DOWN
    elif status.drained:
        state = SchedNodeState.DRAINING if busy else SchedNodeState.DRAINED
    elif status.instance_state is SimInstanceState.PENDING:
        state, reason = SchedNodeState.UNKNOWN, "booting"
    elif status.instance_state is not SimInstanceState.RUNNING:
        state, reason = SchedNodeState.DOWN, "not responding"
    else:
        state = SchedNodeState.ALLOCATED if busy else SchedNodeState.IDLE
    return SchedNode(
        name=status.node_name,
        state=state,
        reason=reason,
        gpus=status.gpus,
        gpus_allocated=status.gpus if busy else 0,
        job_ids=status.job_ids,
    )


def to_sched_job(job: SimJob) -> SchedJob:
    return SchedJob(
        job_id=job.job_id,
        name=job.name,
        user=job.user,
        account=job.account,
        state=job.state,
        nodes=job.nodes,
        gpus=job.gpus,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        exit_code=job.exit_code,
        extra={"cluster_id": job.cluster_id, "partition": "gpu", "restarts": str(job.requeues)},
    )


class SimScheduler:
    """Simulated workload manager. Implements Scheduler, SupportsDrain, SupportsDown,
    SupportsRequeue and SupportsPendingWork.

    Job states in accounting: COMPLETED/FAILED (ended by itself), NODE_FAIL (killed by
    its node going away: down, reboot, reprovision, GPU reset, terminate) and REQUEUED
    (stopped by ``requeue_jobs``; the same job id is PENDING again)."""

    kind = "sim"

    def __init__(self, world: SimWorld, *, cluster_id: str | None = None) -> None:
        self._world = world
        self._cluster_id = cluster_id

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    def for_cluster(self, cluster_id: str) -> SimScheduler:
        """A view of one cluster's nodes and jobs over the same world."""
        return SimScheduler(self._world, cluster_id=cluster_id)

    async def _fresh(self, command: str) -> None:
        # Reads move the workload first, so jobs progress even with no fleet runner.
        self._check_available(command)
        await asyncio.to_thread(self._world.advance)

    async def list_nodes(self) -> list[SchedNode]:
        """Every node with a machine that is not terminated. Touches nothing."""
        await self._fresh("sinfo")
        return [to_sched_node(s) for s in self._world.node_statuses(cluster_id=self._cluster_id)]

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        """Jobs running on ``node``; raises ``DriverError`` if the node is unknown or the
        scheduler is unavailable (never an empty list in place of an error)."""
        await self._fresh(f"squeue -w {node}")
        jobs = self._world.jobs_on_node(node, cluster_id=self._cluster_id)
        return [to_sched_job(j) for j in jobs]

    async def pending_gpu_demand(self) -> int:
        """GPUs asked for by queued jobs that wait for nodes (``pending_work``'s total)."""
        return sum(w.gpus for w in await self.pending_work())

    async def pending_work(self) -> list[PendingWork]:
        """The queued jobs (of this cluster, for a cluster-scoped scheduler), after the
        workload moved to now, so each one waits for nodes: id, GPUs (its whole nodes'),
        and since when it waits (submit time, or its last requeue). Touches nothing.
        Raises ``DriverError`` when the scheduler is unavailable (never an empty list)."""
        await self._fresh("squeue --states=PENDING")
        return self._world.pending_work(cluster_id=self._cluster_id)

    async def accounting_since(self, since: dt.datetime) -> list[SchedJob]:
        """Jobs that ended at or after ``since``, oldest first."""
        await self._fresh("sacct")
        return [
            to_sched_job(j)
            for j in self._world.accounting_since(since, cluster_id=self._cluster_id)
        ]

    async def drain(self, node: str, *, reason: str) -> None:
        """Drain ``node``: no new jobs, running ones finish. Idempotent; an existing
        operator drain keeps its reason."""
        self._check_available(f"scontrol update nodename={node} state=drain")
        await asyncio.to_thread(
            self._world.drain_node, node, reason=reason, cluster_id=self._cluster_id
        )

    async def resume(self, node: str) -> None:
        """Undo gpufleet's drain/down; an idle node resumes trivially. Raises
        ``DriverError`` for a drain whose reason lacks ``DRAIN_REASON_PREFIX``."""
        self._check_available(f"scontrol update nodename={node} state=resume")
        await asyncio.to_thread(
            self._world.resume_node,
            node,
            cluster_id=self._cluster_id,
            only_reason_prefix=DRAIN_REASON_PREFIX,
        )

    async def down(self, node: str, *, reason: str) -> None:
        """Mark ``node`` down now; its running job is killed (NODE_FAIL)."""
        self._check_available(f"scontrol update nodename={node} state=down")
        await asyncio.to_thread(
            self._world.down_node, node, reason=reason, cluster_id=self._cluster_id
        )

    async def requeue_jobs(self, node: str) -> list[str]:
        """Requeue the jobs on ``node``: each stops (REQUEUED in accounting) and waits in
        the queue under its id, to start again on a node that is not drained. Returns the
        job ids. Raises ``DriverError`` for an unknown node, an unavailable scheduler or a
        job that cannot be requeued (then none is)."""
        # Move the workload first: a job whose time is up completed, it is not requeued.
        await self._fresh(f"scontrol requeue (jobs on {node})")
        return await asyncio.to_thread(
            self._world.requeue_jobs_on_node, node, cluster_id=self._cluster_id
        )

    def _check_available(self, command: str) -> None:
        if not self._world.scheduler_available:
            raise DriverError(f"sim scheduler: {command}: slurmctld is not responding")
