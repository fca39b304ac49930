"""The fake driver's pending power path: changes applied a second after they are asked
for (the launcher fixes the delay at 1 s; sushy-emulator itself draws 1-11 s, too slow for
the suite). The driver must wait for Off before it powers the host back on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redfish_fakes import (
    PASSWORD,
    USER,
    Emulator,
    InMemoryHostDirectory,
    start_emulator,
    stop_emulator,
)

from gpufleet.providers.base import Credential, HostAccess, PowerState
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.driver import RedfishProvider

UUID = "22222222-0000-0000-0000-000000000001"


@pytest.fixture(scope="module")
def slow_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    systems = [{"uuid": UUID, "name": "slow-01", "power_state": "On", "nics": []}]
    emu = start_emulator(
        tmp_path_factory.mktemp("sushy-slow"),
        systems=systems,
        users={USER: PASSWORD},
        delay_s=1,
    )
    yield emu
    stop_emulator(emu)


async def test_power_cycle_waits_for_off_before_on(slow_emulator: Emulator) -> None:
    config = RedfishConfig(
        scheme="http", request_timeout_s=2.0, power_wait_s=10.0, power_poll_s=0.1
    )
    access = HostAccess(
        host_id="s1",
        hostname="slow-01",
        address=slow_emulator.address,
        system_id=UUID,
        credential=Credential(USER, PASSWORD),
    )
    p = RedfishProvider(config, InMemoryHostDirectory([access]))
    await p.power_cycle("s1")
    # On is pending for up to a second: poll, bounded.
    for _ in range(50):
        if await p.power_state("s1") is PowerState.ON:
            break
        await asyncio.sleep(0.1)
    assert await p.power_state("s1") is PowerState.ON
    assert slow_emulator.events(UUID) == ["reset ForceOff", "power Off", "reset On", "power On"]
