"""``MachineRoom``: a stand-in, named as one, for the machines behind real BMCs (or a real
sshd) and for their install, so a bare-metal cluster runs end to end here.

The server's bare-metal driver (ipmi, redfish, ssh) talks to a real peer — OpenIPMI's
``ipmi_sim``, sushy-tools' emulator, a real sshd — exactly as it would to a server's BMC.
What no peer has is a machine behind it. The room wraps the driver's calls and, from what
the peer saw (a ``PeerView``), makes the simulated machine do what the real one would:

- a host powered on for a node (provisioning, a failover's spare): a simulated machine
  named as the host boots, and its "install" enrolls with the cluster's enroll token
  through the real enroll API (``run_once``, a loop of the fleet), then runs the sim
  agent with the node token it got;
- a reset the peer saw: the machine restarts (a new kernel boot id), unless the test
  made it ``dead`` (a host that never comes back);
- a PXE boot plus a reset: the machine is reinstalled (a new disk: it enrolls again);
- a power off: the machine is gone.

``calls`` records when each driver call was entered (``time.perf_counter``), for the
benchmark of approval → first BMC call (bench/repair_path.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx

from gpufleet.client.agent import enroll
from gpufleet.client.errors import ApiError
from gpufleet.core.agent_protocol import EnrollRequest
from gpufleet.providers.base import Instance, ProvisionRequest
from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.driver import IpmiProvider
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.driver import RedfishProvider
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.providers.ssh.config import SshConfig
from gpufleet.providers.ssh.driver import SshProvider
from gpufleet.server.services.host_directory import DbHostDirectory
from gpufleet.sim.models import USER_DATA_TOKEN, USER_DATA_URL, BootPlan, SimInstanceSpec
from gpufleet.testing.fleet import SimFleet

SERVER_URL = "http://gpufleet.test"  # what the room's machines are told the server is
BOOT_AT_ONCE = BootPlan((0.0, 0.0))


class Transitions(Protocol):
    """A BMC that records what it passed on (tests' ``IpmiSim``)."""

    def mark(self) -> int: ...

    def transitions_since(self, mark: int) -> list[str]: ...


@dataclasses.dataclass
class _Machine:
    sim_id: str
    client_token: str
    enrolled: bool = False


class PeerView(Protocol):
    """What a peer saw of one host since a mark: its power transitions and resets."""

    def mark(self) -> Any: ...

    def seen(self, hostname: str, mark: Any) -> list[str]: ...


@dataclasses.dataclass
class IpmiView:
    bmcs: Mapping[str, Transitions]  # one BMC per host: "power 0", "reset 1", "boot pxe"

    def mark(self) -> dict[str, int]:
        return {name: bmc.mark() for name, bmc in self.bmcs.items()}

    def seen(self, hostname: str, mark: dict[str, int]) -> list[str]:
        return self.bmcs[hostname].transitions_since(mark[hostname])


@dataclasses.dataclass
class RedfishView:
    # The emulator's: "<uuid> reset GracefulRestart", "<uuid> power Off", "<uuid> boot Pxe".
    journal: Path
    systems: dict[str, str]  # hostname -> its system's uuid

    def _lines(self) -> list[str]:
        return self.journal.read_text().splitlines() if self.journal.exists() else []

    def mark(self) -> int:
        return len(self._lines())

    def seen(self, hostname: str, mark: int) -> list[str]:
        uuid = self.systems[hostname]
        return [line.split(" ", 1)[1] for line in self._lines()[mark:] if line.startswith(uuid)]


@dataclasses.dataclass
class SshView:
    log: Path  # the reboot command's own log on the sshd side: "reboot by <user>"

    def _lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def mark(self) -> int:
        return len(self._lines())

    def seen(self, hostname: str, mark: int) -> list[str]:
        del hostname  # one sshd stands for every host; the driver's calls come one at a time
        return [
            "power Off" if line.startswith("poweroff") else "reset (reboot command)"
            for line in self._lines()[mark:]
        ]


_POWER_OFF = {"power 0", "power Off", "reset ForceOff"}  # ipmi; Redfish (or asked of it)


def restarted(seen: list[str]) -> bool:
    """The peer saw a reset (ipmi "reset 1", Redfish "reset ForceRestart", the reboot
    command on the sshd side)."""
    return any(t.startswith("reset") for t in seen)


class MachineRoom:
    """The stand-in for the machines behind the peer and their install (module doc)."""

    def __init__(self, fleet: SimFleet, kind: str, view: PeerView, http: httpx.AsyncClient) -> None:
        self.fleet = fleet
        self.view = view
        self.http = http
        self.enroll_token = ""
        self.hostnames: dict[str, str] = {}  # host id -> hostname
        self.machines: dict[str, _Machine] = {}  # hostname -> its machine now
        self.enrollments: list[str] = []  # hostnames, in order
        self.refusals: list[str] = []
        self.calls: list[tuple[str, float]] = []  # (driver call, when it was entered)
        self.dead: set[str] = set()  # hostnames whose machine never comes back from a reset
        sim = fleet.app.ctx.drivers.provider("sim")
        assert isinstance(sim, SimProvider)
        self.driver, self.sim = fleet.app.ctx.drivers.provider(kind), sim
        self._wrap()

    # -- what the peer saw becomes what the machine does ---------------------------------

    def _wrap(self) -> None:
        driver: Any = self.driver
        provision, reboot = driver.provision, driver.reboot
        reprovision, terminate = getattr(driver, "reprovision", None), driver.terminate

        async def on_provision(request: ProvisionRequest) -> Instance:
            self.calls.append(("provision", time.perf_counter()))
            instance: Instance = await provision(request)
            self.hostnames[instance.instance_id] = str(instance.hostname)
            await self._power_on(str(instance.hostname), request)
            return instance

        async def on_reboot(instance_id: str) -> None:
            self.calls.append(("reboot", time.perf_counter()))
            name = self.hostnames[instance_id]
            mark = self.view.mark()
            await reboot(instance_id)
            if restarted(self.view.seen(name, mark)) and name not in self.dead:
                await self.sim.reboot(self.machines[name].sim_id)

        async def on_reprovision(instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
            self.calls.append(("reprovision", time.perf_counter()))
            assert reprovision is not None
            name = self.hostnames[instance_id]
            mark = self.view.mark()
            moved: Instance | None = await reprovision(instance_id, user_data=user_data)
            seen = self.view.seen(name, mark)
            if "boot pxe" in {t.lower() for t in seen} and restarted(seen):
                machine = self.machines[name]
                # A new disk: the install runs again, without the old node token.
                await self.sim.reprovision(machine.sim_id, user_data=self._user_data(None))
                machine.enrolled = False
            return moved

        async def on_terminate(instance_id: str) -> None:
            self.calls.append(("terminate", time.perf_counter()))
            name = self.hostnames.get(instance_id)
            mark = self.view.mark()
            await terminate(instance_id)
            if name is not None and set(self.view.seen(name, mark)) & _POWER_OFF:
                machine = self.machines.pop(name, None)
                if machine is not None:
                    await self.sim.terminate(machine.sim_id)

        driver.provision = on_provision
        driver.reboot = on_reboot
        if reprovision is not None:
            driver.reprovision = on_reprovision
        driver.terminate = on_terminate

    async def _power_on(self, hostname: str, request: ProvisionRequest) -> None:
        if hostname in self.machines:
            return
        spec = SimInstanceSpec(
            client_token=f"room/{hostname}",
            cluster_id=request.cluster_id,
            node_name=hostname,  # the sim machine's hostname: what its agent reports
            gpu_model=request.gpu_model,
            gpu_count=request.gpu_count,
            user_data=self._user_data(None),
        )
        machine = await asyncio.to_thread(self.sim.world.provision, spec, plan=BOOT_AT_ONCE)
        self.machines[hostname] = _Machine(machine.instance_id, spec.client_token)

    def _user_data(self, token: str | None) -> dict[str, str]:
        data = {USER_DATA_URL: SERVER_URL, "gpufleet_scheduler": "sim"}
        if token is not None:
            data[USER_DATA_TOKEN] = token
        return data

    # -- the install: enroll, then run the agent with the node token ---------------------

    async def run_once(self) -> None:
        if not self.enroll_token:
            return  # the install has no token yet
        for hostname, machine in self.machines.items():
            if machine.enrolled:
                continue
            try:
                ack = await enroll(
                    self.http,
                    base_url=SERVER_URL,
                    enroll_token=self.enroll_token,
                    request=EnrollRequest(hostname=hostname),
                )
            except ApiError as exc:
                assert exc.status == 409, exc.message  # not claimed yet: try again
                self.refusals.append(exc.message)
                continue
            current = self.sim.world.get_instance(machine.sim_id)
            assert current is not None
            spec = SimInstanceSpec(
                client_token=machine.client_token,
                cluster_id=current.cluster_id,
                node_name=hostname,
                gpu_model=current.gpu_model,
                gpu_count=len(current.gpus),
                user_data=self._user_data(ack.node_token),
            )
            await asyncio.to_thread(self.sim.world.provision, spec, plan=BOOT_AT_ONCE)
            machine.enrolled = True
            self.enrollments.append(hostname)

    def sim_id(self, hostname: str) -> str:
        return self.machines[hostname].sim_id


def _directory(fleet: SimFleet) -> DbHostDirectory:
    ctx = fleet.app.ctx
    return DbHostDirectory(db=ctx.db, keyring=ctx.keyring, clock=ctx.clock)


def use_quick_ipmi(fleet: SimFleet) -> None:
    """The server's ipmi driver over its own host directory, for ``ipmi_sim``: cipher suite
    3 (it cannot list its suites) and short timeouts, so a BMC that does not answer fails
    in about a second, not the production bound's minute."""
    config = IpmiConfig(
        cipher_suite=3, timeout_s=8.0, retries=1, retry_backoff_s=0.1, udp_timeout_s=1,
        udp_retries=1,
    )  # fmt: skip
    fleet.app.ctx.drivers.providers["ipmi"] = IpmiProvider(config, _directory(fleet))


def use_quick_redfish(fleet: SimFleet) -> None:
    """The server's redfish driver over its own host directory, for the emulator: plain
    HTTP, short timeouts, power polled every 50 ms."""
    config = RedfishConfig(
        scheme="http", request_timeout_s=2.0, retries=1, backoff_s=0.01, power_poll_s=0.05
    )
    fleet.app.ctx.drivers.providers["redfish"] = RedfishProvider(config, _directory(fleet))


def use_logged_ssh_reboot(fleet: SimFleet, log: Path) -> None:
    """The server's ssh driver over its own host directory, with reboot and poweroff
    commands that write their line to ``log`` on the sshd side (a test user can do
    neither)."""
    script = log.with_suffix(".sh")
    script.write_text(f'#!/bin/sh\necho "reboot by $(id -un)" >> {log}\n')
    script.chmod(0o755)
    poweroff = log.with_name(log.stem + "-poweroff.sh")
    poweroff.write_text(f'#!/bin/sh\necho "poweroff by $(id -un)" >> {log}\n')
    poweroff.chmod(0o755)
    config = dataclasses.replace(
        SshConfig(),
        reboot_command=str(script),
        poweroff_command=str(poweroff),
        connect_timeout_s=5.0,
        attempts=2,
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.1,
        reboot_delay_s=0.1,
        reboot_wait_s=3.0,
    )
    fleet.app.ctx.drivers.providers["ssh"] = SshProvider(config, _directory(fleet))
