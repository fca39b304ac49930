"""The real peers of the provider tests — OpenIPMI's ``ipmi_sim``, sushy-tools' emulator
and OpenSSH's sshd — each as one host of the inventory with the credential that opens it,
for tests that reach them through the server (tests/server, tests/cli).

The peers are started by the same helpers the driver suites use (``ipmi/ipmi_lab.py``,
``redfish/redfish_fakes.py``, ``ssh/sshpeer.py``), imported through ``tests/`` (on the
path of every test run: ``tests/conftest.py``'s folder).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from providers.ipmi.ipmi_lab import BMC_PASSWORD, BMC_USER, IpmiSim, require_tools
from providers.redfish.redfish_fakes import (
    PASSWORD,
    SYSTEMS,
    USER,
    closed_port,
    start_emulator,
    stop_emulator,
)
from providers.ssh.sshpeer import start_sshd


@dataclass(frozen=True)
class PeerHost:
    """A running peer as an inventory row (``HostSpec`` fields) and its credential."""

    hostname: str
    bmc_type: str
    address: str
    port: int | None
    credential: str  # the credential's name
    credential_kind: str
    username: str
    secret: str = field(repr=False)
    host_key: str | None = None
    peer: Any = field(default=None, repr=False)  # the running peer, for what it saw

    def row(self, *, cluster: str, hostname: str | None = None, **changes: Any) -> dict[str, Any]:
        row: dict[str, Any] = {
            "hostname": hostname or self.hostname,
            "bmc_type": self.bmc_type,
            "bmc_address": self.address,
            "credential": self.credential,
            "cluster": cluster,
        }
        if self.port is not None:
            row["port"] = self.port
        if self.host_key is not None:
            row["host_key"] = self.host_key
        row.update(changes)
        return row

    def secrets(self) -> list[str]:
        """What must never show: the secret, and (a PEM key) each line of its body."""
        lines = [line for line in self.secret.splitlines() if len(line) > 16]
        return [self.secret, *[line for line in lines if "PRIVATE KEY" not in line]]


@contextmanager
def ipmi_peer(workdir: Path) -> Iterator[PeerHost]:
    require_tools()
    workdir.mkdir(parents=True, exist_ok=True)
    sim = IpmiSim(workdir)
    try:
        sim.start()
        yield PeerHost(
            hostname="ipmi-01",
            bmc_type="ipmi",
            address="127.0.0.1",
            port=sim.port,
            credential="ipmi-bmc",
            credential_kind="bmc_password",
            username=BMC_USER,
            secret=BMC_PASSWORD,
            peer=sim,
        )
    finally:
        sim.stop()


@contextmanager
def redfish_peer(workdir: Path) -> Iterator[PeerHost]:
    """sushy-emulator with one system (so the inventory row needs no ``system_id``)."""
    for module in ("sushy", "sushy_tools", "bcrypt"):
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"the Redfish tests need {module}: pip install -e '.[dev]'", pytrace=False)
    uuid, (name, _power) = next(iter(SYSTEMS.items()))
    systems = [{"uuid": uuid, "name": name, "power_state": "On", "nics": []}]
    emulator = start_emulator(workdir, systems=systems, users={USER: PASSWORD})
    try:
        yield PeerHost(
            hostname="redfish-01",
            bmc_type="redfish",
            address=f"http://{emulator.address}",
            port=None,
            credential="redfish-bmc",
            credential_kind="bmc_password",
            username=USER,
            secret=PASSWORD,
            peer=emulator,
        )
    finally:
        stop_emulator(emulator)


def unreachable_redfish_row(*, cluster: str, credential: str) -> dict[str, Any]:
    """A Redfish BMC nobody answers for (connection refused): a row, not an error."""
    return {
        "hostname": "redfish-down",
        "bmc_type": "redfish",
        "bmc_address": f"http://127.0.0.1:{closed_port()}",
        "credential": credential,
        "cluster": cluster,
    }


@contextmanager
def ssh_peer(workdir: Path) -> Iterator[PeerHost]:
    peer = start_sshd(workdir)
    try:
        yield PeerHost(
            hostname="ssh-01",
            bmc_type="ssh",
            address="127.0.0.1",
            port=peer.port,
            credential="ssh-login",
            credential_kind="ssh_key",
            username=peer.user,
            secret=peer.client_key.private,
            host_key=peer.host_key.public,
            peer=peer,
        )
    finally:
        peer.stop()
