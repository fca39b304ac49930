"""Helpers for the console tests: a browser-like client that logs in through the
console's token form (the fleet is ``gpufleet.testing.fleet``'s, see conftest.py).

A plain module (not conftest) so test files can import it; pytest's default import mode
puts this folder on sys.path, and the name is unique across the test folders.
"""

from __future__ import annotations

import re

import httpx

from gpufleet.testing.app import RunningApp

APP_URL = "https://gpufleet.test"  # https: the session cookies are Secure
NO_EVENT = "00000000-0000-0000-0000-000000000000"


def browser(app: RunningApp) -> httpx.AsyncClient:
    """A cookie-keeping client of the app, as a browser would be (no token header)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app), base_url=APP_URL)


def hidden(html: str, name: str) -> str:
    """The value of the first hidden input called ``name``."""
    match = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert match, f"no hidden field {name!r} in the page"
    return match.group(1)


async def log_in(client: httpx.AsyncClient, token: str, *, next_path: str = "/") -> httpx.Response:
    """Submit the console's token form as a person would; returns the POST's response."""
    page = await client.get("/login", params={"next": next_path})
    assert page.status_code == 200, page.text
    return await client.post(
        "/login",
        data={"login_csrf": hidden(page.text, "login_csrf"), "next": next_path, "token": token},
    )


async def member_token(app: RunningApp, project: str = "ml") -> str:
    """A token of the owner capped to member in ``project`` (what a member holds)."""
    created = await app.client.post(
        "/api/v1/tokens", json={"project": project, "role": "member", "name": "member"}
    )
    assert created.status_code == 201, created.text
    return str(created.json()["token"])
