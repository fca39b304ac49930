"""gpufleet managing the Slurm lab's nodes: an in-process server whose cluster ``lab`` is
the lab's nodes (lab-001...) as sim machines, scheduled by the real Slurm.

Every loop runs for real, on the real clock; the sim agents report through the real
agent API. ``LabFleet.tick()`` runs the agents and each loop once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.workers.base import LoopService
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.world import SimWorld
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.slurm_lab import SlurmLab

LAB_POLICY: dict[str, Any] = {
    "verify_settle_s": 1.0,
    "verify_timeout_s": 120.0,
    "breaker_max_share": 0.5,
}


@dataclass
class LabFleet:
    app: RunningApp
    lab: SlurmLab
    world: SimWorld
    runner: SimFleetRunner
    loops: list[LoopService]
    cluster: dict[str, Any]
    nodes: dict[str, dict[str, Any]]  # by name

    async def tick(self) -> None:
        await self.runner.run_once()
        await asyncio.sleep(0.05)
        for loop in self.loops:
            await loop.run_once()

    async def until(
        self, check: Callable[[], Awaitable[Any]], *, timeout_s: float = 60.0, what: str
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = await check()
            if found:
                return found
            await self.tick()
            await asyncio.sleep(0.2)
        raise AssertionError(
            f"{what}: not within {timeout_s} s; sinfo -R:\n"
            + self.lab.run("sinfo", "-R").stdout
            + "\nrepairs: "
            + "; ".join(f"{r['id']} {r['status']} {r['detail']}" for r in await self.repairs())
            + "\n"
            + self.lab.logs_tail(lines=10)
        )

    async def get(self, path: str, **params: Any) -> Any:
        response = await self.app.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    async def repairs(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (
            await self.get("/api/v1/repairs", cluster=self.cluster["id"], limit=50)
        )["items"]
        return items

    async def findings(self, node: str, **params: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (
            await self.get("/api/v1/findings", node=self.nodes[node]["id"], **params)
        )["items"]
        return items

    def node_token(self, name: str) -> str:
        for sim in self.world.list_instances(cluster_id=self.cluster["id"]):
            if sim.node_name == name:
                return sim.user_data["gpufleet_node_token"]
        raise AssertionError(f"no machine for {name}")

    def instance_id(self, name: str) -> str:
        for sim in self.world.list_instances(cluster_id=self.cluster["id"]):
            if sim.node_name == name:
                return sim.instance_id
        raise AssertionError(f"no machine for {name}")

    def sbatch(self, *args: str) -> str:
        out = self.lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args)
        return out.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        return self.lab.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()

    def reason(self, node: str) -> str:
        return self.lab.run("sinfo", "-h", "-n", node, "-o", "%E").stdout.strip()

    def clean(self) -> None:
        """Cancel every job and resume every node, so the next test finds the lab idle."""
        self.lab.reset()


@asynccontextmanager
async def lab_fleet(
    lab: SlurmLab, database_url: str, tmp_path: Path, **settings: object
) -> AsyncIterator[LabFleet]:
    """Project ``ml`` with the cluster ``lab``: the lab's nodes, ready and in service.
    The lab is reset first too: a node Slurm drained after the last test ended (a job
    whose launch failed as it was cancelled) is not this test's to find."""
    lab.reset()
    config = make_settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        slurm_conf=lab.slurm_conf,
        report_interval_s=0.05,
        sim_busy_share=(0.0, 0.0),
        sim_reboot_delay_s=(1.0, 1.0),
        sim_fault_rate_per_gpu_day=0.0,
        **settings,
    )
    async with running_app(config) as app:
        client = app.client
        assert (await client.post("/api/v1/projects", json={"name": "ml"})).status_code == 201
        policy = await client.put("/api/v1/projects/ml/repair-policy", json=LAB_POLICY)
        assert policy.status_code == 200, policy.text
        created = await client.post(
            "/api/v1/clusters",
            json={
                "project": "ml",
                "name": "lab",
                "scheduler": "slurm",
                "provider": "sim",
                "gpus_per_node": lab.gpus,
                "size": lab.nodes,
                "acceptance_tests": False,
                "node_prefix": "lab-",
                "first_node_index": 1,
            },
        )
        assert created.status_code == 201, created.text
        cluster = created.json()
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app))
        runner = SimFleetRunner(provider.world, http=http, report_interval_s=0.05, seed=1)
        loops = build_loops(app.ctx)
        fleet = LabFleet(app, lab, provider.world, runner, loops, cluster, nodes={})
        try:

            async def ready() -> bool:
                status = await fleet.get(f"/api/v1/clusters/{cluster['id']}/status")
                return bool(status["status"] == "ready")

            await fleet.until(ready, timeout_s=30, what="the lab cluster ready")
            listed = await fleet.get("/api/v1/nodes", cluster=cluster["id"])
            fleet.nodes = {n["name"]: n for n in listed["items"]}
            assert sorted(fleet.nodes) == list(lab.node_names)
            yield fleet
        finally:
            await runner.aclose()
            await http.aclose()
            fleet.clean()
