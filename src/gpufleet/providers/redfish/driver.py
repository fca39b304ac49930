"""``RedfishProvider``: bare-metal hosts driven through their BMC's Redfish API.

Hosts come from a ``HostDirectory`` (the inventory, credentials decrypted per call). Each
call resolves the host's BMC URL and ComputerSystem, then runs sushy's blocking HTTP calls
in a worker thread, each bounded by ``request_timeout_s`` and retried with backoff when
the failure is transient. Nothing is cached between calls: a BMC is reset, re-addressed or
re-credentialed by people, and a read per call is cheap next to a reboot.

Redfish cannot prove a boot: a BMC says "On" while the OS is still in POST, and a reset's
204 means "accepted". So ``booted_at`` is None and a reboot returns once the BMC took the
reset; the control plane proves the boot by the agent's new boot id.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpufleet.core.clock import Clock, SystemClock
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
from gpufleet.providers.redfish import parsing
from gpufleet.providers.redfish.client import BmcCallError, BmcResponse, RedfishClient
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.parsing import ParseError, SystemView

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

_ACTIONABLE = {
    "auth": "the BMC refused the credentials; check the host's BMC username and password "
    "(and that the account may reset the system)",
    "not_found": "the BMC has no such resource; check the host's system_id",
    "unreachable": "cannot reach the BMC; check its address, port and the management network",
    "timeout": "the BMC did not answer in time",
    "tls": "TLS to the BMC failed; give verify_tls a CA bundle, or turn it off for "
    "self-signed BMC certificates on a trusted network",
}


@dataclass(slots=True)
class _Bmc:
    """One operation's connection to one host's BMC."""

    access: HostAccess
    url: parsing.BmcUrl
    client: RedfishClient


class RedfishProvider:
    """Bare metal over Redfish. Implements Provider, SupportsPower, SupportsReboot,
    SupportsReprovision and SupportsReachCheck; also ``power_on`` and ``power_off``."""

    kind = "redfish"

    def __init__(
        self,
        config: RedfishConfig,
        directory: HostDirectory,
        *,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._config = config
        self._directory = directory
        self._clock = clock or SystemClock()
        self._sleep = sleep

    # --- Provider ---------------------------------------------------------------------

    async def provision(self, request: ProvisionRequest) -> Instance:
        """Take a spare host of the cluster's pool for ``request.client_token`` (the same
        token always gets the same host) and power it on if it is off.

        Returns the host as a RUNNING (On) or PENDING instance. ``user_data`` is not sent
        to the BMC: the host's installer or agent fetches its enrollment from the control
        plane. Touches no running job (a spare runs none).
        Raises ``DriverError`` when the pool is empty or the BMC fails.
        """
        access = await self._directory.claim_spare(request.cluster_id, request.client_token)
        if access is None:
            raise DriverError(
                f"redfish: cluster {request.cluster_id}: no spare host left for node "
                f"{request.node_name}; add hosts to the cluster's pool in the inventory"
            )
        async with self._bmc(access) as bmc:
            system = await self._system(bmc)
            if system.power is not PowerState.ON:
                await self._reset(bmc, system, parsing.on_type(await self._allowed(bmc, system)))
                system = await self._system(bmc)
        return self._instance(access, system.power, client_token=request.client_token)

    async def get_instance(self, instance_id: str) -> Instance | None:
        """The host and its power: RUNNING when On, else PENDING (powering on or off, or
        off). None if the inventory has no such host. Raises ``DriverError`` when the BMC
        cannot be read."""
        access = await self._directory.host(instance_id)
        if access is None:
            return None
        async with self._bmc(access) as bmc:
            system = await self._system(bmc)
        return self._instance(access, system.power)

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        """Every host of the cluster with its power. A host whose BMC fails is listed
        PENDING with the failure in ``error``, so one dead BMC does not hide the rest."""
        hosts = await self._directory.hosts(cluster_id)

        async def one(access: HostAccess) -> Instance:
            try:
                async with self._bmc(access) as bmc:
                    system = await self._system(bmc)
            except DriverError as exc:
                return self._instance(access, PowerState.UNKNOWN, error=exc.message)
            return self._instance(access, system.power)

        return list(await asyncio.gather(*(one(a) for a in hosts)))

    async def terminate(self, instance_id: str) -> None:
        """Force the host off (already off is fine), then release it from the inventory
        (out of service, flagged for hardware service). Idempotent; a host the inventory
        no longer has succeeds. Kills whatever runs on it; the control plane drains first.
        The disks are left as they are. Raises ``DriverError`` (and releases nothing) when
        the BMC cannot power it off."""
        access = await self._directory.host(instance_id)
        if access is None:
            return
        async with self._bmc(access) as bmc:
            system = await self._system(bmc)
            if system.power is not PowerState.OFF:
                await self._reset(bmc, system, "ForceOff")
        await self._directory.release(instance_id)

    # --- SupportsPower and plain power ------------------------------------------------

    async def power_state(self, instance_id: str) -> PowerState:
        """The host's power as its BMC reports it (UNKNOWN while powering on or off)."""
        async with self._bmc(await self._access(instance_id)) as bmc:
            return (await self._system(bmc)).power

    async def power_on(self, instance_id: str) -> None:
        """Power the host on (``On``, or ``ForceOn`` where only that is offered); nothing
        if it is on. Returns once the BMC accepted it."""
        async with self._bmc(await self._access(instance_id)) as bmc:
            system = await self._system(bmc)
            if system.power is not PowerState.ON:
                await self._reset(bmc, system, parsing.on_type(await self._allowed(bmc, system)))

    async def power_off(self, instance_id: str) -> None:
        """Cut the host's power (``ForceOff``); nothing if it is off. Kills every job and
        loses unsynced writes; drain first."""
        async with self._bmc(await self._access(instance_id)) as bmc:
            system = await self._system(bmc)
            if system.power is not PowerState.OFF:
                await self._reset(bmc, system, "ForceOff")

    async def power_cycle(self, instance_id: str) -> None:
        """Hard power cycle: ``PowerCycle`` where the BMC offers it (and implements it),
        else ForceOff, a wait for Off (``power_wait_s``), then On. A host that is off is
        just powered on. Kills every job on the node; drain first."""
        async with self._bmc(await self._access(instance_id)) as bmc:
            system = await self._system(bmc)
            allowed = await self._allowed(bmc, system)
            if system.power is PowerState.OFF:
                await self._reset(bmc, system, parsing.on_type(allowed))
                return
            await self._escalate(
                bmc,
                system,
                ("PowerCycle", "ForceOffOn"),
                action="power cycle",
            )

    # --- SupportsReboot, SupportsReprovision ------------------------------------------

    async def reboot(self, instance_id: str) -> None:
        """Restart the host with the first step of ``reset_order`` the BMC advertises and
        implements (GracefulRestart, ForceRestart, PowerCycle, ForceOff+On); a host that
        is off is powered on. Returns once the BMC accepted the reset (and its task, if it
        made one, ended); the agent's new boot id proves the boot. Kills running jobs;
        drain first. Raises ``DriverError`` naming the host and the types tried."""
        async with self._bmc(await self._access(instance_id)) as bmc:
            await self._restart(bmc, await self._system(bmc), action="reboot")

    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
        """Set a one-time boot override to the network (``reprovision_boot_target``,
        Pxe by default; in UEFI mode where the system reports it), then restart as
        ``reboot`` does. The network installer wipes and reinstalls the local disks and
        fetches ``user_data`` from the control plane (a BMC cannot carry it). Kills
        running jobs and erases local disks; drain first."""
        del user_data  # delivered by the control plane's installer endpoint, not the BMC
        target = self._config.reprovision_boot_target
        async with self._bmc(await self._access(instance_id)) as bmc:
            system = await self._system(bmc)
            if system.boot_targets is not None and target not in system.boot_targets:
                raise self._error(
                    bmc.access,
                    f"the BMC offers no {target} boot override (it offers "
                    f"{', '.join(system.boot_targets) or 'none'}); set "
                    "reprovision_boot_target to one it offers",
                )
            boot: dict[str, Any] = {
                "BootSourceOverrideTarget": target,
                "BootSourceOverrideEnabled": "Once",
            }
            if system.boot_mode == "UEFI":
                boot["BootSourceOverrideMode"] = "UEFI"
            current = await self._get(bmc, system.path, what="system")
            try:
                # If-Match with the system's ETag: some BMCs refuse a PATCH without it.
                await self._request(
                    bmc, "PATCH", system.path, body={"Boot": boot}, etag=current.etag
                )
            except BmcCallError as exc:
                raise self._error(
                    bmc.access, f"BMC {bmc.url}: setting the boot override failed: {exc.detail}"
                ) from None
            log.info("redfish: host %s: boot override %s (once) set", bmc.access.hostname, target)
            await self._restart(bmc, system, action="reprovision")
        return None  # the same machine, reinstalled from the network

    # --- SupportsReachCheck -----------------------------------------------------------

    async def check_reach(self, instance_id: str) -> ReachCheck:
        """Read the BMC's Redfish version, the system's power and its reset types, one
        try per request, changing nothing. Never raises for a host it cannot reach: the
        answer says what failed (credentials refused, unreachable, timed out, no such
        system)."""
        access = await self._directory.host(instance_id)
        if access is None:
            return ReachCheck(
                instance_id, False, PowerState.UNKNOWN, "no such host in the inventory"
            )
        try:
            async with self._bmc(access) as bmc:
                root = await self._request(bmc, "GET", bmc.url.root, tries=1)
                system = await self._system(bmc, tries=1)
                allowed = await self._allowed(bmc, system, tries=1)
        except DriverError as exc:
            return ReachCheck(instance_id, False, PowerState.UNKNOWN, exc.message)
        except BmcCallError as exc:
            where = f"redfish: host {access.hostname} ({access.host_id})"
            return ReachCheck(instance_id, False, PowerState.UNKNOWN, f"{where}: {exc.detail}")
        resets = ", ".join(allowed) if allowed is not None else "not advertised"
        detail = (
            f"Redfish {parsing.redfish_version(root.body)}, power "
            f"{system.power_text or 'unknown'}, resets: {resets}"
        )
        return ReachCheck(instance_id, True, system.power, detail)

    # --- internals --------------------------------------------------------------------

    def _instance(
        self,
        access: HostAccess,
        power: PowerState,
        *,
        client_token: str = "",
        error: str | None = None,
    ) -> Instance:
        # A host has no creation time and the directory no claim token: the time of the
        # read, and the token only when this call knows it (provision).
        return Instance(
            instance_id=access.host_id,
            client_token=client_token,
            cluster_id=access.cluster_id or "",
            node_name=access.hostname,
            state=InstanceState.RUNNING if power is PowerState.ON else InstanceState.PENDING,
            created_at=self._clock.now(),
            hostname=access.hostname,
            serial=access.serial,
            bmc_address=access.address,
            rack=access.rack,
            leaf_switch=access.leaf_switch,
            pdu=access.pdu,
            error=error,
            booted_at=None,
        )

    async def _access(self, host_id: str) -> HostAccess:
        access = await self._directory.host(host_id)
        if access is None:
            raise DriverError(f"redfish: host {host_id}: no such host in the inventory")
        return access

    def _error(self, access: HostAccess, what: str) -> DriverError:
        return DriverError(f"redfish: host {access.hostname} ({access.host_id}): {what}")

    @asynccontextmanager
    async def _bmc(self, access: HostAccess) -> AsyncIterator[_Bmc]:
        try:
            url = parsing.bmc_url(access.address, port=access.port, scheme=self._config.scheme)
        except ParseError as exc:
            raise self._error(access, f"bad BMC address: {exc}") from None
        credential = access.credential
        client = RedfishClient(
            url,
            username=credential.username if credential else None,
            password=credential.secret if credential else None,
            verify=self._config.verify_tls,
            timeout_s=self._config.request_timeout_s,
        )
        try:
            yield _Bmc(access=access, url=url, client=client)
        finally:
            client.close()

    async def _request(
        self,
        bmc: _Bmc,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        etag: str | None = None,
        tries: int | None = None,
    ) -> BmcResponse:
        """One HTTP call in a worker thread, retried with backoff while transient.
        Raises ``BmcCallError`` for a non-transient HTTP answer (the caller decides), and
        ``DriverError`` when the BMC stays unreachable, times out or keeps failing."""
        config = self._config
        attempts = tries if tries is not None else config.retries + 1
        # requests bounds connecting and each read by request_timeout_s; this bounds the
        # whole call, for a BMC that trickles bytes (the thread ends at its next timeout).
        bound = 2 * config.request_timeout_s + 1.0
        delay = config.backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return await asyncio.wait_for(
                    asyncio.to_thread(bmc.client.request, method, path, body=body, etag=etag),
                    bound,
                )
            except TimeoutError:
                failure = BmcCallError("timeout", f"{method} {path}: no answer in time")
            except BmcCallError as exc:
                failure = exc
            if not failure.transient:
                if failure.kind in ("auth", "tls"):
                    raise self._bmc_error(bmc, failure) from None
                raise failure
            if not _may_retry(method, failure):
                raise self._bmc_error(bmc, failure, sent=True) from None
            if attempt == attempts:
                raise self._bmc_error(bmc, failure, attempts=attempts) from None
            log.warning(
                "redfish: host %s: %s (try %d of %d), again in %.1f s",
                bmc.access.hostname,
                failure.detail,
                attempt,
                attempts,
                delay,
            )
            await self._sleep(delay)
            delay = min(delay * 2, config.backoff_max_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def _bmc_error(
        self, bmc: _Bmc, failure: BmcCallError, *, attempts: int = 1, sent: bool = False
    ) -> DriverError:
        advice = _ACTIONABLE.get(failure.kind, "the BMC failed")
        if failure.kind == "timeout":
            advice += f" ({self._config.request_timeout_s:g} s)"
        tried = f" after {attempts} tries" if attempts > 1 else ""
        if sent:
            tried = " (not retried: the BMC may have acted on it; read the power state)"
        return self._error(bmc.access, f"BMC {bmc.url}: {advice}{tried}: {failure.detail}")

    async def _get(
        self, bmc: _Bmc, path: str, *, what: str, tries: int | None = None
    ) -> BmcResponse:
        try:
            return await self._request(bmc, "GET", path, tries=tries)
        except BmcCallError as exc:
            if exc.kind == "not_found":
                advice = "; check the host's system_id" if what.startswith("system") else ""
                raise self._error(
                    bmc.access, f"BMC {bmc.url}: no {what} at {path} ({exc.detail}){advice}"
                ) from None
            raise self._error(
                bmc.access, f"BMC {bmc.url}: reading {what} failed: {exc.detail}"
            ) from None

    async def _system(self, bmc: _Bmc, *, tries: int | None = None) -> SystemView:
        """The host's ComputerSystem: ``system_id``'s, or the BMC's only one."""
        system_id = bmc.access.system_id
        try:
            if system_id:
                path = f"{bmc.url.root}/Systems/{quote(system_id, safe='')}"
            else:
                root = await self._get(bmc, bmc.url.root, what="service root", tries=tries)
                collection = await self._get(
                    bmc, parsing.systems_link(root.body), what="systems", tries=tries
                )
                found = parsing.members(collection.body)
                if len(found) != 1:
                    raise self._error(
                        bmc.access,
                        f"BMC {bmc.url} has {len(found)} systems ({', '.join(found) or 'none'}); "
                        "set the host's system_id to the one to manage",
                    )
                path = found[0]
            doc = await self._get(bmc, path, what=f"system {system_id or path}", tries=tries)
            return parsing.system_view(doc.body, path=path)
        except ParseError as exc:
            raise self._error(bmc.access, f"BMC {bmc.url}: unreadable answer: {exc}") from None

    async def _allowed(
        self, bmc: _Bmc, system: SystemView, *, tries: int | None = None
    ) -> tuple[str, ...] | None:
        """The reset types the BMC advertises: the AllowableValues, else its ActionInfo,
        else None (it does not say)."""
        if system.reset_allowed is not None or system.reset_action_info is None:
            return system.reset_allowed
        info = await self._get(bmc, system.reset_action_info, what="reset ActionInfo", tries=tries)
        return parsing.action_info_reset_types(info.body)

    async def _post_reset(self, bmc: _Bmc, system: SystemView, reset_type: str) -> None:
        """POST one ResetType and follow its task if the BMC made one (202). Raises
        ``BmcCallError`` for a refusal (501, 400...) so the caller can fall back."""
        response = await self._request(
            bmc, "POST", system.reset_target, body={"ResetType": reset_type}
        )
        if response.status == 202:
            await self._follow_task(bmc, response, what=f"ResetType {reset_type}")

    async def _reset(self, bmc: _Bmc, system: SystemView, reset_type: str) -> None:
        """``_post_reset`` with no fallback: any refusal is a ``DriverError``."""
        try:
            await self._post_reset(bmc, system, reset_type)
        except BmcCallError as exc:
            raise self._error(
                bmc.access, f"BMC {bmc.url}: ResetType {reset_type} refused: {exc.detail}"
            ) from None

    async def _follow_task(self, bmc: _Bmc, accepted: BmcResponse, *, what: str) -> None:
        """Poll a task monitor (202 + Location) until the task ends, at most
        ``task_wait_s``. Raises ``DriverError`` when the task fails or outlasts that."""
        config = self._config
        monitor = accepted.location
        if not monitor:
            return  # accepted without a monitor: nothing to follow
        polls = max(1, math.ceil(config.task_wait_s / config.task_poll_s))
        for _ in range(polls):
            await self._sleep(config.task_poll_s)
            try:
                answer = await self._request(bmc, "GET", monitor)
            except BmcCallError as exc:
                if exc.kind == "not_found":
                    return  # monitors vanish once the task ended and was read
                raise self._error(
                    bmc.access, f"{what}: task {monitor} failed: {exc.detail}"
                ) from None
            task = parsing.task_view(answer.body)
            if answer.status == 202 and not task.done:
                continue
            if task.failed:
                said = "; ".join(task.messages) or task.state or task.status
                raise self._error(bmc.access, f"{what}: task {monitor} ended {said}")
            return
        raise self._error(
            bmc.access, f"{what}: task {monitor} still running after {config.task_wait_s:g} s"
        )

    async def _wait_power(self, bmc: _Bmc, want: PowerState, *, what: str) -> None:
        config = self._config
        polls = max(1, math.ceil(config.power_wait_s / config.power_poll_s))
        for _ in range(polls):
            if (await self._system(bmc)).power is want:
                return
            await self._sleep(config.power_poll_s)
        if (await self._system(bmc)).power is not want:
            raise self._error(
                bmc.access, f"{what}: the host is not {want.value} after {config.power_wait_s:g} s"
            )

    async def _restart(self, bmc: _Bmc, system: SystemView, *, action: str) -> None:
        allowed = await self._allowed(bmc, system)
        if system.power is PowerState.OFF:
            await self._reset(bmc, system, parsing.on_type(allowed))
            log.info("redfish: host %s: %s: it was off; powered on", bmc.access.hostname, action)
            return
        await self._escalate(bmc, system, self._config.reset_order, action=action)

    async def _escalate(
        self, bmc: _Bmc, system: SystemView, steps: Sequence[str], *, action: str
    ) -> None:
        """Try each of ``steps`` the BMC advertises, in order; a step it does not
        implement (501, or 400 "not supported") falls through to the next."""
        plan = parsing.reset_plan(steps, await self._allowed(bmc, system))
        if not plan:
            raise self._error(
                bmc.access,
                f"{action}: the BMC advertises none of {', '.join(steps)}; "
                "add one it offers to reset_order",
            )
        refused: list[str] = []
        for step in plan:
            try:
                if step == "ForceOffOn":
                    await self._post_reset(bmc, system, "ForceOff")
                    await self._wait_power(
                        bmc, PowerState.OFF, what=f"{action} by ForceOff then On"
                    )
                    allowed = await self._allowed(bmc, system)
                    await self._post_reset(bmc, system, parsing.on_type(allowed))
                else:
                    await self._post_reset(bmc, system, step)
            except BmcCallError as exc:
                if _not_supported(exc):
                    refused.append(f"{step} ({exc.detail})")
                    log.info(
                        "redfish: host %s: %s: %s not supported, next",
                        bmc.access.hostname,
                        action,
                        step,
                    )
                    continue
                raise self._error(
                    bmc.access, f"{action}: ResetType {step} failed: {exc.detail}"
                ) from None
            log.info("redfish: host %s: %s by %s", bmc.access.hostname, action, step)
            return
        raise self._error(
            bmc.access, f"{action}: every reset type was refused: {'; '.join(refused)}"
        )


def _may_retry(method: str, failure: BmcCallError) -> bool:
    """Whether sending ``method`` again is safe after a transient ``failure``. A read
    always is. A reset or PATCH only when the BMC cannot have acted on the first one: the
    connection was refused, or it answered 503 (not processed). After a timeout, a dropped
    connection or a 500 it may have, and a second reset would restart a booting host."""
    if method == "GET":
        return True
    return failure.status == 503 or failure.refused


def _not_supported(exc: BmcCallError) -> bool:
    if exc.kind == "unsupported":
        return True
    if exc.kind == "bad_request":
        text = exc.detail.lower()
        return (
            "not supported" in text
            or "unsupported" in text
            or "actionparameternotsupported" in text
        )
    return False
