"""``SshProvider``: static hosts reached over SSH, with no BMC.

What SSH can do to a machine is what its OS lets a logged-in user do: reboot it and power
it off (through sudo), read its boot id. It cannot power a machine on, power-cycle a hung
one or reinstall it, so this driver implements ``Provider``, ``SupportsReboot`` and
``SupportsReachCheck``, and neither ``SupportsPower`` nor ``SupportsReprovision``: a host
that stops answering needs a person (or a BMC driver). The asyncssh client is imported on
first use, so that importing the driver does not load asyncssh and cryptography.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING

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
from gpufleet.providers.ssh.commands import PROBE_COMMAND, detached_command
from gpufleet.providers.ssh.config import SshConfig
from gpufleet.providers.ssh.errors import SshError, SshFailure
from gpufleet.providers.ssh.parsing import BootProbe, parse_probe

if TYPE_CHECKING:
    from gpufleet.providers.ssh.client import SshClient

log = logging.getLogger(__name__)


class SshProvider:
    """Static hosts over SSH. Implements Provider, SupportsReboot, SupportsReachCheck."""

    kind = "ssh"

    def __init__(self, config: SshConfig, directory: HostDirectory) -> None:
        self._config = config
        self._directory = directory
        self._client_or_none: SshClient | None = None
        # The inventory records no creation time for a static host: the first time this
        # process saw it stands in for ``Instance.created_at``.
        self._first_seen: dict[str, dt.datetime] = {}

    def __repr__(self) -> str:
        return f"SshProvider(hosts from {type(self._directory).__name__})"

    @property
    def _client(self) -> SshClient:
        if self._client_or_none is None:
            from gpufleet.providers.ssh.client import SshClient  # asyncssh loads here

            self._client_or_none = SshClient(self._config)
        return self._client_or_none

    async def _access_or_error(self, host_id: str, *, doing: str) -> HostAccess:
        access = await self._directory.host(host_id)
        if access is None:
            raise DriverError(f"ssh: host {host_id}: {doing}: no such host in the inventory")
        return access

    # --- SupportsReachCheck ---------------------------------------------------------

    async def check_reach(self, instance_id: str) -> ReachCheck:
        """Log in and read the boot id and uptime. Changes nothing, never raises.

        Returns ``power=ON`` with the boot id when the host answered; ``reachable=False``
        with ``power=UNKNOWN`` (SSH cannot see power) and what failed (auth refused,
        host key changed, unreachable, timed out) otherwise. Touches no job.
        """
        access = await self._directory.host(instance_id)
        if access is None:
            return ReachCheck(
                instance_id=instance_id,
                reachable=False,
                power=PowerState.UNKNOWN,
                detail=f"ssh: host {instance_id}: no such host in the inventory",
            )
        return await self._reach(access)

    async def _reach(self, access: HostAccess) -> ReachCheck:
        try:
            probe = await self._probe(access)
        except DriverError as exc:
            reason = exc.reason.value if isinstance(exc, SshError) else "unexpected answer"
            return ReachCheck(
                instance_id=access.host_id,
                reachable=False,
                power=PowerState.UNKNOWN,
                detail=f"{reason}: {exc.message}",
            )
        return ReachCheck(
            instance_id=access.host_id,
            reachable=True,
            power=PowerState.ON,
            detail=f"boot id {probe.boot_id}, up {probe.uptime_s:.0f} s",
        )

    async def boot_id(self, host_id: str) -> str:
        """The host's current boot id (``/proc/sys/kernel/random/boot_id``): it changes at
        every boot, so a changed id is what proves a reboot happened.

        Raises ``DriverError`` naming the host when it cannot be read.
        """
        access = await self._access_or_error(host_id, doing="boot id")
        return (await self._probe(access)).boot_id

    async def _probe(self, access: HostAccess) -> BootProbe:
        result = await self._client.run(access, PROBE_COMMAND)
        if result.exit_status != 0:
            output = (result.stderr.strip() or result.stdout.strip())[:2000] or "(no output)"
            raise SshError(
                f"ssh: host {access.host_id}: `{PROBE_COMMAND}` exited "
                f"{result.exit_status}: {output}",
                reason=SshFailure.COMMAND,
            )
        return parse_probe(result.stdout, host=access.host_id)

    # --- SupportsReboot -------------------------------------------------------------

    async def reboot(self, instance_id: str) -> None:
        """Run ``reboot_command`` on the host, detached, ``reboot_delay_s`` from now.

        Returns once the command is scheduled and did not fail at once; that is no proof
        of a reboot: the caller reads ``boot_id`` before and waits for it to change. The
        host's OS stops every process: running jobs die (drain first); local disks keep
        their data, tmpfs is lost. Never sends the command twice in one call.

        Raises ``DriverError`` naming the host: not reachable (nothing was sent), or the
        command failed at once (e.g. sudo refused), with its stderr.
        """
        access = await self._access_or_error(instance_id, doing="reboot")
        await self._run_detached(access, self._config.reboot_command)

    async def _run_detached(self, access: HostAccess, command: str) -> None:
        wrapper = detached_command(
            command, delay_s=self._config.reboot_delay_s, wait_s=self._config.reboot_wait_s
        )
        outcome = await self._client.run_detached(access, wrapper, shown=command)
        how = (
            "the session dropped (the host going down)"
            if outcome.dropped
            else ("it exited 0" if outcome.finished else "still running when the wrapper returned")
        )
        log.info("ssh: host %s: `%s` scheduled; %s", access.host_id, command, how)

    # --- Provider -------------------------------------------------------------------

    def _instance(
        self,
        access: HostAccess,
        *,
        reach: ReachCheck,
        client_token: str | None = None,
        node_name: str | None = None,
    ) -> Instance:
        created = self._first_seen.setdefault(access.host_id, dt.datetime.now(dt.UTC))
        return Instance(
            instance_id=access.host_id,
            # The inventory does not say which token claimed a host; outside provision
            # the host id stands in.
            client_token=client_token or access.host_id,
            cluster_id=access.cluster_id or "",
            node_name=node_name or access.hostname,
            state=InstanceState.RUNNING if reach.reachable else InstanceState.PENDING,
            created_at=created,
            hostname=access.hostname,
            serial=access.serial,
            rack=access.rack,
            leaf_switch=access.leaf_switch,
            pdu=access.pdu,
            booted_at=None,
        )

    async def provision(self, request: ProvisionRequest) -> Instance:
        """Claim a spare host of the cluster's pool; idempotent by ``client_token``.

        SSH cannot power a host on: a spare must already be running. RUNNING if it
        answers, else PENDING (the reconciler waits for its agent). ``user_data`` is not
        delivered: a static host's agent is installed by its operator. Touches no job.
        Raises ``DriverError`` when the pool has no spare.
        """
        access = await self._directory.claim_spare(request.cluster_id, request.client_token)
        if access is None:
            raise DriverError(
                f"ssh: node {request.node_name}: no spare host left in the pool of cluster "
                f"{request.cluster_id}; add hosts to the inventory"
            )
        reach = await self._reach(access)
        return self._instance(
            access, reach=reach, client_token=request.client_token, node_name=request.node_name
        )

    async def get_instance(self, instance_id: str) -> Instance | None:
        """The host, RUNNING if it answers over SSH, else PENDING; None if not in the
        inventory. ``booted_at`` is None (``boot_id`` tells reboots apart)."""
        access = await self._directory.host(instance_id)
        if access is None:
            return None
        return self._instance(access, reach=await self._reach(access))

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        """Every host of the cluster in the inventory, each checked over SSH
        (``max_parallel`` at a time)."""
        hosts = await self._directory.hosts(cluster_id)
        gate = asyncio.Semaphore(self._config.max_parallel)

        async def one(access: HostAccess) -> Instance:
            async with gate:
                return self._instance(access, reach=await self._reach(access))

        return list(await asyncio.gather(*(one(a) for a in hosts)))

    async def terminate(self, instance_id: str) -> None:
        """Power the host off with ``poweroff_command`` (if set and the host answers),
        then release it from the inventory. Idempotent: a missing host succeeds, an
        unreachable one is only released. Kills whatever runs on it; drain first.

        Raises ``DriverError`` naming the host when the command is refused (nothing is
        released then: fix sudoers, or set ``poweroff_command=None``).
        """
        access = await self._directory.host(instance_id)
        if access is None:
            return
        command = self._config.poweroff_command
        if command is not None:
            try:
                await self._run_detached(access, command)
            except SshError as exc:
                if exc.reason is SshFailure.COMMAND:
                    raise
                log.warning(
                    "ssh: host %s: not powered off, releasing anyway: %s", instance_id, exc.message
                )
        await self._directory.release(instance_id)
