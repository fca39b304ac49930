from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.clock import FakeClock
from gpufleet.sim.world import SimWorld


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world_path(tmp_path: Path) -> Path:
    return tmp_path / "sim-world.json"


@pytest.fixture
def world(world_path: Path, clock: FakeClock) -> SimWorld:
    return SimWorld(world_path, clock=clock, seed=7)
