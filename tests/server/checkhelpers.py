"""Check runs on the sim (``gpufleet.testing.fleet``), driven one step at a time on a
fake clock, the nodes' agents played by ``CheckFleet.answer()``.

``CheckFleet.answer()`` plays every node's agent on the real agent API: it polls
``GET /agent/commands`` with the node's token, runs each command with the sim's check
tools (``sim/check_programs.py``, whose figures follow the world's injected faults), and
posts the result; the fake clock moves on by what the real tool would have taken.
``step()`` answers, then runs one pass of the check runner.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from apihelpers import node_tokens

from gpufleet.core.clock import FakeClock
from gpufleet.server.services.check_backends.sim_tools import sim_host, toolbox_for
from gpufleet.server.workers.checks.runner import CheckRunner
from gpufleet.sim.world import SimWorld
from gpufleet.testing.app import RunningApp
from gpufleet.testing.fleet import sim_fleet

ENDED = {"passed", "failed", "error", "cancelled"}


@dataclass
class CheckFleet:
    app: RunningApp
    clock: FakeClock
    world: SimWorld
    runner: CheckRunner
    cluster: dict[str, Any]
    nodes: dict[str, dict[str, Any]]  # by name
    seed: int = 1
    answered: int = 0
    boot_id: str = "sim-boot-1"
    _tokens: dict[str, str] = field(default_factory=dict)

    async def tokens(self) -> dict[str, str]:
        if not self._tokens:
            self._tokens = await node_tokens(self.app, self.cluster["id"])
        return self._tokens

    async def answer(self) -> int:
        """Every node's agent takes its commands and answers them; returns how many."""
        tools = toolbox_for(
            self.world, cluster_id=self.cluster["id"], rng=random.Random(self.seed + self.answered)
        )
        done = 0
        longest = 0.0
        async with self.app.anonymous() as agent:
            for name, token in (await self.tokens()).items():
                headers = {"Authorization": f"Bearer {token}"}
                poll = await agent.get(
                    "/api/v1/agent/commands",
                    params={"boot_id": self.boot_id, "max": 32, "wait_s": 0},
                    headers=headers,
                )
                assert poll.status_code == 200, poll.text
                for command in poll.json()["commands"]:
                    host = sim_host(self.world, cluster_id=self.cluster["id"], ref=name)
                    assert host is not None, name
                    ran = tools.run(command["argv"], host=host)
                    now = self.clock.now()
                    longest = max(longest, ran.duration_s)
                    result = {
                        "id": command["id"],
                        "agent_boot_id": self.boot_id,
                        "exit_code": ran.exit_code,
                        "stdout": ran.stdout,
                        "stderr": ran.stderr,
                        "started_at": now.isoformat(),
                        "finished_at": (now + dt.timedelta(seconds=ran.duration_s)).isoformat(),
                    }
                    posted = await agent.post(
                        f"/api/v1/agent/commands/{command['id']}/result",
                        json=result,
                        headers=headers,
                    )
                    assert posted.status_code == 200, posted.text
                    done += 1
        if done:
            self.answered += done
            self.clock.advance(longest)
        return done

    async def step(self) -> None:
        await self.answer()
        await self.runner.run_once()

    async def run(self, body: dict[str, Any], client: httpx.AsyncClient | None = None) -> Any:
        response = await (client or self.app.client).post(
            "/api/v1/checks", json={"cluster": self.cluster["id"], **body}
        )
        return response

    async def get(self, run_id: str) -> dict[str, Any]:
        response = await self.app.client.get(f"/api/v1/checks/{run_id}")
        assert response.status_code == 200, response.text
        run: dict[str, Any] = response.json()
        return run

    async def until_ended(self, run_id: str, *, steps: int = 40) -> dict[str, Any]:
        for _ in range(steps):
            run = await self.get(run_id)
            if run["status"] in ENDED:
                return run
            await self.step()
            self.clock.advance(2.0)  # the runner's interval
        raise AssertionError(f"check run {run_id} did not end: {await self.get(run_id)}")

    async def inject(self, node: str, signature: str, **extra: Any) -> None:
        response = await self.app.client.post(
            f"/api/v1/nodes/{self.nodes[node]['id']}/faults", json={"signature": signature, **extra}
        )
        assert response.status_code == 202, response.text

    async def findings(self, node: str) -> list[dict[str, Any]]:
        response = await self.app.client.get(
            "/api/v1/findings", params={"node": self.nodes[node]["id"], "open": "true"}
        )
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def busy(self, node: str) -> str:
        """Start a job on ``node`` (a sim job lands wherever there is room: fill the
        others first, then free them). Returns its id."""
        cluster_id = self.cluster["id"]
        while True:
            job = self.world.submit_job(
                cluster_id=cluster_id, node_count=1, gpus_per_node=8, duration_s=3600
            )
            self.world.advance()
            ran = [
                j for j in self.world.running_jobs(cluster_id=cluster_id) if j.job_id == job.job_id
            ]
            assert ran, "the sim did not start the job"
            if ran[0].nodes == (node,):
                return job.job_id


@asynccontextmanager
async def check_fleet(
    database_url: str, tmp_path: Path, *, size: int = 2, **settings: object
) -> AsyncIterator[CheckFleet]:
    """Project ``ml`` with a ready sim cluster ``train`` of ``size`` 8-GPU H100 nodes, no
    background faults or jobs, on a fake clock; the check runner driven by hand."""
    async with sim_fleet(database_url, tmp_path, size=size, **settings) as fleet:
        yield CheckFleet(
            app=fleet.app,
            clock=fleet.clock,
            world=fleet.world,
            runner=fleet.loop(CheckRunner),
            cluster=fleet.cluster,
            nodes=fleet.nodes,
        )
