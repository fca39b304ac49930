"""A simulated fleet on a fake clock, moved one tick at a time: the harness of every test
suite that needs a fleet (repairs, acceptance, checks, the console).

The real app runs in-process (``testing/app.py``) with every loop built as the server
builds them, and the sim's agents talk to it through the real agent API over ASGI. Only
time is fake, and nothing runs by itself: ``tick()`` moves the clock, steps the agents
(``SimFleetRunner.step()``: each sends its report and finding changes and takes, runs
and answers its commands, all awaited) and runs each loop once (``run_once()``). No
real time passes between a cause and the state a test then reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from gpufleet.core.clock import FakeClock
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.workers.base import LoopService
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.programs import ProgramRegistry
from gpufleet.sim.world import SimWorld
from gpufleet.testing.app import RunningApp, make_settings, running_app

# Repairs that move in a test's few ticks: a short settle after the action, and a breaker
# that lets one node of two out.
FAST_POLICY: dict[str, Any] = {
    "verify_settle_s": 2.0,
    "verify_timeout_s": 300.0,
    "breaker_max_share": 0.5,
}
# A quiet sim: no background jobs or faults (the test injects what it needs), machines
# that boot at once and reboot in 20 s of fake time.
QUIET_SIM: dict[str, Any] = {
    "sim_busy_share": (0.0, 0.0),
    "sim_fault_rate_per_gpu_day": 0.0,
    "sim_reboot_delay_s": (20.0, 20.0),
}

L = TypeVar("L", bound=LoopService)


def fake_clock() -> FakeClock:
    """A fake clock at the real now (whole seconds): the sim world and the API share it."""
    return FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0))


@dataclass
class SimFleet:
    app: RunningApp
    clock: FakeClock
    world: SimWorld
    runner: SimFleetRunner
    loops: list[LoopService]
    # Fake seconds a tick moves the clock unless told (checks take what the real tools
    # take, DCGM level 3 is 15 min, so acceptance tests tick in bigger steps).
    step_s: float = 1.0
    cluster: dict[str, Any] = field(default_factory=dict)  # the one sim_fleet() made
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # its nodes, by name

    @property
    def cluster_id(self) -> str:
        assert self.cluster, "sim_app() makes no cluster; sim_fleet() does"
        return str(self.cluster["id"])

    async def tick(self, seconds: float | None = None) -> None:
        """Move the clock, step every sim agent, run every loop once."""
        self.clock.advance(self.step_s if seconds is None else seconds)
        await self.runner.step()
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
        """Tick until ``check()`` returns something true, and return it."""
        for _ in range(ticks):
            found = await check()
            if found:
                return found
            await self.tick(seconds)
        raise AssertionError(
            f"{what} not met after {ticks} ticks (now {self.clock.now()}):\n"
            + await self.describe()
        )

    def loop(self, kind: type[L]) -> L:
        """This fleet's loop of that class (to run it alone)."""
        return next(loop for loop in self.loops if isinstance(loop, kind))

    async def describe(self) -> str:
        """Clusters, nodes, acceptance runs, open repairs and findings: what a failed
        wait prints."""
        out: list[str] = []
        for cluster in (await self.get("/api/v1/clusters"))["items"]:
            cid = cluster["id"]
            out.append(f"cluster {cluster['name']} {cluster['status']}: {cluster['status_detail']}")
            nodes = await self.nodes_of(cid)
            out += [f"  {n['name']} {n['state']}: {n['state_detail']}" for n in nodes.values()]
            runs = (await self.get(f"/api/v1/clusters/{cid}/acceptance"))["items"]
            out += [f"  run {r['id']} {r['status']} {r['stage']}: {r['detail']}" for r in runs]
            repairs = (await self.get("/api/v1/repairs", cluster=cid, open="true"))["items"]
            out += [
                f"  repair {r['id']} {r['action']} {r['status']}: {r['detail']}" for r in repairs
            ]
            findings = (await self.get("/api/v1/findings", cluster=cid, limit=50))["items"]
            out += [
                f"  finding {f['signature_id']} on {f['node_id'][-4:]} first {f['first_seen']} "
                f"last {f['last_seen']} cleared {f['cleared_at']}"
                for f in findings
            ]
        return "\n".join(out)

    async def get(self, path: str, **params: Any) -> Any:
        """GET as the owner; asserts 200 and returns the JSON body."""
        response = await self.app.client.get(path, params=params)
        assert response.status_code == 200, f"GET {path}: {response.text}"
        return response.json()

    def node_id(self, node: str) -> str:
        """A node of ``nodes`` by name, or any node by id."""
        return str(self.nodes[node]["id"]) if node in self.nodes else node

    async def node(self, node: str) -> dict[str, Any]:
        body: dict[str, Any] = await self.get(f"/api/v1/nodes/{self.node_id(node)}")
        return body

    async def nodes_of(self, cluster_id: str) -> dict[str, dict[str, Any]]:
        listed = await self.get("/api/v1/nodes", cluster=cluster_id)
        return {n["name"]: n for n in listed["items"]}

    async def inject(self, node: str, signature: str, **extra: Any) -> None:
        """Inject a fault through the API (``node``: a name of ``nodes``, or an id)."""
        response = await self.app.client.post(
            f"/api/v1/nodes/{self.node_id(node)}/faults", json={"signature": signature, **extra}
        )
        assert response.status_code == 202, response.text

    async def repairs(self, **params: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.get("/api/v1/repairs", **params))["items"]
        return items

    async def repair(self, repair_id: str) -> dict[str, Any]:
        body: dict[str, Any] = await self.get(f"/api/v1/repairs/{repair_id}")
        return body

    async def status_of(self, repair_id: str) -> str:
        return str((await self.repair(repair_id))["status"])

    async def proposed_for(self, node: str) -> dict[str, Any] | None:
        """The node's proposed repair, if the planner made one."""
        for repair in await self.repairs(node=self.node_id(node), status="proposed"):
            return repair
        return None

    async def events(self, cluster_id: str, kind: str) -> list[dict[str, Any]]:
        """The cluster's events of ``kind``, oldest first."""
        listed = await self.get("/api/v1/events", cluster=cluster_id, kind=kind, limit=1000)
        return list(reversed(listed["items"]))

    async def acceptance_runs(self, cluster_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.get(f"/api/v1/clusters/{cluster_id}/acceptance"))[
            "items"
        ]
        return items

    async def status_is(self, cluster_id: str, *wanted: str) -> dict[str, Any] | None:
        """The cluster, if its status is one of ``wanted``."""
        cluster: dict[str, Any] = await self.get(f"/api/v1/clusters/{cluster_id}")
        return cluster if cluster["status"] in wanted else None

    def instance_id(self, name: str) -> str:
        """The sim machine of the node called ``name`` in this fleet's cluster."""
        for sim in self.world.list_instances(cluster_id=self.cluster_id):
            if sim.node_name == name:
                return sim.instance_id
        raise AssertionError(f"no machine for {name}")


@asynccontextmanager
async def sim_app(
    database_url: str,
    tmp_path: Path,
    *,
    policy: dict[str, Any] | None = None,
    step_s: float = 1.0,
    seed: int = 1,
    programs: ProgramRegistry | None = None,
    **settings: Any,
) -> AsyncIterator[SimFleet]:
    """The app on a fake clock with project ``ml`` (repair policy ``FAST_POLICY`` and
    ``policy``), stepped sim agents (running ``programs``, the sim's own by default) and
    every loop; no cluster yet. ``settings`` override the server's (``QUIET_SIM``)."""
    clock = fake_clock()
    config = make_settings(
        data_dir=tmp_path / "data", database_url=database_url, **{**QUIET_SIM, **settings}
    )
    async with running_app(config, clock=clock) as app:
        created = await app.client.post("/api/v1/projects", json={"name": "ml"})
        assert created.status_code == 201, created.text
        response = await app.client.put(
            "/api/v1/projects/ml/repair-policy", json={**FAST_POLICY, **(policy or {})}
        )
        assert response.status_code == 200, response.text
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app)) as http:
            runner = SimFleetRunner(provider.world, http=http, seed=seed, programs=programs)
            fleet = SimFleet(
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


@asynccontextmanager
async def sim_fleet(
    database_url: str,
    tmp_path: Path,
    *,
    size: int = 2,
    **options: Any,
) -> AsyncIterator[SimFleet]:
    """``sim_app(**options)`` with a ready cluster ``train`` of ``size`` 8-GPU nodes
    (acceptance tests off), its agents reporting."""
    async with sim_app(database_url, tmp_path, **options) as fleet:
        created = await fleet.app.client.post(
            "/api/v1/clusters",
            json={
                "project": "ml",
                "name": "train",
                "size": size,
                "gpus_per_node": 8,
                "acceptance_tests": False,
            },
        )
        assert created.status_code == 201, created.text
        fleet.cluster = created.json()
        for _ in range(6):
            for loop in fleet.loops:
                await loop.run_once()
            status = await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}/status")
            if status["status"] == "ready":
                break
        else:
            raise AssertionError(f"cluster never became ready: {status}")
        fleet.nodes = await fleet.nodes_of(fleet.cluster_id)
        await fleet.tick(0)  # the agents say hello
        yield fleet
