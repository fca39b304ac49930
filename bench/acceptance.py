"""Acceptance: how long a sim cluster takes from creation to ``ready`` with the default
acceptance suite and without it, and how big its report is.

    python bench/acceptance.py [--nodes 16] [--report-nodes 16 256] [--step 15]

SQLite in a temp dir, the real app in this process (lifespan, ``run_workers=False``),
on a fake clock; the simulated agents run through the real agent API over ASGI and run
the sim's check tools, which take what the real tools would (DCGM level 3: 15 min of
fake time). Machines boot in 60 s of fake time. One tick: the clock moves ``--step``
fake seconds, the agents run and report, every loop runs once.

1. ``--nodes`` nodes, acceptance tests off: fake and wall seconds from creation to ready.
2. The same with the default suite (dcgm-diag level 3 → nccl per node → ib_write_bw on
   8 HCAs → nccl across the cluster), plus the report's size (canonical JSON, HTML).
3. For each ``--report-nodes`` size: a cluster with the default suite brought up the
   same way; its report's size (JSON and HTML, bytes).

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.core.clock import FakeClock
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.testing.app import RunningApp, make_settings, running_app


@dataclass
class BringUp:
    nodes: int
    acceptance: bool
    fake_s: float = 0.0
    wall_s: float = 0.0
    ticks: int = 0
    status: str = ""
    report_json: int = 0
    report_html: int = 0
    checks: int = 0
    detail: str = ""


async def bring_up(
    app: RunningApp, clock: FakeClock, *, size: int, acceptance: bool, step_s: float, name: str
) -> BringUp:
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    loops = build_loops(app.ctx)
    out = BringUp(nodes=size, acceptance=acceptance)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app)) as http:
        runner = SimFleetRunner(provider.world, http=http, report_interval_s=0.05, seed=1)
        try:
            created = await app.client.post(
                "/api/v1/clusters",
                json={
                    "project": "bench",
                    "name": name,
                    "size": size,
                    "gpus_per_node": 8,
                    "acceptance_tests": acceptance,
                },
            )
            assert created.status_code == 201, created.text
            cid = created.json()["id"]
            start_fake, start_wall = clock.now(), time.perf_counter()
            while True:
                status = (await app.client.get(f"/api/v1/clusters/{cid}")).json()["status"]
                if status in ("ready", "degraded"):
                    break
                out.ticks += 1
                if out.ticks > 2000:
                    raise RuntimeError(f"{name}: not ready after 2000 ticks ({status})")
                clock.advance(step_s)
                await runner.run_once()
                await asyncio.sleep(0.1 + size / 1000)  # the agents poll, run and report
                for loop in loops:
                    await loop.run_once()
            out.fake_s = (clock.now() - start_fake).total_seconds()
            out.wall_s = time.perf_counter() - start_wall
            out.status = status
            if acceptance:
                runs = (await app.client.get(f"/api/v1/clusters/{cid}/acceptance")).json()
                run: dict[str, Any] = runs["items"][0]
                out.checks = len(run["check_run_ids"])
                out.detail = run["detail"]
                for fmt in ("json", "html"):
                    body = await app.client.get(f"/api/v1/acceptance/{run['id']}/report.{fmt}")
                    assert body.status_code == 200, body.text
                    setattr(out, f"report_{fmt}", len(body.content))
        finally:
            await runner.aclose()
    return out


async def amain(args: argparse.Namespace) -> list[BringUp]:
    results: list[BringUp] = []
    plans = [(args.nodes, False), (args.nodes, True)] + [
        (n, True) for n in args.report_nodes if n != args.nodes
    ]
    for i, (size, acceptance) in enumerate(plans):
        tmp = Path(tempfile.mkdtemp(prefix="gf-bench-acceptance-"))
        try:
            clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0))
            settings = make_settings(
                data_dir=tmp / "data",
                database_url=f"sqlite+aiosqlite:///{tmp / 'bench.db'}",
                report_interval_s=0.05,
                sim_busy_share=(0.0, 0.0),
                sim_provision_delay_s=(60.0, 60.0),
                sim_fault_rate_per_gpu_day=0.0,
            )
            async with running_app(settings, clock=clock) as app:
                await app.client.post("/api/v1/projects", json={"name": "bench"})
                result = await bring_up(
                    app,
                    clock,
                    size=size,
                    acceptance=acceptance,
                    step_s=args.step,
                    name=f"b{i}",
                )
            results.append(result)
            print_one(result)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def print_one(r: BringUp) -> None:
    what = "default suite" if r.acceptance else "opted out    "
    line = (
        f"{r.nodes:>4} nodes, {what}: {r.status} after {r.fake_s:>6.0f} s fake "
        f"({r.fake_s / 60:.1f} min), {r.wall_s:>6.1f} s wall, {r.ticks} ticks"
    )
    if r.acceptance:
        line += (
            f"; {r.checks} check runs; report {r.report_json:,} B JSON "
            f"({r.report_json / r.nodes:,.0f} B/node), {r.report_html:,} B HTML"
        )
    print(line, flush=True)
    if r.status != "ready":
        print(f"      {r.detail[:600]}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=16, help="cluster size for the timing runs")
    p.add_argument(
        "--report-nodes",
        type=int,
        nargs="*",
        default=[256],
        help="more cluster sizes to measure the report of",
    )
    p.add_argument("--step", type=float, default=15.0, help="fake seconds per tick")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"python {sys.version.split()[0]}, SQLite, fake clock, {args.step:g} s per tick")
    asyncio.run(amain(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
