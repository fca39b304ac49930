"""An approved repair acts on the machine through its management path: the ipmi, redfish
and ssh drivers against their real peers (OpenIPMI's ``ipmi_sim``, sushy-tools' Redfish
emulator, a real sshd), with the sim fleet for the scheduler and the agents.

A stand-in bridges the two halves, and is named as one: when the peer saw the restart (a
power reset at the BMC, a reset in the emulator's journal, the reboot command run on the
sshd side), the simulated machine behind it restarts (``SimProvider.reboot``), so its
agent comes back with a new kernel boot id, which is what ends the acting step. A BMC
that refuses the credentials or does not answer ends the repair failed, naming the host
and what to fix, with the node kept out of service and no secret anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.providers.base import Credential, HostAccess, SupportsReboot
from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.driver import IpmiProvider
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.driver import RedfishProvider
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.providers.ssh.config import SshConfig
from gpufleet.providers.ssh.driver import SshProvider
from gpufleet.testing.fleet import SimFleet, sim_fleet
from providers.ipmi.ipmi_lab import BMC_PASSWORD, IpmiSim, MemoryDirectory, free_udp_port
from providers.peers import PeerHost, ipmi_peer, redfish_peer, ssh_peer

CONFIG = IpmiConfig(
    cipher_suite=3, timeout_s=8.0, retries=1, retry_backoff_s=0.1, udp_timeout_s=1, udp_retries=1
)
WRONG_PASSWORD = "not-the-Bmc-pw-41"


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiSim]:
    # Fails loudly when ipmi_sim or ipmitool is missing.
    with ipmi_peer(tmp_path_factory.mktemp("bmc")) as peer:
        yield peer.peer


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerHost]:
    with redfish_peer(tmp_path_factory.mktemp("redfish")) as peer:
        yield peer


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerHost]:
    with ssh_peer(tmp_path_factory.mktemp("sshd")) as peer:
        yield peer


Seen = Callable[[], Awaitable[bool]]


def _bridge(fleet: SimFleet, driver: SupportsReboot, saw_restart: Callable[[], Seen]) -> None:
    """The cluster's machines reboot through ``driver``; when the peer saw the restart,
    the simulated machine behind it restarts (the stand-in)."""
    provider = fleet.app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    machine_restarts = provider.reboot

    async def reboot(instance_id: str) -> None:
        seen = saw_restart()
        await driver.reboot(instance_id)
        if await seen():
            await machine_restarts(instance_id)

    provider.reboot = reboot  # type: ignore[method-assign]


def _directory(fleet: SimFleet, access: Callable[[str], HostAccess]) -> MemoryDirectory:
    directory = MemoryDirectory()
    for name in fleet.nodes:
        directory.add(access(fleet.instance_id(name)))
    return directory


def _through_redfish(fleet: SimFleet, peer: PeerHost) -> Callable[[], list[str]]:
    def access(instance_id: str) -> HostAccess:
        return HostAccess(
            host_id=instance_id,
            hostname=f"{instance_id}.redfish",
            address=peer.address,
            credential=Credential(username=peer.username, secret=peer.secret),
            cluster_id=fleet.cluster_id,
        )

    config = RedfishConfig(
        scheme="http", request_timeout_s=2.0, retries=1, backoff_s=0.01, power_poll_s=0.05
    )
    driver = RedfishProvider(config, _directory(fleet, access))
    emulator = peer.peer

    def resets() -> list[str]:
        # The emulator's journal: "<system uuid> reset <type>" and "<uuid> power <state>".
        lines = emulator.journal.read_text().splitlines() if emulator.journal.exists() else []
        return [line.split(" ", 1)[1] for line in lines if line.split(" ")[1:2] == ["reset"]]

    def saw_restart() -> Seen:
        before = len(resets())

        async def seen() -> bool:
            return len(resets()) > before

        return seen

    _bridge(fleet, driver, saw_restart)
    return resets


def _through_ssh(fleet: SimFleet, peer: PeerHost, log: Path) -> None:
    script = log.with_suffix(".sh")
    script.write_text(f'#!/bin/sh\necho "reboot by $(id -un)" >> {log}\n')
    script.chmod(0o755)

    def access(instance_id: str) -> HostAccess:
        return HostAccess(
            host_id=instance_id,
            hostname=f"{instance_id}.ssh",
            address=peer.address,
            port=peer.port,
            credential=Credential(username=peer.username, secret=peer.secret),
            host_key=peer.host_key,
            cluster_id=fleet.cluster_id,
        )

    config = dataclasses.replace(
        SshConfig(),
        reboot_command=str(script),
        connect_timeout_s=5.0,
        attempts=2,
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.1,
        reboot_delay_s=0.1,
        reboot_wait_s=3.0,
    )
    driver = SshProvider(config, _directory(fleet, access))

    def ran() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    def saw_restart() -> Seen:
        before = ran()

        async def seen() -> bool:
            return ran() > before  # the command ran on the sshd side

        return seen

    _bridge(fleet, driver, saw_restart)


def _through_bmc(
    fleet: SimFleet, bmc: IpmiSim, *, password: str = BMC_PASSWORD, port: int | None = None
) -> None:
    """The cluster's machines reboot through the ipmi driver and the BMC."""

    def access(instance_id: str) -> HostAccess:
        return bmc.access(instance_id, password=password, cluster_id=fleet.cluster_id, port=port)

    def saw_restart() -> Seen:
        mark = bmc.mark()

        async def seen() -> bool:
            return any(t.startswith("reset") for t in bmc.transitions_since(mark))

        return seen

    _bridge(fleet, IpmiProvider(CONFIG, _directory(fleet, access)), saw_restart)


async def _approved_reboot(fleet: SimFleet, node: str) -> str:
    await fleet.inject(node, "xid-79")
    repair = await fleet.until(lambda: fleet.proposed_for(node), what="the proposal")
    assert repair["action"] == "reboot", repair
    approved = await fleet.app.client.post(
        f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "GPU fell off the bus"}
    )
    assert approved.status_code == 200, approved.text
    return str(repair["id"])


async def _ended(fleet: SimFleet, repair_id: str) -> dict[str, Any] | None:
    repair = await fleet.repair(repair_id)
    return repair if repair["status"] in ("succeeded", "failed") else None


async def test_xid_79_is_repaired_by_a_reset_the_bmc_saw(
    database_url: str, tmp_path: Path, bmc: IpmiSim
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        _through_bmc(fleet, bmc)
        before = (await fleet.node("train-000"))["boot_id"]
        mark = bmc.mark()
        repair_id = await _approved_reboot(fleet, "train-000")
        done = await fleet.until(lambda: _ended(fleet, repair_id), ticks=300, what="the repair")
        assert done["status"] == "succeeded", done
        assert "reset 1" in bmc.transitions_since(mark)  # the peer saw the reset
        node = await fleet.node("train-000")
        assert node["state"] == "in_service" and node["health"] == "healthy", node
        assert node["boot_id"] not in (None, before)
        steps = await fleet.events(fleet.cluster_id, "repair.status")
        acted = [e["message"] for e in steps if e["data"].get("to") == "verifying"]
        assert acted and "booted again" in acted[0], acted


@pytest.mark.parametrize("case", ["wrong-password", "no-bmc"])
async def test_a_bmc_that_refuses_or_is_not_there_fails_the_repair_plainly(
    database_url: str, tmp_path: Path, bmc: IpmiSim, case: str
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        if case == "wrong-password":
            _through_bmc(fleet, bmc, password=WRONG_PASSWORD)
        else:
            _through_bmc(fleet, bmc, port=free_udp_port())  # nobody listens there
        mark = bmc.mark()
        repair_id = await _approved_reboot(fleet, "train-000")
        done = await fleet.until(lambda: _ended(fleet, repair_id), ticks=300, what="the repair")
        assert done["status"] == "failed", done
        assert done["detail"].startswith("reboot failed: ipmi: host"), done["detail"]
        expected = "credentials" if case == "wrong-password" else "answer"
        assert expected in done["detail"], done["detail"]
        assert not any(t.startswith("reset") for t in bmc.transitions_since(mark))
        node = await fleet.node("train-000")
        assert node["state"] != "in_service", node  # never back on a failed repair
        other = await fleet.node("train-001")
        assert other["state"] == "in_service"  # nothing else in the cluster stopped
        events = await fleet.get("/api/v1/events", cluster=fleet.cluster_id, limit=500)
        text = f"{done} {events}"
        assert WRONG_PASSWORD not in text and BMC_PASSWORD not in text


@pytest.mark.parametrize("kind", ["redfish", "ssh"])
async def test_xid_79_is_repaired_through_redfish_and_ssh_peers(
    database_url: str,
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        log = tmp_path / "reboots.log"
        resets: Callable[[], list[str]] | None = None
        if kind == "redfish":
            resets = _through_redfish(fleet, request.getfixturevalue("emulator"))
        else:
            _through_ssh(fleet, request.getfixturevalue("sshd"), log)
        before = (await fleet.node("train-000"))["boot_id"]
        repair_id = await _approved_reboot(fleet, "train-000")
        done = await fleet.until(lambda: _ended(fleet, repair_id), ticks=300, what="the repair")
        assert done["status"] == "succeeded", done
        if resets is not None:
            assert resets() and resets()[-1].startswith("reset "), resets()  # the BMC saw it
        else:
            assert log.read_text().splitlines()[-1].startswith("reboot by ")  # ran on the host
        node = await fleet.node("train-000")
        assert node["state"] == "in_service" and node["boot_id"] not in (None, before), node
