"""``IpmiProvider``: the ``Provider`` driver for bare-metal hosts over IPMI-over-LAN.

The hosts come from a ``HostDirectory`` (the inventory, with each BMC's credential);
every action is one or two ``ipmitool`` runs against the host's BMC (``client.py``).
IPMI sees the chassis, not the OS: it can say a machine has power, never that it booted,
so ``booted_at`` is always None and the control plane proves a reboot by the agent's
boot id changing, never by a BMC answering.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import defaultdict

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import (
    HostAccess,
    HostDirectory,
    Instance,
    InstanceState,
    PowerState,
    ProvisionRequest,
    ReachCheck,
)
from gpufleet.providers.ipmi.client import IpmiError, IpmitoolClient
from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.parsing import BootFlags, Failure, parse_boot_flags, parse_power_status

log = logging.getLogger(__name__)

# BMCs are small computers: list_instances asks this many of them at once, at most.
_LIST_CONCURRENCY = 16


class IpmiProvider:
    """Bare-metal hosts driven through their BMCs over IPMI. Implements Provider,
    SupportsPower, SupportsReboot, SupportsReprovision and SupportsReachCheck.

    An instance is a host of the inventory; its id is the inventory's ``host_id``. Calls
    to one BMC are made one at a time (BMCs hold only a few sessions).
    """

    kind = "ipmi"

    def __init__(self, config: IpmiConfig, directory: HostDirectory) -> None:
        self._config = config
        self._directory = directory
        self._client = IpmitoolClient(config)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # What IPMI cannot tell and this process learnt: the token a host was claimed
        # for, when this driver first saw it, and which hosts it gave back. Lost on
        # restart; the control plane keeps the durable record.
        self._tokens: dict[str, str] = {}
        self._first_seen: dict[str, dt.datetime] = {}
        self._terminated: set[str] = set()

    @property
    def config(self) -> IpmiConfig:
        return self._config

    # ------------------------------------------------------------------ Provider

    async def provision(self, request: ProvisionRequest) -> Instance:
        """Claim a spare host of the cluster's pool for ``request.client_token`` and
        power it on if it is off. Idempotent by token: the directory hands the same host
        to the same token, and powering on a running host changes nothing.

        IPMI has no way to hand ``user_data`` to the machine: the host's OS image (PXE
        install or the ssh provider) must bring the agent its configuration.

        Raises:
            DriverError: the pool has no spare host, or the BMC failed (the host stays
                claimed for the token, so a retry gets it again).
        """
        access = await self._directory.claim_spare(request.cluster_id, request.client_token)
        if access is None:
            raise DriverError(
                f"ipmi: cluster {request.cluster_id}: no spare host in the pool for node "
                f"{request.node_name}; add hosts to the cluster's pool"
            )
        self._tokens[access.host_id] = request.client_token
        self._terminated.discard(access.host_id)
        await self._power_on(access)
        return self._instance(
            access, PowerState.ON, node_name=request.node_name, cluster_id=request.cluster_id
        )

    async def get_instance(self, instance_id: str) -> Instance | None:
        """The host as its BMC reports it: RUNNING with power on, PENDING with power off
        (TERMINATED once this driver gave it back). ``booted_at`` is None: a BMC cannot
        prove a boot. None if the inventory has no such host.

        Raises:
            DriverError: the BMC did not answer or refused the credentials.
        """
        access = await self._directory.host(instance_id)
        if access is None:
            return None
        if instance_id in self._terminated:
            return self._instance(access, PowerState.OFF, terminated=True)
        return self._instance(access, await self._power_state(access))

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        """Every host bound to the cluster (spares included) that this driver has not
        given back. A host whose BMC fails is listed PENDING with the failure in
        ``error``, so that a cluster deletion still finds (and terminates) it."""
        hosts = [
            h for h in await self._directory.hosts(cluster_id) if h.host_id not in self._terminated
        ]
        gate = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def one(access: HostAccess) -> Instance:
            async with gate:
                try:
                    power = await self._power_state(access)
                except DriverError as exc:
                    return self._instance(access, PowerState.UNKNOWN, error=exc.message)
            return self._instance(access, power)

        return list(await asyncio.gather(*(one(h) for h in hosts)))

    async def terminate(self, instance_id: str) -> None:
        """Power the host off (a hard off: whatever runs on it dies; drain first), then
        give it back to the directory, which flags it for service. Idempotent: a host
        already off is not touched, a host missing from the inventory succeeds.

        Raises:
            DriverError: the BMC failed; the host is not released then.
        """
        access = await self._directory.host(instance_id)
        if access is None:
            return
        await self._power_off(access)
        await self._directory.release(instance_id)
        self._terminated.add(instance_id)

    # ------------------------------------------------------------ SupportsPower

    async def power_state(self, instance_id: str) -> PowerState:
        """ON or OFF as the BMC reports it (``chassis power status``).

        Raises:
            DriverError: unknown host, or the BMC failed.
        """
        return await self._power_state(await self._access(instance_id))

    async def power_on(self, instance_id: str) -> None:
        """Power the host on (``chassis power on``); a host already on is not touched.

        Raises:
            DriverError: unknown host, or the BMC failed.
        """
        await self._power_on(await self._access(instance_id))

    async def power_off(self, instance_id: str) -> None:
        """Hard power off (``chassis power off``), not an OS shutdown: running jobs die
        and unflushed writes to local disks are lost; drain first. A host already off is
        not touched.

        Raises:
            DriverError: unknown host, or the BMC failed.
        """
        await self._power_off(await self._access(instance_id))

    async def power_cycle(self, instance_id: str) -> None:
        """Hard power cycle (``chassis power cycle``): power off, a pause the BMC
        chooses (about 1 s or more), power on. Kills every job on the host, and the OS
        gets no chance to flush its disks; drain first. A host that is off is powered on
        instead, since most BMCs refuse a cycle while off.

        Raises:
            DriverError: unknown host, or the BMC failed.
        """
        access = await self._access(instance_id)
        async with self._locks[access.host_id]:
            if await self._read_power(access) is PowerState.OFF:
                await self._client.run(access, "chassis", "power", "on")
                return
            try:
                await self._client.run(access, "chassis", "power", "cycle")
            except IpmiError as exc:
                # It went off between the two calls: the BMC refuses a cycle then.
                if exc.failure is not Failure.NOT_IN_STATE:
                    raise
                if await self._read_power(access) is not PowerState.OFF:
                    raise
                await self._client.run(access, "chassis", "power", "on")

    # ----------------------------------------------------------- SupportsReboot

    async def reboot(self, instance_id: str) -> None:
        """Hard reset (``chassis power reset``), as the reset button does. IPMI has no
        OS-graceful restart: the OS is not asked to stop, jobs die at once and unflushed
        writes to local disks are lost; drain first. A host that is off is powered on.
        Returns once the BMC accepted the reset; the control plane proves the reboot by
        the agent's boot id.

        Raises:
            DriverError: unknown host, or the BMC failed.
        """
        await self._reset(await self._access(instance_id))

    # ------------------------------------------------------ SupportsReprovision

    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
        """Ask the BMC for a one-time PXE boot (``chassis bootdev pxe``, in UEFI mode with
        ``efi_boot``), then hard reset (power on if off). The install server that
        answers the PXE boot wipes and reinstalls the disks; gpufleet does not run it.
        Kills every job at once; drain first.

        ``user_data`` cannot travel over IPMI: the install server must hand the new OS
        its configuration (the keys are logged, never the values).

        Raises:
            DriverError: unknown host, or the BMC refused the boot override or the reset.
        """
        if user_data:
            log.info(
                "ipmi: host %s: reprovision cannot pass user data over IPMI (keys %s); the "
                "install server must provide it",
                instance_id,
                sorted(user_data),
            )
        access = await self._access(instance_id)
        options = ["options=efiboot"] if self._config.efi_boot else []
        async with self._locks[access.host_id]:
            await self._client.run(access, "chassis", "bootdev", "pxe", *options)
        await self._reset(access)
        return None  # the same machine, reinstalled from the network

    async def boot_flags(self, instance_id: str) -> BootFlags:
        """The boot override the BMC holds (``chassis bootparam get 5``).

        Raises:
            DriverError: unknown host, the BMC failed, or its answer was unreadable.
        """
        access = await self._access(instance_id)
        async with self._locks[access.host_id]:
            out = await self._client.run(access, "chassis", "bootparam", "get", "5")
        try:
            return parse_boot_flags(out)
        except ValueError as exc:
            raise DriverError(f"ipmi: host {access.hostname}: boot flags: {exc}") from None

    # ------------------------------------------------------- SupportsReachCheck

    async def check_reach(self, instance_id: str) -> ReachCheck:
        """Open a session with the host's BMC and read its power state; one try, no
        retry. Changes nothing; never raises: what failed (credentials refused,
        unreachable, timed out...) is in ``detail``, without the password."""
        try:
            access = await self._directory.host(instance_id)
            if access is None:
                return ReachCheck(
                    instance_id,
                    reachable=False,
                    power=PowerState.UNKNOWN,
                    detail="not in the host inventory",
                )
            async with self._locks[access.host_id]:
                out = await self._client.run(access, "chassis", "power", "status", retries=0)
            power = parse_power_status(out)
        except IpmiError as exc:
            return ReachCheck(
                instance_id,
                reachable=False,
                power=PowerState.UNKNOWN,
                detail=f"{_REACH_FAILURES.get(exc.failure, 'failed')}: {exc.message}",
            )
        except (DriverError, ValueError) as exc:
            return ReachCheck(
                instance_id, reachable=False, power=PowerState.UNKNOWN, detail=f"failed: {exc}"
            )
        return ReachCheck(
            instance_id, reachable=True, power=power, detail=f"BMC answered: power {power}"
        )

    # ------------------------------------------------------------------ helpers

    async def _access(self, host_id: str) -> HostAccess:
        access = await self._directory.host(host_id)
        if access is None:
            raise DriverError(f"ipmi: host {host_id}: not in the host inventory")
        return access

    async def _read_power(self, access: HostAccess) -> PowerState:
        """The power state; the caller holds the host's lock."""
        out = await self._client.run(access, "chassis", "power", "status")
        try:
            return parse_power_status(out)
        except ValueError as exc:
            raise DriverError(f"ipmi: host {access.hostname}: power status: {exc}") from None

    async def _power_state(self, access: HostAccess) -> PowerState:
        async with self._locks[access.host_id]:
            return await self._read_power(access)

    async def _power_on(self, access: HostAccess) -> None:
        async with self._locks[access.host_id]:
            if await self._read_power(access) is not PowerState.ON:
                await self._client.run(access, "chassis", "power", "on")

    async def _power_off(self, access: HostAccess) -> None:
        async with self._locks[access.host_id]:
            if await self._read_power(access) is not PowerState.OFF:
                await self._client.run(access, "chassis", "power", "off")

    async def _reset(self, access: HostAccess) -> None:
        async with self._locks[access.host_id]:
            if await self._read_power(access) is PowerState.OFF:
                await self._client.run(access, "chassis", "power", "on")
            else:
                await self._client.run(access, "chassis", "power", "reset")

    def _instance(
        self,
        access: HostAccess,
        power: PowerState,
        *,
        node_name: str | None = None,
        cluster_id: str | None = None,
        terminated: bool = False,
        error: str | None = None,
    ) -> Instance:
        if terminated:
            state = InstanceState.TERMINATED
        elif power is PowerState.ON:
            state = InstanceState.RUNNING
        else:
            state = InstanceState.PENDING
        created_at = self._first_seen.setdefault(access.host_id, dt.datetime.now(dt.UTC))
        return Instance(
            instance_id=access.host_id,
            client_token=self._tokens.get(access.host_id, ""),
            cluster_id=cluster_id or access.cluster_id or "",
            node_name=node_name or access.hostname,
            state=state,
            created_at=created_at,
            hostname=access.hostname,
            serial=access.serial,
            bmc_address=access.address,
            rack=access.rack,
            leaf_switch=access.leaf_switch,
            pdu=access.pdu,
            error=error,
            booted_at=None,  # a BMC cannot prove a boot: the agent's boot id does
        )


_REACH_FAILURES = {
    Failure.AUTH: "credentials refused",
    Failure.PRIVILEGE: "privilege refused",
    Failure.CIPHER: "cipher suite refused",
    Failure.UNREACHABLE: "unreachable",
    Failure.TIMEOUT: "timed out",
    Failure.BUSY: "no free session",
}
