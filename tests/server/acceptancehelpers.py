"""A simulated fleet coming up with acceptance tests on, driven one tick at a time.

Every loop of the server runs for real (provisioning, acceptance, the check runner,
repairs) and so do the simulated agents, through the real agent API over ASGI: they run
the startup scripts with /bin/sh and the check tools as the sim's programs (registered by
the app's sim wiring), whose figures follow injected faults. Only time is fake.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from apihelpers import create_project

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
    "cooldown_s": 0.0,
}


@dataclass
class Bringup:
    app: RunningApp
    clock: FakeClock
    world: SimWorld
    runner: SimFleetRunner
    loops: list[LoopService]
    # Fake seconds a tick moves the clock: check tools take what the real ones would
    # (DCGM level 3: 15 min), so acceptance tests tick in bigger steps.
    step_s: float = 1.0
    ticks: int = 0
    seen_status: list[str] = field(default_factory=list)

    async def tick(self, seconds: float | None = None) -> None:
        self.ticks += 1
        self.clock.advance(self.step_s if seconds is None else seconds)
        await self.runner.run_once()
        await asyncio.sleep(0.05)  # the agents poll, run commands and report (real time)
        for loop in self.loops:
            await loop.run_once()

    async def until(
        self,
        check: Callable[[], Awaitable[Any]],
        *,
        ticks: int = 120,
        seconds: float | None = None,
        what: str = "condition",
    ) -> Any:
        for _ in range(ticks):
            found = await check()
            if found:
                return found
            await self.tick(seconds)
        raise AssertionError(f"{what} not met after {ticks} ticks; {await self.describe()}")

    async def describe(self) -> str:
        out = []
        for cluster in (await self.app.client.get("/api/v1/clusters")).json()["items"]:
            out.append(f"cluster {cluster['name']} {cluster['status']}: {cluster['status_detail']}")
            nodes = await self.nodes(cluster["id"])
            out += [f"  {n['name']} {n['state']}: {n['state_detail']}" for n in nodes.values()]
            runs = await self.runs(cluster["id"])
            out += [f"  run {r['id']} {r['status']} {r['stage']}: {r['detail']}" for r in runs]
        return "\n".join(out)

    async def cluster(self, cluster_id: str) -> dict[str, Any]:
        response = await self.app.client.get(f"/api/v1/clusters/{cluster_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        if not self.seen_status or self.seen_status[-1] != body["status"]:
            self.seen_status.append(body["status"])
        return body

    async def nodes(self, cluster_id: str) -> dict[str, dict[str, Any]]:
        response = await self.app.client.get("/api/v1/nodes", params={"cluster": cluster_id})
        assert response.status_code == 200, response.text
        return {n["name"]: n for n in response.json()["items"]}

    async def runs(self, cluster_id: str) -> list[dict[str, Any]]:
        response = await self.app.client.get(f"/api/v1/clusters/{cluster_id}/acceptance")
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def events(self, cluster_id: str, kind: str) -> list[dict[str, Any]]:
        response = await self.app.client.get(
            "/api/v1/events", params={"cluster": cluster_id, "kind": kind, "limit": 1000}
        )
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return list(reversed(items))  # oldest first

    async def status_is(self, cluster_id: str, *wanted: str) -> dict[str, Any] | None:
        cluster = await self.cluster(cluster_id)
        return cluster if cluster["status"] in wanted else None

    async def inject(self, node_id: str, signature: str, **extra: Any) -> None:
        response = await self.app.client.post(
            f"/api/v1/nodes/{node_id}/faults", json={"signature": signature, **extra}
        )
        assert response.status_code == 202, response.text


STEP_S = 15.0  # fake seconds a tick: DCGM level 3 takes 15 min as on real nodes
# The default suite, lighter: DCGM level 1 (its memory test still sees bad ECC memory),
# two HCAs. tests/server/test_acceptance.py runs the default suite itself.
QUICK_SUITE = {
    "checks": [
        {"kind": "dcgm-diag", "params": {"level": 1}},
        {"kind": "nccl"},
        {"kind": "ib-write-bw", "params": {"hcas": ["mlx5_0", "mlx5_1"]}},
        {"kind": "nccl", "scope": "cluster"},
    ]
}


@asynccontextmanager
async def bringup(
    database_url: str,
    tmp_path: Path,
    *,
    policy: dict[str, Any] | None = None,
    step_s: float = 1.0,
) -> AsyncIterator[Bringup]:
    """An app on a fake clock with project ``ml``, sim agents and every loop; no cluster
    yet. Machines boot in 5 s of fake time, reboots take 20 s."""
    clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0))
    settings = make_settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        report_interval_s=0.02,
        sim_busy_share=(0.0, 0.0),
        sim_provision_delay_s=(5.0, 5.0),
        sim_reboot_delay_s=(20.0, 20.0),
        sim_fault_rate_per_gpu_day=0.0,
    )
    async with running_app(settings, clock=clock) as app:
        await create_project(app.client, "ml")
        response = await app.client.put(
            "/api/v1/projects/ml/repair-policy", json={**FAST_POLICY, **(policy or {})}
        )
        assert response.status_code == 200, response.text
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app))
        runner = SimFleetRunner(
            provider.world,
            http=http,
            report_interval_s=0.02,
            seed=1,
        )
        fleet = Bringup(
            app=app,
            clock=clock,
            world=provider.world,
            runner=runner,
            loops=build_loops(app.ctx),
            step_s=step_s,
        )
        try:
            yield fleet
        finally:
            await runner.aclose()
            await http.aclose()
