"""An approved repair acts on the machine through its BMC: the ipmi driver against a real
BMC (OpenIPMI's ``ipmi_sim``), with the sim fleet for the scheduler and the agents.

A stand-in bridges the two halves, and is named as one: when the BMC saw the power reset,
the simulated machine behind it restarts (``SimProvider.reboot``), so its agent comes back
with a new kernel boot id, which is what ends the acting step. A BMC that refuses the
credentials or does not answer ends the repair failed, naming the host and what to fix,
with the node kept out of service and no secret anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.driver import IpmiProvider
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.testing.fleet import SimFleet, sim_fleet
from providers.ipmi.ipmi_lab import (
    BMC_PASSWORD,
    IpmiSim,
    MemoryDirectory,
    free_udp_port,
    require_tools,
)

CONFIG = IpmiConfig(
    cipher_suite=3, timeout_s=8.0, retries=1, retry_backoff_s=0.1, udp_timeout_s=1, udp_retries=1
)
WRONG_PASSWORD = "not-the-Bmc-pw-41"


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiSim]:
    require_tools()  # fails loudly when ipmi_sim or ipmitool is missing
    sim = IpmiSim(tmp_path_factory.mktemp("bmc"))
    try:
        sim.start()
        yield sim
    finally:
        sim.stop()


def _through_bmc(
    fleet: SimFleet, bmc: IpmiSim, *, password: str = BMC_PASSWORD, port: int | None = None
) -> None:
    """The cluster's machines reboot through the ipmi driver and the BMC."""
    provider = fleet.app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    directory = MemoryDirectory()
    for name in fleet.nodes:
        instance_id = fleet.instance_id(name)
        directory.add(
            bmc.access(instance_id, password=password, cluster_id=fleet.cluster_id, port=port)
        )
    ipmi = IpmiProvider(CONFIG, directory)
    machine_restarts = provider.reboot

    async def reboot(instance_id: str) -> None:
        mark = bmc.mark()
        await ipmi.reboot(instance_id)
        if any(seen.startswith("reset") for seen in bmc.transitions_since(mark)):
            await machine_restarts(instance_id)  # the stand-in: the machine behind the BMC

    provider.reboot = reboot  # type: ignore[method-assign]


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
