"""The demo's GPUs follow its jobs: once the demo cluster is through acceptance and its
synthetic users' jobs run, nodes with a job report busy GPUs and the others idle ones
(issue 16: the demo showed every GPU at 1-2 % with jobs running on all of them).

The demo as ``gpufleet demo`` sets it up (``demo_settings``, ``prepare_demo``), with the
sim agents stepped on a fake clock instead of running on real time, so the check takes
seconds and a node's report and its jobs are read at the same instant."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import httpx

from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.demo import DEMO_CLUSTER, prepare_demo
from gpufleet.server.main import demo_settings
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.testing.app import running_app
from gpufleet.testing.databases import SqliteTemplate
from gpufleet.testing.fleet import SimFleet, fake_clock


async def test_demo_nodes_running_jobs_report_busy_gpus_and_idle_nodes_idle_ones(
    sqlite_template: SqliteTemplate, tmp_path: Path
) -> None:
    settings = demo_settings(port=8080, data_dir=tmp_path / "demo").model_copy(
        update={
            "database_url": sqlite_template.clone(tmp_path / "db"),
            "run_workers": False,  # the test runs each loop once per tick
            "sim_agents": False,  # ... and steps the sim agents itself
            "sim_fault_rate_per_gpu_day": 0.0,  # no repair takes a node away meanwhile
        }
    )
    clock = fake_clock()
    async with running_app(settings, clock=clock) as app:
        await prepare_demo(app.ctx)
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app)) as http:
            runner = SimFleetRunner(
                provider.world,
                http=http,
                seed=16,
                program_time_scale=settings.sim_program_time_scale,
            )
            fleet = SimFleet(
                app=app,
                clock=clock,
                world=provider.world,
                runner=runner,
                loops=build_loops(app.ctx),
                step_s=settings.report_interval_s,
            )
            try:
                clusters = (await fleet.get("/api/v1/clusters"))["items"]
                demo = next(c["id"] for c in clusters if c["name"] == DEMO_CLUSTER)

                async def in_service_with_jobs() -> dict[str, Any] | None:
                    nodes = await fleet.nodes_of(demo)
                    ready = all(n["state"] == "in_service" for n in nodes.values())
                    return nodes if ready and provider.world.running_jobs(cluster_id=demo) else None

                await fleet.until(in_service_with_jobs, ticks=60, what="demo jobs running")
                for _ in range(3):  # a few reports under load
                    await fleet.tick()
                running = {
                    s.node_name: bool(s.job_ids)
                    for s in provider.world.node_statuses(cluster_id=demo)
                }
                listed = await fleet.get("/api/v1/nodes", cluster=demo, gpus="true", limit=100)
            finally:
                await runner.aclose()
    util = {
        n["name"]: statistics.fmean(g["utilization_pct"] for g in n["gpus"])
        for n in listed["items"]
    }
    busy = {name: u for name, u in util.items() if running[name]}
    idle = {name: u for name, u in util.items() if not running[name]}
    assert busy and idle, running  # the demo keeps 60-80 % of its nodes busy
    # Synthetic jobs use every GPU of their nodes, at 50 % and more by their kind.
    assert min(busy.values()) >= 45.0, busy
    assert max(idle.values()) <= 1.0, idle
    assert statistics.fmean(busy.values()) >= 60.0 + statistics.fmean(idle.values()), util
