"""The ``Provider`` protocol: where nodes come from, and what can be done to the machine.

Every driver (sim, ipmi, redfish, ssh, aws) implements ``Provider``; optional abilities are
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


@dataclass(frozen=True, slots=True)
class Credential:
    """A secret handed to a driver for the length of one call. Never printed: its repr
    hides the secret, and a driver never puts it in a message, a log line or an error."""

    username: str | None
    secret: str = field(repr=False)  # a password, or a PEM private key (ssh)


@dataclass(frozen=True, slots=True)
class HostAccess:
    """How to reach one machine's management path: its BMC (ipmi, redfish), its OS over
    SSH (ssh) or its cloud instance (aws). ``host_id`` is the instance id the control plane
    records on the node (``provider_instance_id``)."""

    host_id: str
    hostname: str
    address: str  # BMC host or URL (ipmi, redfish), SSH host (ssh), instance id (aws)
    port: int | None = None
    credential: Credential | None = field(default=None, repr=False)
    host_key: str | None = None  # ssh: the pinned public key, "ssh-ed25519 AAAA..."
    system_id: str | None = None  # redfish: which ComputerSystem; None: the only one
    cluster_id: str | None = None
    serial: str | None = None
    rack: str | None = None
    leaf_switch: str | None = None
    pdu: str | None = None


@runtime_checkable
class HostDirectory(Protocol):
    """Where bare-metal drivers (ipmi, redfish, ssh) find their machines: the host
    inventory, with each host's credential decrypted for the call."""

    async def host(self, host_id: str) -> HostAccess | None:
        """One host, or None if the inventory has no such host."""
        ...

    async def hosts(self, cluster_id: str) -> list[HostAccess]:
        """Every host bound to one cluster (spares included)."""
        ...

    async def claim_spare(self, cluster_id: str, client_token: str) -> HostAccess | None:
        """Take a spare host of the cluster's pool for ``client_token``. Idempotent: the same
        token always gets the same host. None: the pool is empty."""
        ...

    async def release(self, host_id: str) -> None:
        """Take a host out of service (a removed or replaced machine): it is no longer
        handed out, and is flagged for hardware service."""
        ...


@dataclass(frozen=True, slots=True)
class ReachCheck:
    """What ``check_reach`` saw of one machine, changing nothing."""

    instance_id: str
    reachable: bool
    power: PowerState
    detail: str  # what was seen, or what failed: never a secret


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
class SupportsReachCheck(Protocol):
    async def check_reach(self, instance_id: str) -> ReachCheck:
        """Reach the machine's BMC, SSH or cloud API and report its power state, or what
        failed (credentials refused, unreachable, timed out). Changes nothing; never
        raises for an unreachable machine."""
        ...


@runtime_checkable
class SupportsReboot(Protocol):
    async def reboot(self, instance_id: str) -> None:
        """Reboot the OS (graceful where possible). Kills running jobs; drain first."""
        ...


@runtime_checkable
class SupportsReprovision(Protocol):
    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
        """Wipe and reinstall the machine, then boot it with ``user_data``.

        Returns None when the same machine was reinstalled (its instance id stays), or the
        new instance when the provider can only relaunch (a cloud without an in-place
        reinstall): the node moves onto it. Kills running jobs and erases local disks;
        drain first.
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
