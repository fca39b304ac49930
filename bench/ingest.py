"""How many node reports a second the server sustains, next to raw INSERTs of the same rows.

    python bench/ingest.py [--db sqlite|postgres|both] [--nodes 2000] [--duration 20]
                           [--concurrency 64] [--pg-url postgresql://postgres@127.0.0.1:5432/test]

For each database: a fresh database (PostgreSQL: CREATE DATABASE gpufleet_bench_<random>,
dropped at the end; SQLite: a temp dir), the real server in a subprocess on 127.0.0.1,
a fleet of simulated nodes provisioned through the REST API, then load from client
processes (httpx) posting one-report batches (8 GPUs, increasing seq per node) round-robin
over the nodes. After the server stops, the same database takes the baselines: raw INSERTs
of the rows one report amounts to (8 GPU-sample rows + 1 node-state row), through the
driver the server uses, one transaction per report and then many reports per transaction.

Timings are printed, never asserted. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import queue
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CpuSnapshot,
    CpuUse,
    ServerProcess,
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
from gpufleet.core.agent_protocol import GpuSample, ReportBatch
from gpufleet.sim.telemetry import BUSY, gpu_model_or_default, initial_telemetry, next_telemetry

MAX_CLUSTER_SIZE = 4096  # gpufleet.server.schemas.clusters.MAX_CLUSTER_SIZE
TARGET_PG_REPORTS_S = 2000  # a 20,000-node fleet reporting every 10 s
GPUS_PER_NODE = 8
VARIANTS = 4  # telemetry readings per node, cycled (the values change report to report)
REPORTS_PATH = "/api/v1/agent/reports"


# -- the fleet -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """One provisioned node as its agent knows it (from the sim world's user_data)."""

    token: str
    hostname: str
    serial: str
    gpu_model: str
    gpus: tuple[tuple[int, str, str], ...]  # (index, uuid, serial)


def telemetry_variants(node: NodeSpec, *, seed: int) -> list[list[GpuSample]]:
    """``VARIANTS`` successive readings of the node's GPUs, busy, 10 s apart."""
    rng = random.Random(seed)
    model = gpu_model_or_default(node.gpu_model)
    state = [initial_telemetry(model, rng=rng) for _ in node.gpus]
    out: list[list[GpuSample]] = []
    for _ in range(VARIANTS):
        state = [next_telemetry(t, model=model, load=BUSY, elapsed_s=10.0, rng=rng) for t in state]
        out.append(
            [
                GpuSample(
                    index=index,
                    uuid=uuid,
                    serial=serial,
                    model=model.name,
                    utilization_pct=t.utilization_pct,
                    memory_used_mib=t.memory_used_mib,
                    memory_total_mib=t.memory_total_mib,
                    temperature_c=t.temperature_c,
                    power_w=t.power_w,
                    sm_clock_mhz=t.sm_clock_mhz,
                    ecc_sbe_volatile=t.ecc_sbe_volatile,
                    ecc_dbe_volatile=t.ecc_dbe_volatile,
                    ecc_sbe_aggregate=t.ecc_sbe_aggregate,
                    ecc_dbe_aggregate=t.ecc_dbe_aggregate,
                )
                for (index, uuid, serial), t in zip(node.gpus, state, strict=True)
            ]
        )
    return out


class BodyMaker:
    """Report bodies as bytes, built by string formatting (cheap: the client shares 2 cores).

    A node's first body carries its identity, as a freshly started agent's does.
    """

    def __init__(self, node: NodeSpec, *, seed: int) -> None:
        self._gpus_json = [
            json.dumps([g.model_dump(mode="json") for g in variant], separators=(",", ":"))
            for variant in telemetry_variants(node, seed=seed)
        ]
        self._identity = json.dumps(
            {"hostname": node.hostname, "serial": node.serial, "agent_version": "bench-ingest"},
            separators=(",", ":"),
        )

    def body(self, seq: int, *, first: bool) -> bytes:
        sampled_at = dt.datetime.now(dt.UTC).isoformat()
        report = (
            f'{{"seq":{seq},"sampled_at":"{sampled_at}","gpus":{self._gpus_json[seq % VARIANTS]}}}'
        )
        if first:
            return f'{{"identity":{self._identity},"reports":[{report}]}}'.encode()
        return f'{{"reports":[{report}]}}'.encode()


def check_bodies(node: NodeSpec) -> None:
    """The hand-built bodies must be what the protocol says (fail here, not mid-run)."""
    maker = BodyMaker(node, seed=0)
    for seq, first in ((1, True), (2, False)):
        batch = ReportBatch.model_validate_json(maker.body(seq, first=first))
        assert len(batch.reports) == 1 and len(batch.reports[0].gpus) == len(node.gpus)
        assert (batch.identity is not None) == first


# -- load: client processes ------------------------------------------------------------------


@dataclass(frozen=True)
class ClientJob:
    index: int
    url: str
    nodes: list[NodeSpec]
    concurrency: int
    seed: int
    client: str  # "httpx" or "raw"
    ready_timeout_s: float  # the first pass over all nodes must finish within this
    max_run_s: float  # hard stop whatever the parent says (bounded loops)


@dataclass
class ClientResult:
    index: int
    latencies_ms: list[float] = field(default_factory=list)
    accepted: int = 0  # reports the acks say were stored, inside the window
    ok: int = 0  # 200 responses inside the window
    not_accepted: int = 0  # 200 but accepted == 0 (duplicate seq): should stay 0
    errors: dict[str, int] = field(default_factory=dict)  # inside the window
    errors_outside: int = 0
    cpu_s: float = 0.0  # this process's CPU inside the window
    window_s: float = 0.0
    first_pass_s: float = 0.0
    total_requests: int = 0


PostFn = Callable[[int, bytes], Awaitable[tuple[str, int]]]


class RawConnection:
    """One keep-alive HTTP/1.1 connection, hand-written: POST, read the ack, repeat.

    The load generator shares the machine's 2 cores with the server; httpx spends
    milliseconds of CPU per request, this a few tens of microseconds. It speaks only what
    this benchmark needs (Content-Length bodies, reconnect on close or error).
    """

    def __init__(self, url: str, *, auth: list[dict[str, str]], timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._timeout = timeout_s
        self._prefix = (
            f"POST {REPORTS_PATH} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        self._auth = [f"Authorization: {h['authorization']}\r\n".encode() for h in auth]
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, i: int, body: bytes) -> tuple[str, int]:
        try:
            return await asyncio.wait_for(self._post(i, body), self._timeout)
        except BaseException:
            self.close()  # a half-read response must not poison the next request
            raise

    async def _post(self, i: int, body: bytes) -> tuple[str, int]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(
            b"".join((self._prefix, self._auth[i], b"Content-Length: %d\r\n\r\n" % len(body), body))
        )
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)[1].decode()
        length: int | None = None
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        if length is None:
            raise ValueError("response without Content-Length")
        payload = await reader.readexactly(length)
        if close:
            self.close()
        if status != "200":
            return status, 0
        return status, int(json.loads(payload)["accepted"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def client_process(job: ClientJob, window: Any, out: Any) -> None:
    """Entry point of one load process (spawned). ``window`` is [start, end] monotonic."""
    # A terminal's Ctrl-C reaches the whole process group: the parent alone handles it
    # (and terminates this process), so the cleanup runs in one place.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = asyncio.run(_drive(job, window, out))
    except BaseException as exc:  # noqa: BLE001 - report anything; the parent must not wait blind
        out.put(("error", job.index, repr(exc)))
        return
    out.put(("result", job.index, result))


async def _drive(job: ClientJob, window: Any, out: Any) -> ClientResult:
    nodes = job.nodes
    n = len(nodes)
    makers = [BodyMaker(node, seed=job.seed + i) for i, node in enumerate(nodes)]
    headers = [
        {"authorization": f"Bearer {node.token}", "content-type": "application/json"}
        for node in nodes
    ]
    seq = [0] * n
    busy = [False] * n
    stored = [False] * n
    stored_count = 0
    cursor = 0
    res = ClientResult(index=job.index)
    errors: Counter[str] = Counter()
    began = time.monotonic()
    hard_stop = began + job.max_run_s
    ready_sent = False

    def pick() -> int:
        # Round-robin, skipping a node with a request in flight (n > concurrency, so one
        # is always free): a node's reports then arrive in seq order, as an agent's do.
        nonlocal cursor
        for _ in range(n):
            i = cursor
            cursor = (cursor + 1) % n
            if not busy[i]:
                return i
        raise RuntimeError("no free node (nodes must exceed concurrency)")

    async def cpu_meter() -> None:
        # The window is set by another process, in shared memory: polling is the way.
        while window[0] == 0.0 and time.monotonic() < hard_stop:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        start, end = window[0], window[1]
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        c0 = time.process_time()
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        res.cpu_s = time.process_time() - c0
        res.window_s = end - start

    async def worker(post: PostFn) -> None:
        nonlocal stored_count, ready_sent
        while True:
            now = time.monotonic()
            end = window[1]
            if (end and now >= end) or now >= hard_stop:
                return
            if not ready_sent and now - began > job.ready_timeout_s:
                raise RuntimeError(
                    f"first pass incomplete after {job.ready_timeout_s:.0f} s "
                    f"({stored_count}/{n} nodes stored a report)"
                )
            i = pick()
            busy[i] = True
            seq[i] += 1
            body = makers[i].body(seq[i], first=seq[i] == 1)
            t0 = time.perf_counter()
            try:
                status, accepted = await post(i, body)
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                status = type(exc).__name__
            finally:
                busy[i] = False
            t1 = time.perf_counter()
            done = time.monotonic()
            res.total_requests += 1
            if status == "200" and accepted and not stored[i]:
                stored[i] = True
                stored_count += 1
                if stored_count == n and not ready_sent:
                    ready_sent = True
                    res.first_pass_s = done - began
                    out.put(("ready", job.index, res.first_pass_s))
            start, end = window[0], window[1]
            if start and start <= done <= end:
                if status == "200":
                    res.ok += 1
                    res.accepted += accepted
                    if not accepted:
                        res.not_accepted += 1
                    res.latencies_ms.append((t1 - t0) * 1000.0)
                else:
                    errors[status] += 1
            elif status != "200":
                res.errors_outside += 1

    meter = asyncio.create_task(cpu_meter())
    try:
        if job.client == "raw":
            conns = [RawConnection(job.url, auth=headers) for _ in range(job.concurrency)]
            try:
                await asyncio.gather(*(worker(c.post) for c in conns))
            finally:
                for c in conns:
                    c.close()
        else:
            limits = httpx.Limits(
                max_connections=job.concurrency, max_keepalive_connections=job.concurrency
            )
            async with httpx.AsyncClient(base_url=job.url, limits=limits, timeout=30.0) as client:

                async def post(i: int, body: bytes) -> tuple[str, int]:
                    r = await client.post(REPORTS_PATH, content=body, headers=headers[i])
                    if r.status_code != 200:
                        return str(r.status_code), 0
                    return "200", int(r.json()["accepted"])

                await asyncio.gather(*(worker(post) for _ in range(job.concurrency)))
    finally:
        meter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await meter
    res.errors = dict(errors)
    return res


@dataclass
class LoadResult:
    duration_s: float
    accepted: int
    ok: int
    not_accepted: int
    errors: dict[str, int]
    errors_outside: int
    latencies_ms: list[float]
    client_cpu: float  # cores, all client processes together
    cpu: CpuUse
    first_pass_s: float

    @property
    def reports_s(self) -> float:
        return self.accepted / self.duration_s if self.duration_s else 0.0


def run_load(
    *,
    url: str,
    nodes: list[NodeSpec],
    server_pid: int | None,
    concurrency: int,
    procs: int,
    client: str,
    warmup_s: float,
    duration_s: float,
    stop: threading.Event,
) -> LoadResult:
    if len(nodes) <= concurrency:
        raise SystemExit(f"--nodes ({len(nodes)}) must exceed --concurrency ({concurrency})")
    ctx = mp.get_context("spawn")
    window = ctx.RawArray("d", 2)  # [start, end], time.monotonic(); 0 = not set yet
    out = ctx.Queue()
    ready_timeout = 120.0 + len(nodes) / 20.0
    max_run = ready_timeout + warmup_s + duration_s + 60.0
    jobs = [
        ClientJob(
            index=k,
            url=url,
            nodes=nodes[k::procs],
            concurrency=max(1, concurrency // procs + (1 if k < concurrency % procs else 0)),
            seed=1000 * k,
            client=client,
            ready_timeout_s=ready_timeout,
            max_run_s=max_run,
        )
        for k in range(procs)
    ]
    workers = [ctx.Process(target=client_process, args=(j, window, out), daemon=True) for j in jobs]
    results: dict[int, ClientResult] = {}
    try:
        for w in workers:
            w.start()
        ready: dict[int, float] = {}
        deadline = time.monotonic() + ready_timeout + 30.0
        while len(ready) < procs:
            kind, idx, payload = _get(out, deadline, workers, stop)
            if kind == "ready":
                ready[idx] = float(payload)
            else:
                raise RuntimeError(f"client {idx} failed before the window: {payload}")
        start = time.monotonic() + warmup_s
        window[0] = start
        window[1] = start + duration_s
        _sleep(start - time.monotonic(), stop)
        pids = [w.pid for w in workers if w.pid is not None]
        cpu_a = CpuSnapshot.take(server_pid, pids)
        _sleep(window[1] - time.monotonic(), stop)
        cpu_b = CpuSnapshot.take(server_pid, pids)
        deadline = time.monotonic() + 60.0
        while len(results) < procs:
            kind, idx, payload = _get(out, deadline, workers, stop)
            if kind == "result":
                assert isinstance(payload, ClientResult)
                results[idx] = payload
            elif kind == "error":
                raise RuntimeError(f"client {idx} failed: {payload}")
    finally:
        for w in workers:
            w.join(timeout=5.0)
            if w.is_alive():
                w.terminate()
                w.join(timeout=5.0)
    rs = list(results.values())
    errors: Counter[str] = Counter()
    for r in rs:
        errors.update(r.errors)
    latencies = sorted(lat for r in rs for lat in r.latencies_ms)
    return LoadResult(
        duration_s=duration_s,
        accepted=sum(r.accepted for r in rs),
        ok=sum(r.ok for r in rs),
        not_accepted=sum(r.not_accepted for r in rs),
        errors=dict(errors),
        errors_outside=sum(r.errors_outside for r in rs),
        latencies_ms=latencies,
        client_cpu=sum(r.cpu_s for r in rs) / duration_s,
        cpu=CpuUse.between(cpu_a, cpu_b),
        first_pass_s=max(r.first_pass_s for r in rs),
    )


class Interrupted(Exception):
    """The benchmark was asked to stop (Ctrl-C, SIGTERM)."""


def _sleep(seconds: float, stop: threading.Event) -> None:
    if stop.wait(max(0.0, seconds)):
        raise Interrupted


def _get(
    out: Any, deadline: float, workers: list[Any], stop: threading.Event
) -> tuple[str, int, Any]:
    while True:
        if stop.is_set():
            raise Interrupted
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError("timed out waiting for the client processes")
        try:
            msg = out.get(timeout=min(1.0, remaining))
        except queue.Empty:
            dead = [w for w in workers if not w.is_alive() and w.exitcode not in (0, None)]
            if dead:
                raise RuntimeError(f"client process died (exit {dead[0].exitcode})") from None
            continue
        kind, idx, payload = msg
        return str(kind), int(idx), payload


# -- setting up the fleet through the API ---------------------------------------------------


async def create_fleet(url: str, owner_token: str, *, nodes: int, timeout_s: float) -> list[str]:
    """A project and clusters totalling ``nodes``; waits until every cluster is ready."""
    headers = {"authorization": f"Bearer {owner_token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as api:
        r = await api.post("/api/v1/projects", json={"name": "bench"})
        r.raise_for_status()
        cluster_ids: list[str] = []
        left, k = nodes, 0
        while left > 0:
            size = min(left, MAX_CLUSTER_SIZE)
            r = await api.post(
                "/api/v1/clusters",
                json={
                    "project": "bench",
                    "name": f"bench-{k}",
                    "size": size,
                    "gpus_per_node": GPUS_PER_NODE,
                    "acceptance_tests": False,  # measured here: ingest, not acceptance
                },
            )
            r.raise_for_status()
            cluster_ids.append(str(r.json()["id"]))
            left -= size
            k += 1
        deadline = time.monotonic() + timeout_s
        pending = set(cluster_ids)
        status = ""
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"clusters not ready after {timeout_s:.0f} s (last status {status!r})"
                )
            for cid in sorted(pending):
                r = await api.get(f"/api/v1/clusters/{cid}")
                r.raise_for_status()
                status = str(r.json()["status"])
                if status == "ready":
                    pending.discard(cid)
                elif status in ("failed", "deleting", "deleted"):
                    raise RuntimeError(f"cluster {cid} went {status}")
            if pending:
                await asyncio.sleep(0.5)
    return cluster_ids


def load_node_specs(world_file: Path, cluster_ids: list[str]) -> list[NodeSpec]:
    """Each node's token and GPUs, as the sim provider handed them to the machine."""
    from gpufleet.sim.models import USER_DATA_TOKEN, SimInstanceState
    from gpufleet.sim.world import SimWorld

    world = SimWorld(world_file)  # read-only use: loading writes nothing
    wanted = set(cluster_ids)
    specs = [
        NodeSpec(
            token=i.user_data[USER_DATA_TOKEN],
            hostname=i.hostname,
            serial=i.serial,
            gpu_model=i.gpu_model,
            gpus=tuple((g.index, g.uuid, g.serial) for g in i.gpus),
        )
        for i in world.list_instances()
        if i.cluster_id in wanted
        and i.state is SimInstanceState.RUNNING
        and USER_DATA_TOKEN in i.user_data
    ]
    if not specs:
        raise RuntimeError(f"no running instances with a node token in {world_file}")
    return specs


# -- baselines: raw INSERTs of the same rows ------------------------------------------------


@dataclass(frozen=True)
class BaselineRows:
    """Per node: node id, then ``VARIANTS`` lists of 8 GPU value tuples (no time, no seq)."""

    nodes: list[tuple[str, list[list[tuple[Any, ...]]]]]

    @classmethod
    def build(cls, specs: list[NodeSpec]) -> BaselineRows:
        out = []
        for k, spec in enumerate(specs):
            variants = [
                [
                    (
                        g.index,
                        g.uuid,
                        g.utilization_pct,
                        g.memory_used_mib,
                        g.memory_total_mib,
                        g.temperature_c,
                        g.power_w,
                        g.sm_clock_mhz,
                        g.ecc_sbe_volatile,
                        g.ecc_dbe_volatile,
                        g.ecc_sbe_aggregate,
                        g.ecc_dbe_aggregate,
                    )
                    for g in variant
                ]
                for variant in telemetry_variants(spec, seed=k)
            ]
            out.append((f"node-{k:06d}", variants))
        return cls(out)


GPU_COLS = (
    "node_id, idx, uuid, utilization_pct, memory_used_mib, memory_total_mib, temperature_c, "
    "power_w, sm_clock_mhz, ecc_sbe_volatile, ecc_dbe_volatile, ecc_sbe_aggregate, "
    "ecc_dbe_aggregate, sampled_at"
)
NODE_COLS = "node_id, last_report_at, last_report_seq, health"


@dataclass(frozen=True)
class BaselineResult:
    per_report_txn: float  # reports/s
    batched: float  # reports/s
    batch: int  # reports per transaction in the batched run


def _report_rows(
    rows: BaselineRows, k: int, seq: int, now: Any
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
    node_id, variants = rows.nodes[k % len(rows.nodes)]
    gpus = [(node_id, *g, now) for g in variants[seq % VARIANTS]]
    return gpus, (node_id, now, seq, "healthy")


async def pg_baseline(
    url: str, rows: BaselineRows, *, duration_s: float, batch: int
) -> BaselineResult:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    conn = await asyncpg.connect(pg_plain_url(url), timeout=10)
    try:
        await conn.execute(
            """
            CREATE TABLE bench_gpu_sample (
                node_id varchar(32) NOT NULL, idx integer NOT NULL, uuid varchar(80) NOT NULL,
                utilization_pct double precision, memory_used_mib double precision,
                memory_total_mib double precision, temperature_c double precision,
                power_w double precision, sm_clock_mhz double precision,
                ecc_sbe_volatile bigint, ecc_dbe_volatile bigint, ecc_sbe_aggregate bigint,
                ecc_dbe_aggregate bigint, sampled_at timestamptz NOT NULL);
            CREATE TABLE bench_node_state (
                node_id varchar(32) NOT NULL, last_report_at timestamptz NOT NULL,
                last_report_seq bigint NOT NULL, health varchar(16) NOT NULL);
            """
        )
        # Constants only, no input: S608 does not apply.
        gpu_sql = f"INSERT INTO bench_gpu_sample ({GPU_COLS}) VALUES ({_dollars(14)})"  # noqa: S608
        node_sql = f"INSERT INTO bench_node_state ({NODE_COLS}) VALUES ($1, $2, $3, $4)"  # noqa: S608
        await conn.execute("TRUNCATE bench_gpu_sample, bench_node_state")

        async def per_report() -> float:
            done, seq = 0, 0
            t0 = time.perf_counter()
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                seq += 1
                gpus, node = _report_rows(rows, done, seq, dt.datetime.now(dt.UTC))
                async with conn.transaction():
                    await conn.executemany(gpu_sql, gpus)
                    await conn.execute(node_sql, *node)
                done += 1
            return done / (time.perf_counter() - t0)

        async def batched() -> float:
            done, seq = 0, 0
            t0 = time.perf_counter()
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                now = dt.datetime.now(dt.UTC)
                gpu_rows: list[tuple[Any, ...]] = []
                node_rows: list[tuple[Any, ...]] = []
                for _ in range(batch):
                    seq += 1
                    gpus, node = _report_rows(rows, done + len(node_rows), seq, now)
                    gpu_rows.extend(gpus)
                    node_rows.append(node)
                async with conn.transaction():
                    await conn.executemany(gpu_sql, gpu_rows)
                    await conn.executemany(node_sql, node_rows)
                done += batch
            return done / (time.perf_counter() - t0)

        one = await per_report()
        many = await batched()
        await conn.execute("DROP TABLE bench_gpu_sample, bench_node_state")
        return BaselineResult(per_report_txn=one, batched=many, batch=batch)
    finally:
        await conn.close()


def _dollars(n: int) -> str:
    return ", ".join(f"${i}" for i in range(1, n + 1))


async def sqlite_baseline(
    path: Path, rows: BaselineRows, *, duration_s: float, batch: int
) -> BaselineResult:
    import aiosqlite

    # The pragmas and BEGIN IMMEDIATE the server uses (gpufleet.server.db.engine).
    db = await aiosqlite.connect(str(path), isolation_level=None, timeout=30)
    try:
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA foreign_keys=ON",
            "PRAGMA busy_timeout=30000",
            "PRAGMA synchronous=NORMAL",
        ):
            await db.execute(pragma)
        await db.execute(
            """
            CREATE TABLE bench_gpu_sample (
                node_id VARCHAR(32) NOT NULL, idx INTEGER NOT NULL, uuid VARCHAR(80) NOT NULL,
                utilization_pct FLOAT, memory_used_mib FLOAT, memory_total_mib FLOAT,
                temperature_c FLOAT, power_w FLOAT, sm_clock_mhz FLOAT,
                ecc_sbe_volatile BIGINT, ecc_dbe_volatile BIGINT, ecc_sbe_aggregate BIGINT,
                ecc_dbe_aggregate BIGINT, sampled_at DATETIME NOT NULL)
            """
        )
        await db.execute(
            """
            CREATE TABLE bench_node_state (
                node_id VARCHAR(32) NOT NULL, last_report_at DATETIME NOT NULL,
                last_report_seq BIGINT NOT NULL, health VARCHAR(16) NOT NULL)
            """
        )
        marks = ", ".join("?" * 14)
        gpu_sql = f"INSERT INTO bench_gpu_sample ({GPU_COLS}) VALUES ({marks})"  # noqa: S608
        node_sql = f"INSERT INTO bench_node_state ({NODE_COLS}) VALUES (?, ?, ?, ?)"  # noqa: S608

        def now_text() -> str:
            # How SQLAlchemy's DateTime stores a timestamp in SQLite.
            return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

        async def per_report() -> float:
            done, seq = 0, 0
            t0 = time.perf_counter()
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                seq += 1
                gpus, node = _report_rows(rows, done, seq, now_text())
                await db.execute("BEGIN IMMEDIATE")
                try:
                    await db.executemany(gpu_sql, gpus)
                    await db.execute(node_sql, node)
                    await db.execute("COMMIT")
                except BaseException:
                    await db.execute("ROLLBACK")
                    raise
                done += 1
            return done / (time.perf_counter() - t0)

        async def batched() -> float:
            done, seq = 0, 0
            t0 = time.perf_counter()
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                now = now_text()
                gpu_rows: list[tuple[Any, ...]] = []
                node_rows: list[tuple[Any, ...]] = []
                for _ in range(batch):
                    seq += 1
                    gpus, node = _report_rows(rows, done + len(node_rows), seq, now)
                    gpu_rows.extend(gpus)
                    node_rows.append(node)
                await db.execute("BEGIN IMMEDIATE")
                try:
                    await db.executemany(gpu_sql, gpu_rows)
                    await db.executemany(node_sql, node_rows)
                    await db.execute("COMMIT")
                except BaseException:
                    await db.execute("ROLLBACK")
                    raise
                done += batch
            return done / (time.perf_counter() - t0)

        one = await per_report()
        many = await batched()
        await db.execute("DROP TABLE bench_gpu_sample")
        await db.execute("DROP TABLE bench_node_state")
        return BaselineResult(per_report_txn=one, batched=many, batch=batch)
    finally:
        await db.close()


def idle_busy_cores(seconds: float = 1.0) -> float:
    """How busy the machine is with nothing of ours running (other users' processes)."""
    a = CpuSnapshot.take(None)
    time.sleep(seconds)
    return CpuUse.between(a, CpuSnapshot.take(None)).machine


# -- one database, end to end ----------------------------------------------------------------


@dataclass
class DbRun:
    db: str
    version: str = ""
    nodes: int = 0
    provision_s: float = 0.0
    load: LoadResult | None = None
    baseline: BaselineResult | None = None
    group_failures: int = 0
    idle_busy_cores: float = 0.0  # machine busy before this run started (should be ~0)
    error: str | None = None


async def bench_one(db: str, args: argparse.Namespace) -> DbRun:
    run = DbRun(db=db)
    tmp = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-{db}-"))
    pg_name: str | None = None
    server: ServerProcess | None = None
    try:
        run.idle_busy_cores = await asyncio.to_thread(idle_busy_cores)
        if run.idle_busy_cores > 0.15:
            print(
                f"[{db}] WARNING: the machine is already {run.idle_busy_cores:.2f} cores busy "
                "before the run; figures will be low (see 'other' CPU below)",
                file=sys.stderr,
                flush=True,
            )
        env = {
            "GPUFLEET_SIM_AGENTS": "false",
            "GPUFLEET_RUN_WORKERS": "true",
            "GPUFLEET_SIM_PROVISION_DELAY_S": "[0, 0]",
            "GPUFLEET_REPLICA_ID": f"bench-{db}",
        }
        db_url: str | None = None
        if db == "postgres":
            pg_name = new_pg_database_name()
            await pg_create_database(args.pg_url, pg_name)
            db_url = pg_url_with_database(args.pg_url, pg_name)
            env["GPUFLEET_DATABASE_URL"] = db_url
            run.version = (await pg_server_version(db_url)).split(" on ")[0]
        else:
            run.version = sqlite_versions()
        server = ServerProcess(data_dir=tmp / "data", env_overrides=env)
        server.start()
        owner = await asyncio.to_thread(server.wait_ready, timeout_s=60.0)
        t0 = time.monotonic()
        cluster_ids = await create_fleet(
            server.url, owner, nodes=args.nodes, timeout_s=args.provision_timeout
        )
        run.provision_s = time.monotonic() - t0
        specs = await asyncio.to_thread(
            load_node_specs, server.data_dir / "sim-world.json", cluster_ids
        )
        run.nodes = len(specs)
        check_bodies(specs[0])
        print(
            f"[{db}] {run.nodes} nodes ready in {run.provision_s:.1f} s; "
            f"load: {args.client_procs} {args.client} client process(es), "
            f"{args.concurrency} in flight, "
            f"warm-up = one report per node + {args.warmup:g} s, then {args.duration:g} s",
            flush=True,
        )
        stop = threading.Event()
        load_call = asyncio.to_thread(
            run_load,
            url=server.url,
            nodes=specs,
            server_pid=server.pid,
            concurrency=args.concurrency,
            procs=args.client_procs,
            client=args.client,
            warmup_s=args.warmup,
            duration_s=args.duration,
            stop=stop,
        )
        try:
            run.load = await load_call
        except asyncio.CancelledError:
            stop.set()  # the thread stops its client processes and returns at once
            raise
        print(f"[{db}] server: {run.load.reports_s:,.0f} reports/s", flush=True)
        run.group_failures = server.count_log(r"failed; retrying each batch alone")
        # Stop the server first: the baseline gets the machine to itself, as the server did
        # (minus the load generator), and the database sees no other writer.
        await asyncio.to_thread(server.stop)
        rows = BaselineRows.build(specs)
        batch = args.baseline_batch or args.concurrency
        if db == "postgres":
            assert db_url is not None
            run.baseline = await pg_baseline(
                db_url, rows, duration_s=args.baseline_duration, batch=batch
            )
        else:
            run.baseline = await sqlite_baseline(
                server.data_dir / "gpufleet.db",
                rows,
                duration_s=args.baseline_duration,
                batch=batch,
            )
        print(
            f"[{db}] baseline: {run.baseline.per_report_txn:,.0f} reports/s one txn per report, "
            f"{run.baseline.batched:,.0f} reports/s {batch} per txn",
            flush=True,
        )
    except Exception as exc:  # noqa: BLE001 - report it, clean up, go on with the next db
        run.error = f"{type(exc).__name__}: {exc}"
        print(f"[{db}] FAILED: {run.error}", file=sys.stderr, flush=True)
        if server is not None:
            print(server.log_tail(), file=sys.stderr, flush=True)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
        if pg_name is not None:
            try:
                await pg_drop_database(args.pg_url, pg_name)
            except Exception as exc:  # noqa: BLE001 - say so; the run itself is over
                print(f"[{db}] could not drop database {pg_name}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    return run


# -- output ----------------------------------------------------------------------------------


def print_report(runs: list[DbRun], args: argparse.Namespace) -> None:
    print()
    for line in machine_lines():
        print(line)
    for run in runs:
        print(f"{run.db}: {run.version or '?'}")
    print(
        f"load: {args.nodes} nodes, {GPUS_PER_NODE} GPUs each, 1 report per request, "
        f"{args.concurrency} requests in flight from {args.client_procs} {args.client} "
        f"client process(es), "
        f"{args.duration:g} s measured after warm-up"
    )
    print()
    headers = [
        "db",
        "server reports/s",
        "p50 ms",
        "p99 ms",
        "baseline raw reports/s (per-report txn)",
        "baseline (batched)",
        "target",
    ]
    table: list[list[str]] = []
    for run in runs:
        target = f"≥ {TARGET_PG_REPORTS_S:,}" if run.db == "postgres" else "—"
        if run.error is not None and run.load is None:
            table.append([run.db, "FAILED", "", "", "", "", target])
            continue
        load, base = run.load, run.baseline
        lat = load.latencies_ms if load else []
        table.append(
            [
                run.db,
                f"{load.reports_s:,.0f}" if load else "",
                f"{percentile(lat, 50):.1f}" if lat else "",
                f"{percentile(lat, 99):.1f}" if lat else "",
                f"{base.per_report_txn:,.0f}" if base else "",
                f"{base.batched:,.0f} ({base.batch}/txn)" if base else "",
                target,
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    for run in runs:
        if run.load is None:
            if run.error:
                print(f"{run.db}: failed: {run.error}")
            continue
        load = run.load
        cpu = load.cpu
        errs = ", ".join(f"{k}×{v}" for k, v in sorted(load.errors.items())) or "none"
        print(
            f"{run.db}: {load.ok:,} acks in {load.duration_s:g} s, errors {errs}, "
            f"acks with accepted=0: {load.not_accepted}, errors outside the window: "
            f"{load.errors_outside}, group retries logged: {run.group_failures}; "
            f"p90 {percentile(load.latencies_ms, 90):.1f} ms, "
            f"max {load.latencies_ms[-1] if load.latencies_ms else float('nan'):.1f} ms; "
            f"provisioning {run.provision_s:.1f} s, first pass {load.first_pass_s:.1f} s"
        )
        print(f"{run.db}: machine busy before the run: {run.idle_busy_cores:.2f} cores")
        print(
            f"{run.db}: CPU in cores: server {cpu.server:.2f}, postgres {cpu.postgres:.2f}, "
            f"clients {cpu.clients:.2f} (self-measured {load.client_cpu:.2f}), "
            f"bench {cpu.bench:.2f}, other {cpu.other:.2f}; "
            f"machine busy {cpu.machine:.2f} of {cpu.machine_cores:.0f}"
        )
        if run.error:
            print(f"{run.db}: failed after the load: {run.error}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    p.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="admin URL; the bench creates and drops its own database next to it",
    )
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after the first pass")
    p.add_argument("--client-procs", type=int, default=1, help="load-generating processes")
    p.add_argument(
        "--client",
        choices=["httpx", "raw"],
        default="raw",
        help="raw (default): a minimal HTTP/1.1 client that leaves the server its core; "
        "httpx: the client the agents use",
    )
    p.add_argument("--baseline-duration", type=float, default=5.0, help="seconds per baseline")
    p.add_argument(
        "--baseline-batch",
        type=int,
        default=0,
        help="reports per transaction in the batched baseline (default: --concurrency, "
        "the most the server's group commit can gather at that load)",
    )
    p.add_argument("--provision-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.duration <= 0 or args.concurrency < 1 or args.client_procs < 1:
        p.error("--nodes, --duration, --concurrency and --client-procs must be positive")
    if args.db in ("postgres", "both"):
        check_loopback(pg_plain_url(args.pg_url))
    return args


async def amain(args: argparse.Namespace) -> list[DbRun]:
    task = asyncio.current_task()
    if task is not None:
        sigterm_cancels(task)
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    runs: list[DbRun] = []
    for db in dbs:
        runs.append(await bench_one(db, args))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = asyncio.run(amain(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; server stopped and scratch databases dropped", file=sys.stderr)
        return 130
    print_report(runs, args)
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
