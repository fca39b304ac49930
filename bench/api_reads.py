"""API reads under load: 20 clients listing clusters and a cluster's nodes.

    python bench/api_reads.py [--db postgres|sqlite|both] [--processes 1,2]
                              [--clients 20] [--duration 10] [--nodes 16]

Per database (a scratch PostgreSQL database, or SQLite in a temp dir) and per number of
server processes: starts the real server (``run_server``: the sim provider with its sim
agents reporting, as in the demo, and the background loops) and, for more than one
process, more replicas of it on the same database serving the API only
(``GPUFLEET_RUN_WORKERS=false``: one process runs the loops, the others answer). One
project, one ``--nodes``-node cluster (16: the demo's). Then ``--clients`` concurrent
keep-alive connections, spread evenly over the processes, each asking in turn
``GET /api/v1/clusters`` and ``GET /api/v1/nodes?cluster=<id>`` with the owner's token,
for ``--warmup`` then ``--duration`` seconds; every answer must be a 200 with the cluster
(or its ``--nodes`` nodes) in it.

Baseline, same run, same database, same rows, same number of processes on the same
uvicorn (uvloop, httptools): a minimal ASGI handler (no framework) that looks the token
up by its hash and runs the same query — the clusters of the token's projects, or the
cluster's nodes not removed, in id order, the page size plus one — and answers the rows as
JSON. The gap between the two is the server's own cost per request: routing, dependency
resolution, the caller's memberships, validation, the response model.

Nothing is asserted; it prints requests/s and latency (client side, send → whole answer).
The target (issue 19): ≥ 500 requests/s with p99 ≤ 100 ms at 20 clients on PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from _common import (
    CpuSnapshot,
    CpuUse,
    ServerProcess,
    free_port,
    machine_lines,
    new_pg_database_name,
    percentile,
    pg_create_database,
    pg_drop_database,
    pg_server_version,
    pg_url_with_database,
    sqlite_versions,
)

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
PAGE = 100  # the API's default page size: the same query asks for PAGE + 1 rows


# -- a minimal keep-alive HTTP/1.1 client -----------------------------------------------------


class Conn:
    """One keep-alive connection; GET only; the answer's status and body."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self._auth = f"authorization: Bearer {token}\r\n"
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        if self._w is None:
            self._r, self._w = await asyncio.open_connection(self.host, self.port)
        assert self._r is not None
        self._w.write(
            f"GET {path} HTTP/1.1\r\nhost: {self.host}\r\n{self._auth}\r\n".encode("latin-1")
        )
        head = await self._r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, chunked, close = 0, False, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if chunked:
            body = b""
            while True:
                size = int((await self._r.readuntil(b"\r\n")).strip(), 16)
                body += await self._r.readexactly(size + 2)
                if size == 0:
                    break
            body = body[:-2]
        else:
            body = await self._r.readexactly(length)
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self._w is not None:
            self._w.close()
            with contextlib.suppress(Exception):
                await self._w.wait_closed()
        self._r = self._w = None


@dataclass
class Load:
    latencies: list[float] = field(default_factory=list)  # seconds, measured window only
    errors: dict[str, int] = field(default_factory=dict)
    window_s: float = 0.0
    cpu: CpuUse | None = None

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.window_s if self.window_s else 0.0

    def ms(self, p: float) -> float:
        return percentile(self.latencies, p) * 1000


async def drive(
    ports: list[int],
    token: str,
    cluster_id: str,
    nodes: int,
    *,
    clients: int,
    warmup_s: float,
    duration_s: float,
    pids: list[int],
) -> Load:
    """``clients`` connections, spread over ``ports``, asking clusters then nodes in turn."""
    paths = ("/api/v1/clusters", f"/api/v1/nodes?cluster={cluster_id}")
    load = Load()
    start = time.monotonic()
    measure_from = start + warmup_s
    end = measure_from + duration_s
    cpu_at: list[CpuSnapshot] = []

    def check(path: str, status: int, body: bytes) -> str | None:
        if status != 200:
            return f"HTTP {status}"
        items = json.loads(body)["items"]
        if path.startswith("/api/v1/nodes"):
            return None if len(items) == nodes else f"{len(items)} nodes"
        return None if any(c["id"] == cluster_id for c in items) else "cluster missing"

    async def one(k: int) -> None:
        conn = Conn("127.0.0.1", ports[k % len(ports)], token)
        i = k
        try:
            while (now := time.monotonic()) < end:
                path = paths[i % 2]
                i += 1
                t0 = time.perf_counter()
                try:
                    status, body = await conn.get(path)
                    problem = check(path, status, body)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    await conn.close()
                    problem = type(exc).__name__
                took = time.perf_counter() - t0
                if now >= measure_from and time.monotonic() <= end:
                    if problem is None:
                        load.latencies.append(took)
                    else:
                        load.errors[problem] = load.errors.get(problem, 0) + 1
        finally:
            await conn.close()

    async def sample_cpu() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        cpu_at.append(CpuSnapshot.take(pids[0], pids[1:]))
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        cpu_at.append(CpuSnapshot.take(pids[0], pids[1:]))

    await asyncio.gather(sample_cpu(), *(one(k) for k in range(clients)))
    load.window_s = duration_s
    load.latencies.sort()
    if len(cpu_at) == 2:
        load.cpu = CpuUse.between(cpu_at[0], cpu_at[1])
    return load


# -- the minimal ASGI handler (the baseline) --------------------------------------------------

BASELINE_CODE = r"""  # noqa: S608 - fixed SQL text, parameters bound by the driver
import hashlib, json, sys, uvicorn
kind, url, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
PAGE = int(sys.argv[4])
TOKEN = "SELECT user_id FROM api_token WHERE token_hash = {p1} AND revoked_at IS NULL"
CLUSTERS = ("SELECT * FROM cluster WHERE status != 'deleted' ORDER BY created_at LIMIT {p1}")
NODES = ("SELECT node.* FROM node JOIN cluster ON cluster.id = node.cluster_id "
         "WHERE node.cluster_id = {p1} AND node.state != 'removed' ORDER BY node.id LIMIT {p2}")
db = None

def sql(text):
    if kind == "postgres":
        return text.format(p1="$1", p2="$2")
    return text.format(p1="?", p2="?")

async def fetch(query, *args):
    if kind == "postgres":
        async with db.acquire() as conn:
            return [dict(r) for r in await conn.fetch(sql(query), *args)]
    async with db.execute(sql(query), args) as cur:
        names = [c[0] for c in cur.description]
        return [dict(zip(names, r)) for r in await cur.fetchall()]

async def app(scope, receive, send):
    global db
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                if kind == "postgres":
                    import asyncpg
                    db = await asyncpg.create_pool(url, min_size=2, max_size=10)
                else:
                    import aiosqlite
                    db = await aiosqlite.connect(url)
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await db.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    headers = dict(scope["headers"])
    token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
    status, body = 401, b'{"error": "unauthorized"}'
    if await fetch(TOKEN, hashlib.sha256(token.encode()).hexdigest()):
        if scope["path"] == "/api/v1/clusters":
            rows = await fetch(CLUSTERS, PAGE + 1)
        else:
            cluster = scope["query_string"].decode().partition("cluster=")[2]
            rows = await fetch(NODES, cluster, PAGE + 1)
        status = 200
        body = json.dumps({"items": rows[:PAGE], "next_cursor": None}, default=str).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
"""


class Baseline:
    def __init__(self, kind: str, url: str) -> None:
        self.kind, self.url = kind, url
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BASELINE_CODE, self.kind, self.url, str(self.port), str(PAGE)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError("the baseline server exited")
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1.0)
                return
            time.sleep(0.1)
        raise RuntimeError("the baseline server did not answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- one database -----------------------------------------------------------------------------


@dataclass
class Row:
    db: str
    processes: int
    server: Load | None = None
    baseline: Load | None = None
    error: str | None = None


async def setup_cluster(url: str, token: str, nodes: int) -> str:
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as api:
        (await api.post("/api/v1/projects", json={"name": "bench"})).raise_for_status()
        r = await api.post(
            "/api/v1/clusters",
            json={"project": "bench", "name": "reads", "size": nodes, "acceptance_tests": False},
        )
        r.raise_for_status()
        cluster_id = str(r.json()["id"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = await api.get(f"/api/v1/clusters/{cluster_id}")
            if r.json()["status"] == "ready":
                return cluster_id
            await asyncio.sleep(0.5)
    raise RuntimeError("the cluster did not become ready in 120 s")


async def bench_db(db: str, args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-reads-{db}-"))
    pg_name: str | None = None
    servers: list[ServerProcess] = []
    try:
        env = {
            "GPUFLEET_SIM_AGENTS": "true",
            "GPUFLEET_RUN_WORKERS": "true",
            "GPUFLEET_SIM_PROVISION_DELAY_S": "[0, 0]",
        }
        if db == "postgres":
            pg_name = new_pg_database_name()
            await pg_create_database(args.pg_url, pg_name)
            db_url = pg_url_with_database(args.pg_url, pg_name)
            env["GPUFLEET_DATABASE_URL"] = db_url
            version = (await pg_server_version(db_url)).split(" on ")[0]
        else:
            version = sqlite_versions()
        print(f"[{db}] {version}", flush=True)
        first = ServerProcess(data_dir=tmp / "data-0", env_overrides=env)
        servers.append(first)
        first.start()
        token = await asyncio.to_thread(first.wait_ready, timeout_s=60.0)
        cluster_id = await setup_cluster(first.url, token, args.nodes)
        db_target = db_url if db == "postgres" else str(first.data_dir / "gpufleet.db")
        for n in args.processes:
            row = Row(db=db, processes=n)
            rows.append(row)
            try:
                while len(servers) < n:  # API-only replicas on the same database
                    extra = ServerProcess(
                        data_dir=tmp / f"data-{len(servers)}",
                        env_overrides={**env, "GPUFLEET_RUN_WORKERS": "false"},
                    )
                    if db == "sqlite":
                        extra.env_overrides = {
                            **extra.env_overrides,
                            "GPUFLEET_DATABASE_URL": f"sqlite+aiosqlite:///{db_target}",
                        }
                    servers.append(extra)
                    extra.start()
                    # The owner token exists already: a replica answers /readyz, no file.
                    extra.token_file.write_text(token)
                    await asyncio.to_thread(extra.wait_ready, timeout_s=60.0)
                used = servers[:n]
                row.server = await drive(
                    [s.port for s in used],
                    token,
                    cluster_id,
                    args.nodes,
                    clients=args.clients,
                    warmup_s=args.warmup,
                    duration_s=args.duration,
                    pids=[s.pid or 0 for s in used],
                )
                print(f"[{db}] {n} process(es): server {row.server.rps:,.0f} req/s", flush=True)
                baselines = [Baseline(db, db_target) for _ in range(n)]
                try:
                    for b in baselines:
                        b.start()
                    for b in baselines:
                        await asyncio.to_thread(b.wait_ready)
                    row.baseline = await drive(
                        [b.port for b in baselines],
                        token,
                        cluster_id,
                        args.nodes,
                        clients=args.clients,
                        warmup_s=args.warmup,
                        duration_s=args.duration,
                        pids=[b.proc.pid if b.proc else 0 for b in baselines],
                    )
                finally:
                    for b in baselines:
                        b.stop()
                print(f"[{db}] {n} process(es): baseline {row.baseline.rps:,.0f} req/s", flush=True)
            except Exception as exc:  # noqa: BLE001 - say so, go on
                row.error = f"{type(exc).__name__}: {exc}"
                print(f"[{db}] FAILED: {row.error}", file=sys.stderr, flush=True)
                for s in servers:
                    print(s.log_tail(), file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001
        rows.append(Row(db=db, processes=0, error=f"{type(exc).__name__}: {exc}"))
        print(f"[{db}] FAILED: {exc}", file=sys.stderr, flush=True)
        for s in servers:
            print(s.log_tail(), file=sys.stderr, flush=True)
    finally:
        for s in servers:
            await asyncio.to_thread(s.stop)
        if pg_name is not None:
            with contextlib.suppress(Exception):
                await pg_drop_database(args.pg_url, pg_name)
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def fmt(load: Load | None) -> str:
    if load is None:
        return f"{'-':>8} | {'-':>7} | {'-':>7} | {'-':>7}"
    return f"{load.rps:>8,.0f} | {load.ms(50):>7.1f} | {load.ms(99):>7.1f} | {load.ms(100):>7.1f}"


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print()
    for line in machine_lines():
        print(line)
    print(
        f"{args.clients} clients (keep-alive), clusters and a {args.nodes}-node cluster's nodes "
        f"in turn, {args.warmup:g} s warm-up then {args.duration:g} s measured"
    )
    print("target: PostgreSQL ≥ 500 req/s with p99 ≤ 100 ms at 20 clients")
    print()
    print(
        "| db       | procs | what                 |    req/s |  p50 ms |  p99 ms |  max ms "
        "| CPU cores: servers, postgres, machine | errors"
    )
    print("|" + "-" * 120)
    for row in rows:
        if row.error and row.server is None:
            print(f"| {row.db:<8} | {row.processes:>5} | FAILED: {row.error}")
            continue
        for what, load in (("gpufleet server", row.server), ("minimal ASGI handler", row.baseline)):
            cpu = ""
            errors = ""
            if load is not None:
                if load.cpu is not None:
                    c = load.cpu
                    cpu = f"{c.server + c.clients:.2f}, {c.postgres:.2f}, {c.machine:.2f}"
                errors = ", ".join(f"{k}: {v}" for k, v in sorted(load.errors.items())) or "0"
            print(
                f"| {row.db:<8} | {row.processes:>5} | {what:<20} | {fmt(load)} | {cpu:<37} "
                f"| {errors}"
            )
        if row.server is not None and row.baseline is not None and row.baseline.rps:
            share = row.server.rps / row.baseline.rps
            print(f"|          |       | server ÷ baseline    | {share:>8.2f}")
        if row.error:
            print(f"|          |       | FAILED: {row.error}")
    for row in rows:
        if row.db == "postgres" and row.server is not None:
            met = row.server.rps >= 500 and row.server.ms(99) <= 100
            print(
                f"postgres, {row.processes} process(es): {row.server.rps:,.0f} req/s, "
                f"p99 {row.server.ms(99):.0f} ms: target {'MET' if met else 'MISSED'}"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", choices=("postgres", "sqlite", "both"), default="both")
    p.add_argument("--processes", default="1,2", help="server processes to try (default 1,2)")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--pg-url", default=os.environ.get("GPUFLEET_BENCH_PG_URL", DEFAULT_PG))
    args = p.parse_args(argv)
    args.processes = sorted({int(x) for x in str(args.processes).split(",") if x.strip()})
    if not args.processes or min(args.processes) < 1 or args.nodes > PAGE:
        p.error("--processes takes counts ≥ 1; --nodes at most 100 (one page)")
    return args


async def amain(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for db in ("postgres", "sqlite") if args.db == "both" else (args.db,):
        rows.extend(await bench_db(db, args))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = asyncio.run(amain(args))
    report(rows, args)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
