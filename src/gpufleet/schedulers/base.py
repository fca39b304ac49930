"""The ``Scheduler`` protocol: the workload manager on a cluster (Slurm, Kubernetes, sim).

Inputs and outputs are frozen dataclasses. Optional abilities are capability protocols.
A call that fails raises ``DriverError`` (naming the node, the command and its stderr);
it never returns an empty list in place of an error, because an empty job list would
let a drain kill jobs it could not see.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar, runtime_checkable

# Only drains whose reason starts with this are gpufleet's to undo (the grammar of the
# reasons is ``gpufleet.core.holds``; the drivers need only the prefix, to refuse others).
from gpufleet.core.autoscale import PendingWork
from gpufleet.core.errors import DriverError
from gpufleet.core.holds import DRAIN_REASON_PREFIX as DRAIN_REASON_PREFIX


class SchedNodeState(StrEnum):
    IDLE = "idle"
    ALLOCATED = "allocated"
    MIXED = "mixed"
    DRAINING = "draining"  # drain asked, jobs still running
    DRAINED = "drained"
    DOWN = "down"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class SchedNode:
    name: str
    state: SchedNodeState
    reason: str | None = None
    gpus: int = 0  # GPUs the scheduler knows on this node (GRES / allocatable)
    gpus_allocated: int = 0
    job_ids: tuple[str, ...] = ()
    # The scheduler waits for this node's machine (Slurm's power saving: powered down or
    # powering up): its daemon has not registered, so nothing runs there yet and a job
    # the scheduler allocated to it starts the moment it does.
    powered_down: bool = False


@dataclass(frozen=True, slots=True)
class SchedJob:
    job_id: str
    name: str
    user: str
    account: str
    state: str  # the scheduler's own word: RUNNING, COMPLETED, FAILED, ...
    nodes: tuple[str, ...]
    gpus: int
    submitted_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    exit_code: int | None = None
    extra: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Scheduler(Protocol):
    kind: str

    async def list_nodes(self) -> list[SchedNode]:
        """Every node the scheduler knows, with state and reason. Touches nothing."""
        ...

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        """Jobs running on ``node`` now. Raises if the state cannot be read."""
        ...

    async def pending_gpu_demand(self) -> int:
        """GPUs asked for by jobs that wait for resources (for autoscaling)."""
        ...

    async def accounting_since(self, since: dt.datetime) -> list[SchedJob]:
        """Jobs that ended at or after ``since``, oldest first."""
        ...


@runtime_checkable
class SupportsJobsOnNodes(Protocol):
    async def jobs_on_nodes(self, nodes: Sequence[str]) -> dict[str, list[SchedJob] | None]:
        """What ``jobs_on_node`` answers for each of ``nodes``, from one read of the
        scheduler's state whatever their number (``None`` for a node it does not know).
        Raises when the state cannot be read."""
        ...


A = TypeVar("A")
B = TypeVar("B")


async def both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Run two reads at once; wait for both even when one fails (no command or request
    is left running), then raise the first one's error (so messages do not depend on
    timing)."""
    a, b = await asyncio.gather(first, second, return_exceptions=True)
    for outcome in (a, b):
        if isinstance(outcome, BaseException):
            raise outcome
    return a, b  # type: ignore[return-value]


# Per-node reads at once, for a scheduler without SupportsJobsOnNodes.
JOB_READS_AT_ONCE = 8


async def jobs_on_nodes(
    scheduler: Scheduler, nodes: Sequence[str], *, at_once: int = JOB_READS_AT_ONCE
) -> dict[str, list[SchedJob] | DriverError]:
    """The jobs on each of ``nodes``, or the ``DriverError`` that kept them from being
    read. One read where the scheduler can answer for many nodes at once, else
    ``at_once`` per-node reads at a time: a caller with a deadline (Cluster Autoscaler's
    DeleteNodes, 5 s) must not pay a round trip per node in turn, nor a scheduler a
    burst of one full job listing per node (a switch incident proposes many repairs)."""
    if not nodes:  # the planner asks on every pass, mostly for none
        return {}
    if isinstance(scheduler, SupportsJobsOnNodes):
        try:
            found = await scheduler.jobs_on_nodes(nodes)
        except DriverError as exc:
            return dict.fromkeys(nodes, exc)
        return {
            n: DriverError(f"node {n}: the scheduler does not list it")
            if (jobs := found.get(n)) is None
            else jobs
            for n in nodes
        }
    gate = asyncio.Semaphore(at_once)

    async def one(node: str) -> list[SchedJob] | DriverError:
        async with gate:
            try:
                return await scheduler.jobs_on_node(node)
            except DriverError as exc:
                return exc

    read = await asyncio.gather(*(one(n) for n in nodes))
    return dict(zip(nodes, read, strict=True))


@runtime_checkable
class SupportsDrain(Protocol):
    async def drain(self, node: str, *, reason: str) -> None:
        """Stop new work on ``node``; running jobs finish. ``reason`` starts with
        ``DRAIN_REASON_PREFIX`` when gpufleet drains. Idempotent."""
        ...

    async def resume(self, node: str) -> None:
        """Undo gpufleet's drain. Resuming an idle node succeeds. Refuses (DriverError)
        to clear a drain whose reason is not gpufleet's."""
        ...


@runtime_checkable
class SupportsDown(Protocol):
    async def down(self, node: str, *, reason: str) -> None:
        """Mark ``node`` down at once. Running jobs are killed or requeued."""
        ...


@runtime_checkable
class SupportsRequeue(Protocol):
    async def requeue_jobs(self, node: str) -> list[str]:
        """Requeue every job running on ``node`` (Slurm ``scontrol requeue``).

        Each job stops on all of its nodes and goes back to the queue under the same job
        id, to start again from the beginning wherever there is room (never on a drained
        node). Returns the job ids requeued (empty when none ran). Raises
        ``DriverError`` naming the node and job when a job cannot be requeued; then no
        job is requeued.
        """
        ...


@dataclass(frozen=True, slots=True)
class BatchJobSpec:
    """A batch job for ``SupportsJobs.submit_job``: ``script`` is a file the scheduler's
    nodes can read; its output goes to ``output`` (a path they can write)."""

    name: str
    script: str
    nodes: tuple[str, ...]
    output: str
    time_limit_s: float
    reservation: str | None = None
    exclusive: bool = True  # the whole nodes; False shares them with running jobs
    gpus_per_node: int | None = None
    workdir: str | None = None


@dataclass(frozen=True, slots=True)
class BatchJobState:
    job_id: str
    name: str
    state: str  # the scheduler's word: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...
    ended: bool
    exit_code: int | None = None  # 128 + signal for a job killed by one
    reason: str | None = None  # why it waits or ended (Slurm's Reason)


@runtime_checkable
class SupportsJobs(Protocol):
    async def submit_job(self, spec: BatchJobSpec) -> str:
        """Submit a batch job; returns its id. Raises ``DriverError`` with the
        scheduler's refusal (unknown reservation, nodes not in it, ...). Touches no
        running job."""
        ...

    async def job_state(self, job_id: str) -> BatchJobState:
        """A job's state, from the queue while it is there and from accounting after.
        Raises ``DriverError`` for a job the scheduler has no record of."""
        ...

    async def find_jobs(self, name: str) -> list[BatchJobState]:
        """Jobs named ``name`` still queued or running (to find one submitted before a
        crash instead of submitting it twice)."""
        ...

    async def cancel_job(self, job_id: str) -> None:
        """Cancel the job (its processes get SIGTERM, then SIGKILL). An ended or unknown
        job is no error."""
        ...


@dataclass(frozen=True, slots=True)
class ReservationInfo:
    name: str
    nodes: tuple[str, ...]
    state: str  # ACTIVE, INACTIVE
    flags: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    end_time: dt.datetime | None = None
    start_time: dt.datetime | None = None  # aware UTC; a future one for a window ahead


@runtime_checkable
class SupportsReservations(Protocol):
    async def create_reservation(
        self,
        name: str,
        *,
        nodes: tuple[str, ...],
        duration_s: float,
        users: tuple[str, ...],
        ignore_jobs: bool = False,
        start: dt.datetime | None = None,
    ) -> None:
        """Reserve ``nodes`` from ``start`` (None: now) for ``duration_s`` for ``users``'
        jobs only, as maintenance. New jobs of anyone else do not start there; running
        jobs are never touched. Without ``ignore_jobs`` it refuses (``DriverError``) when a
        job runs on any of the nodes; with it, the reservation is made anyway and the
        users' jobs wait for or share the nodes.

        ``start`` (an aware datetime) books a window ahead, e.g. a rollout's: until then
        the nodes run jobs as before, but a job whose time limit would reach into the
        window does not start on them, so the nodes are empty when it opens. Without
        ``ignore_jobs`` the refusal above covers jobs that would still run when the window
        opens (by their time limits), not only those running now.

        A reservation named ``name`` that already exists on the same nodes (and the same
        ``start``, when given) is no error, so a caller that retries after a lost answer
        gets the reservation once; one by that name on other nodes or at another start
        raises ``DriverError``. Callers that need more (same duration, same users) list
        first. Raises ``ValueError`` for a naive ``start``."""
        ...

    async def delete_reservation(self, name: str) -> None:
        """Remove it; a reservation that does not exist is no error. Jobs running in it
        run on."""
        ...

    async def list_reservations(self) -> list[ReservationInfo]:
        """Every reservation the scheduler holds."""
        ...


@dataclass(frozen=True, slots=True)
class EvictionPass:
    """What one pass of evictions on a node came to (``SupportsEviction.evict_pods``)."""

    evicted: tuple[str, ...] = ()  # "namespace/name", accepted this pass
    blocked: tuple[str, ...] = ()  # refused for now (a PodDisruptionBudget: 429), with why
    terminating: tuple[str, ...] = ()  # evicted earlier, still in their grace period
    skipped: tuple[str, ...] = ()  # DaemonSet and mirror pods: never evicted


@runtime_checkable
class SupportsEviction(Protocol):
    async def evict_pods(self, node: str) -> EvictionPass:
        """Ask each pod on the drained ``node`` to leave through the scheduler's own
        disruption rules (Kubernetes' Eviction API: a PodDisruptionBudget may refuse for
        now, and the pod gets its grace period). Never deletes a pod. Called on every
        pass of a drain until no job is left; idempotent. Raises ``DriverError`` when the
        pods cannot be read or an eviction fails for another reason than a budget."""
        ...


@runtime_checkable
class SupportsPendingWork(Protocol):
    async def pending_work(self) -> list[PendingWork]:
        """Each job or pod that waits for GPUs now (not one held by a user, a dependency
        or a limit): its id, the GPUs it asks for in all, and since when it waits (its
        submit time; the time it last went back to the queue). For the autoscaler. Raises
        ``DriverError`` when the queue cannot be read (never an empty list instead)."""
        ...
