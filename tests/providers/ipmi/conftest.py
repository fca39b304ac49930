"""One ipmi_sim BMC per test module (started once: ~0.3 s), and a silent BMC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ipmi_lab import IpmiSim, SilentBmc, require_tools


@pytest.fixture(scope="module")
def ipmi_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiSim]:
    require_tools()
    sim = IpmiSim(tmp_path_factory.mktemp("ipmi-sim"))
    try:
        sim.start()
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def silent_bmc() -> Iterator[SilentBmc]:
    bmc = SilentBmc()
    yield bmc
    bmc.close()
