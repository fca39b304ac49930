"""Fixtures for the console tests: a ready sim fleet on each database, and the owner's
browser logged in through the console's token form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from webhelpers import APP_URL, browser, log_in

from gpufleet.testing.fleet import SimFleet, sim_fleet


@pytest.fixture
async def fleet(database_url: str, tmp_path: Path) -> AsyncIterator[SimFleet]:
    """Project ``ml`` with a ready cluster ``train`` of three 8-GPU nodes."""
    async with sim_fleet(database_url, tmp_path, size=3, public_url=APP_URL) as running:
        yield running


@pytest.fixture
async def admin(fleet: SimFleet) -> AsyncIterator[httpx.AsyncClient]:
    """The platform owner's browser, logged in with the owner's token."""
    async with browser(fleet.app) as client:
        response = await log_in(client, fleet.app.owner_token)
        assert response.status_code == 303, response.text
        yield client
