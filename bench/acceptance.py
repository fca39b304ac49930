"""Acceptance: how long a sim cluster takes from creation to ``ready`` with the default
acceptance suite and without it, and how big its report is.

    python bench/acceptance.py [--nodes 16] [--report-nodes 16 256] [--step 15]

SQLite in a temp dir, the real app in this process (lifespan, ``run_workers=False``),
on a fake clock; the simulated agents run through the real agent API over ASGI and run
the sim's check tools, which take what the real tools would (DCGM level 3: 15 min of
fake time). Machines boot in 60 s of fake time. One tick: the clock moves ``--step``
fake seconds, the agents are stepped (each reports, polls, runs and answers its commands,
all awaited: ``SimFleetRunner.step()``), every loop runs once.

1. ``--nodes`` nodes, acceptance tests off: fake and wall seconds from creation to ready.
2. The same with the default suite (dcgm-diag level 3 → nccl per node → ib_write_bw on
   8 HCAs → nccl across the cluster), plus the report's size (canonical JSON, HTML).
3. For each ``--report-nodes`` size: a cluster with the default suite brought up the
   same way; its report's size (JSON and HTML, bytes).
4. For each ``--offline-report-nodes`` size (no server, seconds even for thousands of
   nodes): each check of the default suite planned (``checks/runners.py``), every
   invocation run by the sim's check tools, judged (``checks/aggregate.py``) and the
   report built and rendered by the same code the server uses.

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.checks.aggregate import InvocationOutput, NodeInfo, judge_run
from gpufleet.checks.models import CheckKind
from gpufleet.checks.runners import Launcher, NodeTarget, normalise_params, plan_check
from gpufleet.core.acceptance import canonical_json, content_hash, default_suite
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import AcceptanceStage
from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.db.tables import AcceptanceRunRow, CheckRunRow, ClusterRow, GpuRow, NodeRow
from gpufleet.server.services.acceptance_report import CheckEntry, build_report, render_html
from gpufleet.server.services.check_backends.sim_tools import expectations_from
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.check_programs import SimHost, Toolbox
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
        runner = SimFleetRunner(provider.world, http=http, seed=1)
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
                if out.ticks % 50 == 0:
                    body = (await app.client.get(f"/api/v1/clusters/{cid}")).json()
                    print(
                        f"      tick {out.ticks}: {body['status']}: {body['status_detail']}",
                        f"({time.perf_counter() - start_wall:.0f} s wall)",
                        flush=True,
                    )
                if out.ticks > 2000:
                    raise RuntimeError(f"{name}: not ready after 2000 ticks ({status})")
                clock.advance(step_s)
                await runner.step()  # every agent reports, polls, runs and answers
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
                shown = (await app.client.get(f"/api/v1/acceptance/{run['id']}")).json()
                for node in shown["nodes"]:
                    if node["outcome"] == "fail":
                        out.detail += f"\n      {node['name']}: {'; '.join(node['reasons'])[:400]}"
                for fmt in ("json", "html"):
                    body = await app.client.get(f"/api/v1/acceptance/{run['id']}/report.{fmt}")
                    assert body.status_code == 200, body.text
                    setattr(out, f"report_{fmt}", len(body.content))
        finally:
            await runner.aclose()
    return out


async def amain(args: argparse.Namespace) -> list[BringUp]:
    results: list[BringUp] = []
    plans = ([(args.nodes, False), (args.nodes, True)] if args.nodes > 0 else []) + [
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


def offline_report(size: int) -> tuple[int, int, float]:
    """(JSON bytes, HTML bytes, seconds to build both) of a default-suite report on
    ``size`` healthy sim nodes, without a server."""
    started = time.perf_counter()
    now = dt.datetime.now(dt.UTC)
    names = [f"n{i:04d}" for i in range(size)]
    hosts = {
        n: SimHost(
            name=n,
            hostname=n,
            gpu_model=DEFAULT_GPU_MODEL,
            gpu_count=8,
            serials=tuple(f"{n}-gpu{g}" for g in range(8)),
        )
        for n in names
    }
    tools = Toolbox(expectations_from(), hosts.get, random.Random(1))
    nodes = [
        NodeRow(
            id=f"id-{n}",
            cluster_id="c",
            name=n,
            hostname=n,
            serial=f"SER-{n}",
            provider_instance_id=f"i-{n}",
            rack="r1",
            leaf_switch="leaf1",
        )
        for n in names
    ]
    gpus = {
        node.id: [
            GpuRow(
                id=f"{node.id}-{g}",
                node_id=node.id,
                index=g,
                uuid=f"GPU-{node.name}-{g:02d}",
                serial=f"{node.name}-gpu{g}",
                model=DEFAULT_GPU_MODEL,
            )
            for g in range(8)
        ]
        for node in nodes
    }
    info = [NodeInfo(id=node.id, name=node.name) for node in nodes]
    targets = [NodeTarget(name=n, host=n, gpus=8) for n in names]
    checks: list[tuple[CheckEntry, CheckRunRow | None]] = []
    for i, check in enumerate(default_suite().checks):
        kind = CheckKind(check.kind)
        raw = {**check.check_params(), "fabric": "NDR"}
        params = normalise_params(kind, raw, nodes=size)
        plan = plan_check(kind, nodes=targets, params=params, launcher=Launcher.MPIRUN)
        outputs = {}
        for inv in plan.invocations:
            ran = tools.run(list(inv.argv), host=hosts[inv.node])
            outputs[inv.id] = InvocationOutput(
                id=inv.id, stdout=ran.stdout, stderr=ran.stderr, exit_code=ran.exit_code
            )
        verdict = judge_run(
            plan, outputs, nodes=info, gpu_model=DEFAULT_GPU_MODEL, fabric="NDR", expected_gpus=8
        )
        row = CheckRunRow(
            id=f"check-{i}",
            cluster_id="c",
            kind=kind.value,
            params=params,
            node_ids=[node.id for node in nodes],
            status="passed" if verdict.passed else "failed",
            result=verdict.result,
            skipped=[],
            detail="",
            started_at=now,
            finished_at=now,
        )
        cluster_wide = check.scope.value == "cluster"
        stage = AcceptanceStage.CLUSTER if cluster_wide else AcceptanceStage.NODE
        entry = CheckEntry(row.id, check.kind, check.label, stage, tuple(row.node_ids), 0, i)
        checks.append((entry, row))
    run = AcceptanceRunRow(
        id="run",
        cluster_id="c",
        scope="cluster",
        trigger="provisioning",
        suite=default_suite().model_dump(mode="json"),
        created_by="bench",
        created_at=now,
        started_at=now,
        repair_id=None,
    )
    cluster = ClusterRow(
        id="c",
        project_id="p",
        name="bench",
        scheduler="sim",
        provider="sim",
        gpu_model=DEFAULT_GPU_MODEL,
        gpus_per_node=8,
    )
    outcomes = {node.id: {"outcome": "pass", "reasons": []} for node in nodes}
    report = build_report(
        run=run,
        cluster=cluster,
        nodes=nodes,
        gpus=gpus,
        checks=checks,
        outcomes=outcomes,
        status="passed",
        detail="bench",
    )
    data = canonical_json(report)
    page = render_html(report, sha256=content_hash(report))
    return len(data), len(page.encode()), time.perf_counter() - started


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
        print(f"      {r.detail[:3000]}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--nodes", type=int, default=16, help="cluster size for the timing runs (0: none)"
    )
    p.add_argument(
        "--report-nodes",
        type=int,
        nargs="*",
        default=[256],
        help="more cluster sizes to measure the report of",
    )
    p.add_argument("--step", type=float, default=5.0, help="fake seconds per tick")
    p.add_argument(
        "--offline-report-nodes",
        type=int,
        nargs="*",
        default=[16, 256, 1024],
        help="report sizes built without a server (same code)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"python {sys.version.split()[0]}, SQLite, fake clock, {args.step:g} s per tick")
    for size in args.offline_report_nodes:
        json_b, html_b, took = offline_report(size)
        print(
            f"{size:>5} nodes, default suite, offline: report {json_b:,} B JSON "
            f"({json_b / size:,.0f} B/node), {html_b:,} B HTML, built in {took:.1f} s",
            flush=True,
        )
    asyncio.run(amain(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
