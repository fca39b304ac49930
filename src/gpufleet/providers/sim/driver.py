"""``SimProvider``: the ``Provider`` driver over a ``SimWorld``.

World calls run in a worker thread because a mutation rewrites the world's state file,
which at fleet scale takes long enough to stall the control plane's event loop.
"""

from __future__ import annotations

import asyncio

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import Instance, InstanceState, PowerState, ProvisionRequest
from gpufleet.providers.sim.config import SimProviderConfig
from gpufleet.sim.models import BootPlan, SimInstance, SimInstanceSpec, SimInstanceState
from gpufleet.sim.world import SimWorld


def to_instance(sim: SimInstance) -> Instance:
    """The provider-protocol view of a simulated instance."""
    return Instance(
        instance_id=sim.instance_id,
        client_token=sim.client_token,
        cluster_id=sim.cluster_id,
        node_name=sim.node_name,
        state=InstanceState(sim.state.value),
        created_at=sim.created_at,
        hostname=sim.hostname,
        serial=sim.serial,
        bmc_address=sim.bmc_address,
        rack=sim.rack,
        leaf_switch=sim.leaf_switch,
        pdu=sim.pdu,
        error=sim.error,
        booted_at=sim.booted_at,
    )


def _spec(request: ProvisionRequest) -> SimInstanceSpec:
    return SimInstanceSpec(
        client_token=request.client_token,
        cluster_id=request.cluster_id,
        node_name=request.node_name,
        gpu_model=request.gpu_model,
        gpu_count=request.gpu_count,
        user_data=dict(request.user_data),
    )


class SimProvider:
    """Simulated machines. Implements Provider, SupportsPower, SupportsReboot,
    SupportsReprovision, SupportsReplace and SupportsGpuReset."""

    kind = "sim"

    def __init__(self, world: SimWorld, *, config: SimProviderConfig | None = None) -> None:
        self._world = world
        self._config = config or SimProviderConfig()
        self._boot = BootPlan(self._config.provision_delay_s, self._config.failure_rate)
        # A reboot reuses the installed OS: quick, and it fails only if the host already
        # did or at ``reboot_failure_rate`` (hardware that does not survive a restart).
        self._reboot = BootPlan(self._config.reboot_delay_s, self._config.reboot_failure_rate)
        self._reset = BootPlan(self._config.reset_gpu_delay_s, self._config.reset_gpu_failure_rate)

    @property
    def world(self) -> SimWorld:
        return self._world

    async def provision(self, request: ProvisionRequest) -> Instance:
        """Boot a simulated machine; idempotent by ``client_token`` (refreshes user_data).

        Raises ``DriverError`` for an unknown GPU model, a bad count or no capacity.
        """
        sim = await asyncio.to_thread(
            self._world.provision,
            _spec(request),
            plan=self._boot,
            max_instances=self._config.max_instances,
        )
        return to_instance(sim)

    async def get_instance(self, instance_id: str) -> Instance | None:
        """The instance (terminated ones too), or None if the sim never made it."""
        sim = self._world.get_instance(instance_id)
        return None if sim is None else to_instance(sim)

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        """Instances of the cluster that are not terminated, oldest first."""
        return [to_instance(s) for s in self._world.list_instances(cluster_id=cluster_id)]

    async def terminate(self, instance_id: str) -> None:
        """Give the machine back; kills its job. Missing or terminated: succeeds."""
        await asyncio.to_thread(self._world.terminate, instance_id)

    async def power_state(self, instance_id: str) -> PowerState:
        """ON while the machine exists (booting included), OFF once terminated."""
        sim = self._world.get_instance(instance_id)
        if sim is None:
            raise DriverError(f"sim: power state of {instance_id}: no such instance")
        return PowerState.OFF if sim.state is SimInstanceState.TERMINATED else PowerState.ON

    async def power_cycle(self, instance_id: str) -> None:
        """Hard power cycle: like a reboot here (counted apart). Kills the node's job."""
        await asyncio.to_thread(self._world.reboot, instance_id, plan=self._reboot, hard=True)

    async def reboot(self, instance_id: str) -> None:
        """Reboot: pending for ``reboot_delay_s``, then running; at ``reboot_failure_rate``
        FAILED instead, with an ``error``. Sets ``booted_at``. Kills the node's job
        (NODE_FAIL). Raises ``DriverError`` for a missing or terminated instance."""
        await asyncio.to_thread(self._world.reboot, instance_id, plan=self._reboot)

    async def reset_gpu(self, instance_id: str, *, gpu_index: int | None) -> None:
        """Reset one GPU (all if None) of a running machine; returns at once.

        The GPU is then off the bus for ``reset_gpu_delay_s`` (missing from the node's
        reports, no job starts on the node) and back after it, its non-sticky faults
        cleared; node-wide and sticky faults stay. Kills the node's job (NODE_FAIL);
        ``booted_at`` does not change. Raises ``DriverError`` naming the node and the
        command at ``reset_gpu_failure_rate`` (nothing changed then), and for a machine
        that is not running or a GPU out of range.
        """
        await asyncio.to_thread(
            self._world.reset_gpu, instance_id, gpu_index=gpu_index, plan=self._reset
        )

    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
        """Reinstall and boot with ``user_data``; takes a full provisioning delay."""
        await asyncio.to_thread(
            self._world.reprovision, instance_id, user_data=dict(user_data), plan=self._boot
        )
        return None  # the same machine, reinstalled

    async def replace(self, instance_id: str, *, request: ProvisionRequest) -> Instance:
        """Terminate ``instance_id`` and boot a new host; idempotent by client_token."""
        sim = await asyncio.to_thread(
            self._world.replace, instance_id, spec=_spec(request), plan=self._boot
        )
        return to_instance(sim)
