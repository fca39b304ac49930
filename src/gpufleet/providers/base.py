"""The ``Provider`` protocol: where nodes come from, and what can be done to the machine.

Every driver (sim, static, redfish, aws) implements ``Provider``; optional abilities are
separate capability protocols, checked with ``isinstance`` (they are runtime-checkable).
Calls are idempotent where the docstring says so, because the control plane may crash
between calling a provider and recording the answer, and then calls again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable


class InstanceState(StrEnum):
    PENDING = "pending"  # asked for, not booted yet
    RUNNING = "running"  # booted; its agent may report
    FAILED = "failed"  # will never boot; terminate and ask again
    TERMINATED = "terminated"


class PowerState(StrEnum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ProvisionRequest:
    client_token: str  # idempotency key: the same token always means the same instance
    cluster_id: str
    node_name: str
    gpu_model: str
    gpu_count: int
    user_data: dict[str, str] = field(default_factory=dict)  # handed to the node at boot


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    client_token: str
    cluster_id: str
    node_name: str
    state: InstanceState
    created_at: dt.datetime
    hostname: str | None = None
    serial: str | None = None
    bmc_address: str | None = None
    rack: str | None = None
    leaf_switch: str | None = None
    pdu: str | None = None
    error: str | None = None  # why it failed, for a FAILED instance
    # When the machine last started booting (creation, reboot, power cycle, reinstall).
    # The reconciler records when it asked for a reboot before asking; after a crash it
    # compares the two to know whether the reboot already happened. None: not known.
    booted_at: dt.datetime | None = None


@runtime_checkable
class Provider(Protocol):
    kind: str

    async def provision(self, request: ProvisionRequest) -> Instance:
        """Ask for one machine. Idempotent by ``request.client_token``.

        Returns the instance (usually PENDING). Calling again with the same token returns
        the same instance and refreshes its user data. Touches no running job.
        Raises ``DriverError`` naming the node when the provider refuses.
        """
        ...

    async def get_instance(self, instance_id: str) -> Instance | None:
        """The instance's current state (TERMINATED once given back, for as long as the
        provider remembers it), or None if the provider has no such instance."""
        ...

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        """Every instance of one cluster that is not terminated."""
        ...

    async def terminate(self, instance_id: str) -> None:
        """Give the machine back. Idempotent: terminating a missing instance succeeds.

        Kills whatever runs on it; the control plane drains first.
        """
        ...


@runtime_checkable
class SupportsPower(Protocol):
    async def power_state(self, instance_id: str) -> PowerState:
        """The machine's power state as its BMC or cloud reports it."""
        ...

    async def power_cycle(self, instance_id: str) -> None:
        """Hard power cycle. Kills every job on the node; drain first."""
        ...


@runtime_checkable
class SupportsReboot(Protocol):
    async def reboot(self, instance_id: str) -> None:
        """Reboot the OS (graceful where possible). Kills running jobs; drain first."""
        ...


@runtime_checkable
class SupportsReprovision(Protocol):
    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> None:
        """Wipe and reinstall the same machine, then boot it with ``user_data``.

        Kills running jobs and erases local disks; drain first.
        """
        ...


@runtime_checkable
class SupportsReplace(Protocol):
    async def replace(self, instance_id: str, *, request: ProvisionRequest) -> Instance:
        """Failover: give back ``instance_id`` and bring up a new machine in its place.

        Idempotent by ``request.client_token``. Kills running jobs on the old machine.
        """
        ...


@runtime_checkable
class SupportsGpuReset(Protocol):
    async def reset_gpu(self, instance_id: str, *, gpu_index: int | None) -> None:
        """Reset one GPU of the machine (every GPU if ``gpu_index`` is None).

        On real hardware this is ``nvidia-smi -r`` through the node agent. Kills the jobs
        using that GPU (the sim: the node's job); drain first. The machine stays up: its
        ``booted_at`` does not change. Raises ``DriverError`` naming the node and GPU
        when the reset fails (the GPU is then as bad as before).
        """
        ...
