"""What the simulated world hands out: frozen snapshots, never its live records.

The simulator sits below the driver layer, so it has its own small state words; the sim
provider and scheduler drivers map them onto ``InstanceState`` and ``SchedNodeState``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from enum import StrEnum

# user_data keys a simulated node reads at boot to find the control plane.
USER_DATA_URL = "gpufleet_url"
USER_DATA_TOKEN = "gpufleet_node_token"  # noqa: S105 - a key name, not a secret


def sim_boot_id(instance_id: str, boot: int) -> str:
    """The kernel boot id a simulated machine's agent reports: a UUID like the kernel's,
    the same for one boot of one machine and new on every reboot or reinstall."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet-sim:{instance_id}/{boot}"))


class SimInstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    FAILED = "failed"
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class SimInstanceSpec:
    """What to boot: the sim's view of a provision request."""

    client_token: str
    cluster_id: str
    node_name: str
    gpu_model: str
    gpu_count: int
    user_data: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BootPlan:
    """How the next boot goes: how long it takes and how often it fails. A GPU reset
    uses one too: how long the GPU stays off, and how often the reset fails."""

    delay_range_s: tuple[float, float] = (30.0, 90.0)
    failure_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class SimGpu:
    index: int
    uuid: str
    serial: str


@dataclass(frozen=True, slots=True)
class SimInstance:
    instance_id: str
    client_token: str
    cluster_id: str
    node_name: str
    gpu_model: str
    gpu_count: int
    state: SimInstanceState
    created_at: dt.datetime
    ready_at: dt.datetime
    hostname: str
    serial: str
    bmc_address: str
    rack: str
    leaf_switch: str
    pdu: str
    gpus: tuple[SimGpu, ...]
    user_data: dict[str, str]
    boot_id: int  # grows on every reboot/reprovision: a new agent process on the node
    error: str | None = None
    terminated_at: dt.datetime | None = None
    booted_at: dt.datetime | None = None  # when the last boot started (creation, reboot, ...)
    # GPUs being reset, with when each is back: reports leave them out until then.
    resetting_until: dict[int, dt.datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SimJob:
    job_id: str
    name: str
    user: str
    account: str
    cluster_id: str
    state: str  # Slurm's words: PENDING, RUNNING, COMPLETED, FAILED, NODE_FAIL, REQUEUED
    node_count: int
    nodes: tuple[str, ...]
    gpus: int
    submitted_at: dt.datetime
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    exit_code: int | None = None
    requeues: int = 0  # times this job was requeued before this run


@dataclass(frozen=True, slots=True)
class SimNodeStatus:
    """One node as the simulated workload manager sees it."""

    cluster_id: str
    node_name: str
    instance_id: str
    instance_state: SimInstanceState
    gpus: int
    drained: bool
    down: bool
    reason: str | None
    job_ids: tuple[str, ...]
