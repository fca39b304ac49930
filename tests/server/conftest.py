"""Fixtures for the API tests: an app on a FakeClock with a short staleness window."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from apihelpers import STALENESS_S

from gpufleet.core.clock import FakeClock, utcnow
from gpufleet.testing.app import RunningApp, make_settings, running_app


@pytest.fixture
def clock() -> FakeClock:
    # Start at the real "now": the sim world and the API share this clock.
    return FakeClock(start=utcnow())


@pytest.fixture
async def clocked_app(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[RunningApp]:
    """The app on a FakeClock with a short staleness window (STALENESS_S)."""
    settings = make_settings(
        data_dir=tmp_path / "data", database_url=database_url, staleness_s=STALENESS_S
    )
    async with running_app(settings, clock=clock) as running:
        yield running
