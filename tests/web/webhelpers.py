"""Helpers for the console tests: a simulated fleet on a fake clock, and a browser-like
client that logs in through the console's token form.

A plain module (not conftest) so test files can import it; pytest's default import mode
puts this folder on sys.path, and the name is unique across the test folders.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.core.clock import FakeClock
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.workers.base import LoopService
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.world import SimWorld
from gpufleet.testing.app import RunningApp, make_settings, running_app

APP_URL = "https://gpufleet.test"  # https: the session cookies are Secure
POLICY: dict[str, Any] = {"verify_settle_s": 2.0, "verify_timeout_s": 300.0,
                          "breaker_max_share": 0.5}  # fmt: skip
NO_EVENT = "00000000-0000-0000-0000-000000000000"


@dataclass
class Fleet:
    app: RunningApp
    clock: FakeClock
    world: SimWorld
    runner: SimFleetRunner
    loops: list[LoopService]
    cluster: dict[str, Any]
    nodes: dict[str, dict[str, Any]]  # by name

    @property
    def cluster_id(self) -> str:
        return str(self.cluster["id"])

    async def tick(self, seconds: float = 1.0) -> None:
        """Move the clock, let the sim agents report, run every loop once."""
        self.clock.advance(seconds)
        await self.runner.run_once()
        await asyncio.sleep(0.06)  # the agents report over the real agent API
        for loop in self.loops:
            await loop.run_once()

    async def until(
        self,
        check: Callable[[], Awaitable[Any]],
        *,
        ticks: int = 60,
        seconds: float = 1.0,
        what: str = "condition",
    ) -> Any:
        for _ in range(ticks):
            found = await check()
            if found:
                return found
            await self.tick(seconds)
        raise AssertionError(f"{what} not met after {ticks} ticks of {seconds} s")

    async def inject(self, name: str, signature: str, **extra: Any) -> None:
        response = await self.app.client.post(
            f"/api/v1/nodes/{self.nodes[name]['id']}/faults",
            json={"signature": signature, **extra},
        )
        assert response.status_code == 202, response.text

    async def proposed_for(self, name: str) -> dict[str, Any] | None:
        response = await self.app.client.get(
            "/api/v1/repairs", params={"node": self.nodes[name]["id"], "status": "proposed"}
        )
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items[0] if items else None

    async def repair(self, repair_id: str) -> dict[str, Any]:
        response = await self.app.client.get(f"/api/v1/repairs/{repair_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


@asynccontextmanager
async def sim_fleet(
    database_url: str, tmp_path: Path, *, size: int = 3, **settings: Any
) -> AsyncIterator[Fleet]:
    """Project ``ml`` with a ready sim cluster ``train`` of ``size`` 8-GPU nodes (no
    acceptance tests, no jobs, no background faults, 20 s reboots of fake time)."""
    clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0))
    values: dict[str, Any] = {
        "report_interval_s": 0.02,
        "sim_busy_share": (0.0, 0.0),
        "sim_reboot_delay_s": (20.0, 20.0),
        "sim_fault_rate_per_gpu_day": 0.0,
        "public_url": APP_URL,
        **settings,
    }
    app_settings = make_settings(data_dir=tmp_path / "data", database_url=database_url, **values)
    async with running_app(app_settings, clock=clock) as app:
        response = await app.client.post("/api/v1/projects", json={"name": "ml"})
        assert response.status_code == 201, response.text
        response = await app.client.put("/api/v1/projects/ml/repair-policy", json=POLICY)
        assert response.status_code == 200, response.text
        response = await app.client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "train", "size": size, "acceptance_tests": False},
        )
        assert response.status_code == 201, response.text
        cluster: dict[str, Any] = response.json()
        loops = build_loops(app.ctx)
        for _ in range(6):
            for loop in loops:
                await loop.run_once()
            status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
            if status["status"] == "ready":
                break
        else:
            raise AssertionError(f"cluster never became ready: {status}")
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app))
        runner = SimFleetRunner(provider.world, http=http, report_interval_s=0.02, seed=1)
        listed = await app.client.get("/api/v1/nodes", params={"cluster": cluster["id"]})
        nodes = {n["name"]: n for n in listed.json()["items"]}
        fleet = Fleet(app=app, clock=clock, world=provider.world, runner=runner, loops=loops,
                      cluster=cluster, nodes=nodes)  # fmt: skip
        try:
            await fleet.tick(0)
            yield fleet
        finally:
            await runner.aclose()
            await http.aclose()


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
