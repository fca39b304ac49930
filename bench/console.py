"""The console's cluster page at fleet scale: server-side render time and page weight of
the Health tab for a 2,048-node × 8-GPU cluster, against baselines in the same run.

    python bench/console.py [--db sqlite|postgres|both] [--nodes 2048] [--renders 30]
                            [--pg-url postgresql://postgres@127.0.0.1:5432/test]

For each database: a fresh store (PostgreSQL: CREATE DATABASE gpufleet_bench_<random>,
dropped at the end; SQLite: a temp dir), the real app in this process (lifespan, ASGI,
``run_workers=False``), one sim cluster of ``--nodes`` 8-GPU nodes provisioned by the
real loops, one agent report per node through the real ingest API (so every GPU has a
row), then a realistic mess written directly: ~2 % of the GPUs unhealthy with an open
finding, ~1 % of the nodes cordoned, a few silent (unknown). The console is logged into
with the owner's token through its own login form, and its grid cache is off (every
render reads the store, as the first viewer of a cluster does).

Measured, ``--renders`` times each, in this process (no network; the time is the
server's: routing, session, store reads, rendering, gzip):

- ``GET /clusters/{id}/health``: the whole Health tab, gzip and plain; bytes of each;
- its parts: the store reads (``load_health_grid``), the grid markup (``render_grid``);
- ``GET /clusters/{id}/live``: a poll with nothing changed, and after one GPU changed;
- baseline 1: the JSON API for the same nodes and GPUs, ``GET /api/v1/nodes?cluster=
  &gpus=true`` (three pages of 1,000: the API's largest page);
- baseline 2: a bare Jinja2 template looping over the same 16,384 cells.

Timings are printed, never asserted; the target is 300 ms for the page at 2,048 × 8.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from jinja2 import Environment
from sqlalchemy import select, update

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    check_loopback,
    machine_lines,
    new_pg_database_name,
    percentile,
    pg_create_database,
    pg_drop_database,
    pg_plain_url,
    pg_server_version,
    pg_url_with_database,
    sigterm_cancels,
    sqlite_versions,
)
from gpufleet.core.ids import new_id
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.db.tables import ClusterRow, FindingRow, GpuRow, NodeRow
from gpufleet.server.services.health_grid import load_health_grid
from gpufleet.server.web.grid import render_grid
from gpufleet.server.web.live import GridCache
from gpufleet.testing.app import RunningApp, make_settings, running_app
from repair import node_specs, report_once

TARGET_MS = 300.0
APP_URL = "https://bench.test"  # the console's cookies are Secure
BARE_TEMPLATE = (
    '{% for n in nodes %}<a class="n" href="/nodes/{{ n.id }}">'
    "{% for c in n.cells %}<i class={{ c }}></i>{% endfor %}</a>{% endfor %}"
)


@dataclass
class Sample:
    ms: list[float] = field(default_factory=list)
    size: int = 0

    def line(self, label: str) -> str:
        s = sorted(self.ms)
        size = f"  {self.size / 1024:8.1f} KiB" if self.size else ""
        return (
            f"  {label:<44} p50 {percentile(s, 50):7.1f} ms  p95 {percentile(s, 95):7.1f} ms"
            f"  max {s[-1]:7.1f} ms{size}"
        )


@dataclass
class DbRun:
    db: str
    version: str = ""
    nodes: int = 0
    gpus: int = 0
    setup_s: float = 0.0
    page_gzip: Sample = field(default_factory=Sample)
    page_plain: Sample = field(default_factory=Sample)
    store: Sample = field(default_factory=Sample)
    markup: Sample = field(default_factory=Sample)
    poll_same: Sample = field(default_factory=Sample)
    poll_changed: Sample = field(default_factory=Sample)
    api_json: Sample = field(default_factory=Sample)
    bare_jinja: Sample = field(default_factory=Sample)
    error: str | None = None


async def build(app: RunningApp, *, size: int, timeout_s: float) -> str:
    """A ready cluster of ``size`` sim nodes (no acceptance tests), each reported once."""
    r = await app.client.post("/api/v1/projects", json={"name": "bench"})
    r.raise_for_status()
    r = await app.client.post(
        "/api/v1/clusters",
        json={"project": "bench", "name": "fleet", "size": size, "acceptance_tests": False},
    )
    r.raise_for_status()
    cluster_id = str(r.json()["id"])
    loops = build_loops(app.ctx)
    deadline = time.monotonic() + timeout_s
    while True:
        for loop in loops[:2]:  # provisioning, health
            await loop.run_once()
        status = (await app.client.get(f"/api/v1/clusters/{cluster_id}/status")).json()
        if status["status"] == "ready":
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster not ready after {timeout_s:.0f} s: {status}")
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    await report_once(app, list(node_specs(provider, cluster_id).values()))
    return cluster_id


async def make_a_mess(app: RunningApp, cluster_id: str, *, seed: int = 7) -> None:
    """~2 % of GPUs unhealthy with a finding, ~1 % of nodes cordoned, a few silent."""
    rng = random.Random(seed)
    now = dt.datetime.now(dt.UTC)
    async with app.ctx.db.transaction() as session:
        nodes = list(await session.scalars(select(NodeRow).where(NodeRow.cluster_id == cluster_id)))
        gpus = list(
            await session.scalars(
                select(GpuRow).join(NodeRow).where(NodeRow.cluster_id == cluster_id)
            )
        )
        for gpu in rng.sample(gpus, k=max(1, len(gpus) // 50)):
            gpu.health = "unhealthy"
            session.add(
                FindingRow(
                    id=new_id(), cluster_id=cluster_id, node_id=gpu.node_id,
                    gpu_uuid=gpu.uuid, gpu_index=gpu.index, signature_id="xid-48",
                    title="Double-bit ECC error", severity="critical", source="kernel-log",
                    evidence="NVRM: Xid (PCI:0000:3b:00): 48, pid=0, DBE (0x1)", count=1,
                    first_seen=now, last_seen=now, cleared_at=None,
                )
            )  # fmt: skip
            await session.execute(
                update(NodeRow).where(NodeRow.id == gpu.node_id).values(health="unhealthy")
            )
        for node in rng.sample(nodes, k=max(1, len(nodes) // 100)):
            node.state = "cordoned"
        for node in rng.sample(nodes, k=max(1, len(nodes) // 400)):
            node.last_report_at = now - dt.timedelta(hours=1)


async def timed(sample: Sample, n: int, call: Callable[[], Awaitable[None]]) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        sample.ms.append((time.perf_counter() - t0) * 1000.0)


async def measure(app: RunningApp, run: DbRun, *, cluster_id: str, renders: int) -> None:
    app.app.state.console_grids = GridCache(ttl_s=0.0)  # every render reads the store
    page_path = f"/clusters/{cluster_id}/health"
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app.app), base_url=APP_URL
    ) as browser:
        form = await browser.get("/login")
        nonce = form.text.split('name="login_csrf" value="')[1].split('"')[0]
        login = await browser.post(
            "/login", data={"login_csrf": nonce, "next": "/", "token": app.owner_token}
        )
        if login.status_code != 303:
            raise RuntimeError(f"console login failed: {login.status_code} {login.text[:200]}")
        first = await browser.get(page_path)  # warm-up: template compile, caches
        if first.status_code != 200:
            raise RuntimeError(f"health tab: HTTP {first.status_code}: {first.text[:300]}")

        async def page_gzip() -> None:
            response = await browser.get(page_path, headers={"accept-encoding": "gzip"})
            run.page_gzip.size = int(response.headers["content-length"])  # as sent

        async def page_plain() -> None:
            response = await browser.get(page_path, headers={"accept-encoding": "identity"})
            run.page_plain.size = len(response.content)

        await timed(run.page_gzip, renders, page_gzip)
        await timed(run.page_plain, renders, page_plain)

        async with app.ctx.db.session() as session:
            cluster = await session.get(ClusterRow, cluster_id)
        assert cluster is not None

        async def store() -> None:
            async with app.ctx.db.session() as session:
                await load_health_grid(
                    session, cluster=cluster, staleness_s=app.ctx.settings.staleness_s,
                    now=app.ctx.clock.now(),
                )  # fmt: skip

        await timed(run.store, renders, store)
        async with app.ctx.db.session() as session:
            grid = await load_health_grid(
                session, cluster=cluster, staleness_s=app.ctx.settings.staleness_s,
                now=app.ctx.clock.now(),
            )  # fmt: skip
        run.nodes, run.gpus = len(grid.nodes), sum(len(n.cells) for n in grid.nodes)

        async def markup() -> None:
            run.markup.size = len(str(render_grid(grid, base=f"/clusters/{cluster_id}")))

        await timed(run.markup, renders, markup)

        etag = first.text.split('data-etag="')[1].split('"')[0]

        async def poll_same() -> None:
            r = await browser.get(f"/clusters/{cluster_id}/live", params={"grid": etag})
            run.poll_same.size = len(r.content)

        await timed(run.poll_same, renders, poll_same)
        gpu_ids = []
        async with app.ctx.db.session() as session:
            gpu_ids = list(
                await session.scalars(
                    select(GpuRow.id).join(NodeRow).where(NodeRow.cluster_id == cluster_id)
                )
            )

        async def poll_changed() -> None:
            # One GPU changes between the page's version and this poll.
            async with app.ctx.db.transaction() as session:
                await session.execute(
                    update(GpuRow)
                    .where(GpuRow.id == random.choice(gpu_ids))
                    .values(health=random.choice(["healthy", "degraded"]))
                )
            latest = await browser.get(f"/clusters/{cluster_id}/live", params={"grid": etag})
            run.poll_changed.size = len(latest.content)

        await timed(run.poll_changed, renders, poll_changed)

        api = app.client

        async def api_json() -> None:
            size, cursor = 0, None
            while True:
                params: dict[str, str | int] = {"cluster": cluster_id, "gpus": "true",
                                                "limit": 1000}  # fmt: skip
                if cursor:
                    params["cursor"] = cursor
                r = await api.get("/api/v1/nodes", params=params)
                size += len(r.content)
                cursor = r.json()["next_cursor"]
                if not cursor:
                    break
            run.api_json.size = size

        await timed(run.api_json, renders, api_json)
        template = Environment(autoescape=True).from_string(BARE_TEMPLATE)

        async def bare() -> None:
            run.bare_jinja.size = len(template.render(nodes=grid.nodes))

        await timed(run.bare_jinja, renders, bare)


async def bench_one(db_kind: str, args: argparse.Namespace) -> DbRun:
    run = DbRun(db=db_kind)
    tmp = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-console-{db_kind}-"))
    pg_name: str | None = None
    try:
        if db_kind == "postgres":
            pg_name = new_pg_database_name()
            await pg_create_database(args.pg_url, pg_name)
            url = pg_url_with_database(args.pg_url, pg_name)
            run.version = await pg_server_version(url)
            url = url.replace("postgresql://", "postgresql+asyncpg://", 1)
        else:
            url = f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
            run.version = sqlite_versions()
        settings = make_settings(
            data_dir=tmp / "data",
            database_url=url,
            replica_id=f"bench-console-{db_kind}",
            public_url=APP_URL,
            sim_busy_share=(0.0, 0.0),
            sim_fault_rate_per_gpu_day=0.0,
            sim_provision_delay_s=(0.0, 0.0),
        )
        async with running_app(settings) as app:
            t0 = time.perf_counter()
            cluster_id = await build(app, size=args.nodes, timeout_s=args.provision_timeout)
            await make_a_mess(app, cluster_id)
            run.setup_s = time.perf_counter() - t0
            print(f"[{db_kind}] {args.nodes} nodes ready and reported in {run.setup_s:.0f} s",
                  flush=True)  # fmt: skip
            await measure(app, run, cluster_id=cluster_id, renders=args.renders)
    except Exception as exc:  # noqa: BLE001 - reported per database; the other one still runs
        run.error = f"{type(exc).__name__}: {exc}"
        print(f"[{db_kind}] FAILED: {run.error}", file=sys.stderr, flush=True)
    finally:
        if pg_name is not None:
            try:
                await pg_drop_database(args.pg_url, pg_name)
            except Exception as exc:  # noqa: BLE001 - say so; the run itself is over
                print(f"[{db_kind}] could not drop database {pg_name}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    return run


def print_run(run: DbRun, renders: int) -> None:
    print(f"== {run.db}: {run.version or '?'} ==")
    if run.error:
        print(f"FAILED: {run.error}\n")
        return
    print(f"cluster: {run.nodes} nodes × GPUs = {run.gpus} cells; set-up {run.setup_s:.0f} s; "
          f"{renders} renders each")  # fmt: skip
    page = sorted(run.page_gzip.ms)
    verdict = "meets" if percentile(page, 95) <= TARGET_MS else "MISSES"
    print(f"Health tab (the cluster page), server-side, p95 {verdict} the {TARGET_MS:.0f} ms "
          "target:")  # fmt: skip
    print(run.page_gzip.line("GET /clusters/{id}/health, gzip"))
    print(run.page_plain.line("GET /clusters/{id}/health, plain"))
    print(run.store.line("  of which: store reads (load_health_grid)"))
    print(run.markup.line("  of which: grid markup (render_grid)"))
    print(run.poll_same.line("GET /clusters/{id}/live, nothing changed"))
    print(run.poll_changed.line("GET /clusters/{id}/live, one GPU changed"))
    print("baselines, same run, same nodes:")
    print(run.api_json.line("GET /api/v1/nodes?gpus=true (JSON, 3 pages)"))
    print(run.bare_jinja.line("bare Jinja2 loop over the same cells"))
    ratio = run.page_plain.size / max(run.page_gzip.size, 1)
    print(f"page weight: {run.page_plain.size / 1024:.1f} KiB HTML, {run.page_gzip.size / 1024:.1f}"
          f" KiB gzip ({ratio:.1f}× smaller); the JSON API for the same nodes "
          f"{run.api_json.size / 1024:.1f} KiB")  # fmt: skip
    print()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--nodes", type=int, default=2048, help="nodes of 8 GPUs (default 2048)")
    p.add_argument("--renders", type=int, default=30, help="timed requests per row (default 30)")
    p.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="admin URL; the bench creates and drops its own database next to it",
    )
    p.add_argument("--provision-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.renders < 1:
        p.error("--nodes and --renders must be positive")
    if args.db in ("postgres", "both"):
        check_loopback(pg_plain_url(args.pg_url))
    return args


async def amain(args: argparse.Namespace) -> list[DbRun]:
    task = asyncio.current_task()
    if task is not None:
        sigterm_cancels(task)
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    return [await bench_one(db, args) for db in dbs]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = asyncio.run(amain(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; scratch databases dropped", file=sys.stderr)
        return 130
    print()
    for line in machine_lines():
        print(line)
    print()
    for run in runs:
        print_run(run, args.renders)
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
