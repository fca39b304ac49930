"""The ``Scheduler`` protocol: the workload manager on a cluster (Slurm, Kubernetes, sim).

Inputs and outputs are frozen dataclasses. Optional abilities are capability protocols.
A call that fails raises ``DriverError`` (naming the node, the command and its stderr);
it never returns an empty list in place of an error, because an empty job list would
let a drain kill jobs it could not see.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

# Only drains whose reason starts with this are gpufleet's to undo.
DRAIN_REASON_PREFIX = "gpufleet:"


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
