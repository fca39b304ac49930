"""Fixtures for the console tests: a ready sim fleet on each database, and the owner's
browser logged in through the console's token form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from webhelpers import Fleet, browser, log_in, sim_fleet


@pytest.fixture
async def fleet(database_url: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with sim_fleet(database_url, tmp_path) as running:
        yield running


@pytest.fixture
async def admin(fleet: Fleet) -> AsyncIterator[httpx.AsyncClient]:
    """The platform owner's browser, logged in with the owner's token."""
    async with browser(fleet.app) as client:
        response = await log_in(client, fleet.app.owner_token)
        assert response.status_code == 303, response.text
        yield client
