"""A simulated fleet on a fake clock, driven one tick at a time, for repair scenarios.

Every loop of the server (provisioning, health, repair planner, repair executor) and the
simulated agents run for real; only time is fake: a tick moves the clock, lets the sim
agents report through the real agent API, and runs each loop once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from apihelpers import create_project, ready_cluster

from gpufleet.core.clock import FakeClock
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.workers.base import LoopService
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.world import SimWorld
from gpufleet.testing.app import RunningApp, make_settings, running_app

FAST_POLICY: dict[str, Any] = {
    "verify_settle_s": 2.0,
    "verify_timeout_s": 300.0,
    "breaker_max_share": 0.5,
}


@dataclass
class Fleet:
    app: RunningApp
    clock: FakeClock
    world: SimWorld
    runner: SimFleetRunner
    loops: list[LoopService]
    cluster: dict[str, Any]
    nodes: dict[str, dict[str, Any]]  # by name

    async def tick(self, seconds: float = 1.0) -> None:
        self.clock.advance(seconds)
        await self.runner.run_once()
        await asyncio.sleep(0.06)  # the agents report (real time; reports every 20 ms)
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
        findings = (
            await self.app.client.get(
                "/api/v1/findings", params={"cluster": self.cluster["id"], "limit": 50}
            )
        ).json()["items"]
        raise AssertionError(
            f"{what} not met after {ticks} ticks of {seconds} s (now {self.clock.now()}); "
            "repairs now: "
            + "; ".join(
                f"{r['id']} {r['action']} {r['status']}: {r['detail']}"
                for r in await self.repairs(open="true")
            )
            + "; findings: "
            + "; ".join(
                f"{f['signature_id']} on {f['node_id'][-4:]} first {f['first_seen']} "
                f"last {f['last_seen']} cleared {f['cleared_at']}"
                for f in findings
            )
        )

    async def repairs(self, **params: Any) -> list[dict[str, Any]]:
        response = await self.app.client.get("/api/v1/repairs", params=params)
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def repair(self, repair_id: str) -> dict[str, Any]:
        response = await self.app.client.get(f"/api/v1/repairs/{repair_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def node(self, name: str) -> dict[str, Any]:
        response = await self.app.client.get(f"/api/v1/nodes/{self.nodes[name]['id']}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def inject(self, name: str, signature: str, **extra: Any) -> None:
        node = await self.node(name)
        response = await self.app.client.post(
            f"/api/v1/nodes/{node['id']}/faults", json={"signature": signature, **extra}
        )
        assert response.status_code == 202, response.text

    async def proposed_for(self, name: str) -> dict[str, Any] | None:
        for repair in await self.repairs(node=self.nodes[name]["id"], status="proposed"):
            return repair
        return None

    async def status_of(self, repair_id: str) -> str:
        return str((await self.repair(repair_id))["status"])

    def instance_id(self, name: str) -> str:
        for sim in self.world.list_instances(cluster_id=self.cluster["id"]):
            if sim.node_name == name:
                return sim.instance_id
        raise AssertionError(f"no machine for {name}")


@asynccontextmanager
async def sim_fleet(
    database_url: str,
    tmp_path: Path,
    *,
    size: int = 4,
    policy: dict[str, Any] | None = None,
    racks: bool = False,
) -> AsyncIterator[Fleet]:
    """A ready cluster ``train`` of ``size`` sim nodes in project ``ml``, no background
    jobs or faults, reboots taking 20 s of fake time."""
    clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0))
    settings = make_settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        report_interval_s=0.02,
        sim_busy_share=(0.0, 0.0),
        sim_reboot_delay_s=(20.0, 20.0),
        sim_fault_rate_per_gpu_day=0.0,
    )
    async with running_app(settings, clock=clock) as app:
        await create_project(app.client, "ml")
        response = await app.client.put(
            "/api/v1/projects/ml/repair-policy", json={**FAST_POLICY, **(policy or {})}
        )
        assert response.status_code == 200, response.text
        cluster = await ready_cluster(app, size=size)
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app))
        runner = SimFleetRunner(provider.world, http=http, report_interval_s=0.02, seed=1)
        nodes_response = await app.client.get("/api/v1/nodes", params={"cluster": cluster["id"]})
        nodes = {n["name"]: n for n in nodes_response.json()["items"]}
        fleet = Fleet(
            app=app,
            clock=clock,
            world=provider.world,
            runner=runner,
            loops=build_loops(app.ctx),
            cluster=cluster,
            nodes=nodes,
        )
        try:
            await fleet.tick(0)
            yield fleet
        finally:
            await runner.aclose()
            await http.aclose()


async def member_client(app: RunningApp, project: str = "ml") -> httpx.AsyncClient:
    created = await app.client.post(
        "/api/v1/tokens", json={"project": project, "role": "member", "name": "member"}
    )
    assert created.status_code == 201, created.text
    return app.with_token(created.json()["token"])
