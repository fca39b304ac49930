"""What the browser tests share: Debian's Chromium through Playwright (never a
downloaded browser), a context that can only reach loopback, the screenshot folder,
and the console server under test (``gpufleet demo`` in a child process)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from playwright.async_api import Browser, BrowserContext, Page, Playwright, Route

from gpufleet.testing.processes import ServerProcess

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOOPBACK = {"127.0.0.1", "localhost"}
# Named in README.md ("Console"): a person looks at the console here after a test run.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"


async def launch(playwright: Playwright) -> Browser:
    return await playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )


async def loopback_context(browser: Browser) -> tuple[BrowserContext, list[str]]:
    """A context whose requests to anything but loopback are aborted (and listed)."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    blocked: list[str] = []

    async def guard(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOOPBACK:
            await route.continue_()
        else:
            blocked.append(route.request.url)
            await route.abort()

    await context.route("**/*", guard)
    return context, blocked


async def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@dataclass
class Console:
    """The demo server under test and an API client of it (the owner's token)."""

    url: str
    token: str
    proc: ServerProcess
    cluster_id: str
    nodes: dict[str, str]  # name → id

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=30,
        )

    def node_state(self, name: str) -> str:
        with self.api() as api:
            return str(api.get(f"/api/v1/nodes/{self.nodes[name]}").json()["state"])

    def inject(self, name: str, signature: str, **extra: Any) -> None:
        with self.api() as api:
            response = api.post(
                f"/api/v1/nodes/{self.nodes[name]}/faults", json={"signature": signature, **extra}
            )
        assert response.status_code == 202, response.text

    def member_token(self) -> str:
        with self.api() as api:
            created = api.post(
                "/api/v1/tokens", json={"project": "demo", "role": "member", "name": "member"}
            )
        assert created.status_code == 201, created.text
        return str(created.json()["token"])


def demo_env(*, issuer: str, secret_file: Path) -> dict[str, str]:
    """The demo, fast: quick boots and reboots, no jobs or background faults, fast loops,
    and SSO through the test IdP (its ``fleet-admins`` group is admin of ``demo``)."""
    return {
        "GPUFLEET_DATABASE_URL": "",
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[0.5, 1.0]",
        "GPUFLEET_SIM_REBOOT_DELAY_S": "[1.0, 1.0]",
        "GPUFLEET_SIM_BUSY_SHARE": "[0.0, 0.0]",
        "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
        "GPUFLEET_REPAIR_INTERVAL_S": "0.3",
        "GPUFLEET_REPORT_INTERVAL_S": "0.5",
        "GPUFLEET_CHECK_INTERVAL_S": "0.3",
        # The check tools 1,000× faster than real (the demo's own: 100×): the demo's
        # acceptance, and a repair's re-acceptance, take seconds, not half a minute.
        "GPUFLEET_SIM_PROGRAM_TIME_SCALE": "0.001",
        "GPUFLEET_OIDC_ISSUER": issuer,
        "GPUFLEET_OIDC_CLIENT_ID": "gpufleet",
        "GPUFLEET_OIDC_CLIENT_SECRET_FILE": str(secret_file),
        "GPUFLEET_OIDC_SCOPES": "openid email profile groups",
        "GPUFLEET_OIDC_GROUP_ROLES": json.dumps({"fleet-admins": "demo:admin"}),
        "PYTHONUNBUFFERED": "1",
        "HOME": os.environ.get("HOME", "/tmp"),
    }
