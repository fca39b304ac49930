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
    pg_setting,
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
    urls: tuple[str, ...]  # the server processes; connection j talks to urls[j % len]
    nodes: list[NodeSpec]
    concurrency: int
    seed: int
    client: str  # "httpx" or "raw"
    ready_timeout_s: float  # the first pass over all nodes must finish within this
    max_run_s: float  # hard stop whatever the parent says (bounded loops)
    seq_base: int = 0  # a node's first seq is seq_base + 1 (a later run goes on above)


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
    seq = [job.seq_base] * n
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
            body = makers[i].body(seq[i], first=seq[i] == job.seq_base + 1)
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
            conns = [
                RawConnection(job.urls[j % len(job.urls)], auth=headers)
                for j in range(job.concurrency)
            ]
            try:
                await asyncio.gather(*(worker(c.post) for c in conns))
            finally:
                for c in conns:
                    c.close()
        else:
            limits = httpx.Limits(
                max_connections=job.concurrency, max_keepalive_connections=job.concurrency
            )
            async with contextlib.AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(
                        httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0)
                    )
                    for url in job.urls
                ]

                def poster(client: httpx.AsyncClient) -> PostFn:
                    async def post(i: int, body: bytes) -> tuple[str, int]:
                        r = await client.post(REPORTS_PATH, content=body, headers=headers[i])
                        if r.status_code != 200:
                            return str(r.status_code), 0
                        return "200", int(r.json()["accepted"])

                    return post

                await asyncio.gather(
                    *(worker(poster(clients[j % len(clients)])) for j in range(job.concurrency))
                )
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
    urls: tuple[str, ...],
    nodes: list[NodeSpec],
    server_pids: list[int],
    seq_base: int,
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
            urls=urls,
            nodes=nodes[k::procs],
            concurrency=max(1, concurrency // procs + (1 if k < concurrency % procs else 0)),
            seed=1000 * k,
            client=client,
            ready_timeout_s=ready_timeout,
            max_run_s=max_run,
            seq_base=seq_base,
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
        cpu_a = CpuSnapshot.take(server_pids[0], pids, more_server_pids=server_pids[1:])
        _sleep(window[1] - time.monotonic(), stop)
        cpu_b = CpuSnapshot.take(server_pids[0], pids, more_server_pids=server_pids[1:])
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


# -- fleet mode: every node once per interval, then the store and the loops checked --------


@dataclass(frozen=True)
class FleetJob:
    index: int
    urls: tuple[str, ...]
    nodes: list[NodeSpec]
    connections: int
    seed: int
    interval_s: float
    start_at: float  # time.monotonic() (system-wide) when the measured window begins
    duration_s: float
    warmup_s: float  # before the window: every node reports, the health loop settles
    drain_s: float  # after the end, how long requests in flight may take


@dataclass
class FleetClientResult:
    index: int
    hostnames: list[str] = field(default_factory=list)
    acked_seq: list[int] = field(default_factory=list)  # per node: last seq acked as stored
    stored_acks: list[int] = field(default_factory=list)  # per node: acks with accepted=1
    sent: int = 0  # requests sent in the window (retries included)
    window_stored: int = 0  # of those, acked as stored
    retry_duplicates: int = 0  # accepted=0 for a seq resent after an error: correct
    fresh_duplicates: int = 0  # accepted=0 for a seq sent the first time: a lost report
    errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)  # send time minus due time
    unfinished: int = 0  # requests still in flight when the drain ended
    cpu_s: float = 0.0


def fleet_client_process(job: FleetJob, out: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = asyncio.run(_drive_fleet(job))
    except BaseException as exc:  # noqa: BLE001 - report anything; the parent must not wait blind
        out.put(("error", job.index, repr(exc)))
        return
    out.put(("result", job.index, result))


async def _drive_fleet(job: FleetJob) -> FleetClientResult:
    """Each node sends its next report when due (its phase in the interval is random),
    one request at a time; after an error it resends the same seq at its next turn, as an
    agent's spool does. A report sent late (the server behind) is still sent."""
    import heapq

    n = len(job.nodes)
    rng = random.Random(job.seed)
    makers = [BodyMaker(node, seed=job.seed + i) for i, node in enumerate(job.nodes)]
    auth = [{"authorization": f"Bearer {node.token}"} for node in job.nodes]
    res = FleetClientResult(
        index=job.index,
        hostnames=[node.hostname for node in job.nodes],
        acked_seq=[0] * n,
        stored_acks=[0] * n,
    )
    retrying = [False] * n
    errors: Counter[str] = Counter()
    first = job.start_at - job.warmup_s
    due = [first + rng.uniform(0.0, job.interval_s) for _ in range(n)]
    heap = [(due[i], i) for i in range(n)]
    heapq.heapify(heap)
    end = job.start_at + job.duration_s
    ready: asyncio.Queue[int] = asyncio.Queue()
    in_flight = 0

    async def dispatcher() -> None:
        while True:
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                at, i = heapq.heappop(heap)
                if at >= end:
                    heap.clear()
                    return
                ready.put_nowait(i)
            if now >= end:
                return
            # An empty heap is every node queued or in flight (the server behind): wait.
            await asyncio.sleep(min(0.01, max(0.0, heap[0][0] - now)) if heap else 0.01)

    async def worker(conn: RawConnection) -> None:
        nonlocal in_flight
        while True:
            i = await ready.get()
            in_flight += 1
            seq = res.acked_seq[i] + 1
            body = makers[i].body(seq, first=seq == 1)
            t0 = time.perf_counter()
            measured = due[i] >= job.start_at  # inside the window, not the warm-up
            if measured:
                res.lags_ms.append(max(0.0, time.monotonic() - due[i]) * 1000.0)
                res.sent += 1
            try:
                status, accepted = await conn.post(i, body)
            except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
                status, accepted = type(exc).__name__, 0
            if measured:
                res.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
            if status == "200":
                res.acked_seq[i] = seq
                if accepted:
                    res.stored_acks[i] += 1
                    res.window_stored += measured
                elif retrying[i]:
                    res.retry_duplicates += 1
                else:
                    res.fresh_duplicates += 1
                retrying[i] = False
            else:
                errors[status] += 1
                retrying[i] = True
            due[i] += job.interval_s
            heapq.heappush(heap, (due[i], i))
            in_flight -= 1

    conns = [
        RawConnection(job.urls[j % len(job.urls)], auth=auth, timeout_s=30.0)
        for j in range(job.connections)
    ]
    await asyncio.sleep(max(0.0, first - time.monotonic()))
    c0 = time.process_time()
    workers = [asyncio.create_task(worker(c)) for c in conns]
    try:
        await dispatcher()
        drain_until = time.monotonic() + job.drain_s
        while (in_flight or not ready.empty()) and time.monotonic() < drain_until:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        res.unfinished = in_flight + ready.qsize()
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for c in conns:
            c.close()
    res.cpu_s = time.process_time() - c0
    res.errors = dict(errors)
    return res


@dataclass
class LoopFigures:
    loop: str
    interval_s: float
    passes: int  # passes run (ok + failed), all replicas
    failed: int
    mean_pass_s: float
    mean_lag_s: float
    slow_passes: int  # passes longer than the interval (from the histogram's buckets)
    late_starts: int  # passes that started more than the interval late


@dataclass
class FleetResult:
    servers: int
    interval_s: float
    duration_s: float
    wall_s: float
    sent: int
    stored: int
    retry_duplicates: int
    fresh_duplicates: int
    errors: dict[str, int]
    unfinished: int
    latencies_ms: list[float]
    lags_ms: list[float]
    nodes: int
    nodes_checked: int
    seq_mismatch: int  # nodes whose stored last_report_seq is not the last acked seq
    seq_gaps: int  # nodes with fewer stored acks than seqs acked (a report not stored)
    never_reported: int
    marked_unknown: int  # node.health events to "unknown" in the window (stale nodes)
    unknown_at_end: int  # nodes whose health is unknown after the run
    loops: list[LoopFigures]
    cpu: CpuUse
    client_cpu: float


def _histogram_share(text: str, name: str, loop: str, limit: float) -> int:
    """Observations above ``limit`` in a Prometheus histogram (the count less the
    largest bucket at or below the limit)."""
    best, total = 0.0, 0.0
    for line in text.splitlines():
        if line.startswith(f'{name}_count{{loop="{loop}"}}'):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_bucket{{") and f'loop="{loop}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            if le != "+Inf" and float(le) <= limit:
                best = max(best, float(line.rsplit(" ", 1)[1]))
    return int(total - best)


def loop_figures(texts: list[str]) -> list[LoopFigures]:
    """Each background loop's passes, summed over the replicas' /metrics."""
    sums: dict[tuple[str, str], float] = {}
    intervals: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            if line.startswith("#") or "loop=" not in line:
                continue
            name, _, value = line.rpartition(" ")
            metric = name.split("{", 1)[0]
            loop = name.split('loop="', 1)[1].split('"', 1)[0]
            if metric == "gpufleet_loop_interval_seconds":
                intervals[loop] = float(value)
            elif metric == "gpufleet_loop_passes_total":
                result = name.split('result="', 1)[1].split('"', 1)[0]
                key = (loop, f"passes_{result}")
                sums[key] = sums.get(key, 0.0) + float(value)
            elif metric.endswith(("_sum", "_count")) and metric.startswith(
                ("gpufleet_loop_pass_duration_seconds", "gpufleet_loop_lag_seconds")
            ):
                sums[(loop, metric)] = sums.get((loop, metric), 0.0) + float(value)
    out: list[LoopFigures] = []
    for loop in sorted(intervals):
        interval = intervals[loop]

        def get(key: str, loop: str = loop) -> float:
            return sums.get((loop, key), 0.0)

        count = get("gpufleet_loop_pass_duration_seconds_count")
        lag_n = get("gpufleet_loop_lag_seconds_count")
        if not count:
            continue
        out.append(
            LoopFigures(
                loop=loop,
                interval_s=interval,
                passes=int(get("passes_ok") + get("passes_failed")),
                failed=int(get("passes_failed")),
                mean_pass_s=get("gpufleet_loop_pass_duration_seconds_sum") / count,
                mean_lag_s=get("gpufleet_loop_lag_seconds_sum") / lag_n if lag_n else 0.0,
                slow_passes=sum(
                    _histogram_share(t, "gpufleet_loop_pass_duration_seconds", loop, interval)
                    for t in texts
                ),
                late_starts=sum(
                    _histogram_share(t, "gpufleet_loop_lag_seconds", loop, interval) for t in texts
                ),
            )
        )
    return out


def metrics_delta(before: str, after: str) -> str:
    """``after`` less ``before``, sample by sample (counters and histogram series only
    grow): the passes run inside the window, not since the server started."""
    old: dict[str, float] = {}
    for line in before.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                old[name] = float(value)
    out: list[str] = []
    for line in after.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                keep = name.startswith("gpufleet_loop_interval_seconds")  # a gauge
                out.append(f"{name} {float(value) - (0.0 if keep else old.get(name, 0.0))}")
    return "\n".join(out)


async def scrape_metrics(urls: tuple[str, ...], token: str) -> list[str]:
    texts: list[str] = []
    async with httpx.AsyncClient(timeout=30.0) as client:
        for url in urls:
            r = await client.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"})
            texts.append(r.text if r.status_code == 200 else "")
    return texts


async def stored_seqs(db_url: str | None, sqlite_file: Path) -> dict[str, int]:
    """hostname → last_report_seq, read straight from the store after the run."""
    if db_url is not None:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        conn = await asyncpg.connect(pg_plain_url(db_url))
        try:
            rows = await conn.fetch("SELECT hostname, last_report_seq FROM node")
        finally:
            await conn.close()
        return {r["hostname"]: int(r["last_report_seq"]) for r in rows if r["hostname"]}
    import aiosqlite

    async with aiosqlite.connect(sqlite_file) as db:
        cur = await db.execute("SELECT hostname, last_report_seq FROM node")
        return {h: int(s) for h, s in await cur.fetchall() if h}


async def count_unknown_nodes(db_url: str | None, sqlite_file: Path) -> int:
    query = "SELECT count(*) FROM node WHERE health = 'unknown'"
    if db_url is not None:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        conn = await asyncpg.connect(pg_plain_url(db_url))
        try:
            return int(await conn.fetchval(query))
        finally:
            await conn.close()
    import aiosqlite

    async with aiosqlite.connect(sqlite_file) as db:
        cur = await db.execute(query)
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def count_marked_unknown(db_url: str | None, sqlite_file: Path, since: dt.datetime) -> int:
    query = "SELECT count(*) FROM event WHERE kind = 'node.health' AND message LIKE '%→ unknown%'"
    if db_url is not None:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        conn = await asyncpg.connect(pg_plain_url(db_url))
        try:
            return int(await conn.fetchval(query + " AND ts >= $1", since))
        finally:
            await conn.close()
    import aiosqlite

    async with aiosqlite.connect(sqlite_file) as db:
        cur = await db.execute(query + " AND ts >= ?", (since.replace(tzinfo=None).isoformat(" "),))
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def run_fleet(
    args: argparse.Namespace,
    *,
    urls: tuple[str, ...],
    specs: list[NodeSpec],
    server_pids: list[int],
    db_url: str | None,
    data_dir: Path,
) -> FleetResult:
    sqlite_file = data_dir / "gpufleet.db"
    procs = args.client_procs
    print(
        f"fleet: {len(specs):,} nodes, one report each per {args.interval:g} s "
        f"(≈ {len(specs) / args.interval:,.0f}/s) for {args.duration:g} s, over {len(urls)} "
        f"server process(es), {args.concurrency} connections from {procs} client process(es)",
        flush=True,
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    warmup = 2 * args.interval + args.warmup
    # The clients build their bodies first (about 1 ms a node), then the warm-up.
    start_at = time.monotonic() + 10.0 + len(specs) / 1000.0 + warmup
    jobs = [
        FleetJob(
            index=k,
            urls=urls,
            nodes=specs[k::procs],
            connections=max(1, args.concurrency // procs),
            seed=1000 * k,
            interval_s=args.interval,
            start_at=start_at,
            duration_s=args.duration,
            warmup_s=warmup,
            drain_s=35.0,
        )
        for k in range(procs)
    ]
    workers = [ctx.Process(target=fleet_client_process, args=(j, out), daemon=True) for j in jobs]
    results: list[FleetClientResult] = []
    token = (data_dir / "owner-token").read_text().strip()
    try:
        for w in workers:
            w.start()
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        since = dt.datetime.now(dt.UTC)
        before = await scrape_metrics(urls, token)
        pids = [w.pid for w in workers if w.pid is not None]
        cpu_a = CpuSnapshot.take(server_pids[0], pids, more_server_pids=server_pids[1:])
        t0 = time.monotonic()
        await asyncio.sleep(args.duration)
        cpu_b = CpuSnapshot.take(server_pids[0], pids, more_server_pids=server_pids[1:])
        deadline = time.monotonic() + 120.0
        while len(results) < procs:
            kind, idx, payload = await asyncio.to_thread(
                _get, out, deadline, workers, threading.Event()
            )
            if kind == "error":
                raise RuntimeError(f"fleet client {idx} failed: {payload}")
            results.append(payload)
        wall = time.monotonic() - t0
    finally:
        for w in workers:
            w.join(timeout=5.0)
            if w.is_alive():
                w.terminate()
    texts = [
        metrics_delta(b, a) for b, a in zip(before, await scrape_metrics(urls, token), strict=True)
    ]
    stored = await stored_seqs(db_url, sqlite_file)
    acked: dict[str, tuple[int, int]] = {}
    for r in results:
        for host, seq, n_stored in zip(r.hostnames, r.acked_seq, r.stored_acks, strict=True):
            acked[host] = (seq, n_stored)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r.errors)
    return FleetResult(
        servers=len(urls),
        interval_s=args.interval,
        duration_s=args.duration,
        wall_s=wall,
        sent=sum(r.sent for r in results),
        stored=sum(r.window_stored for r in results),
        retry_duplicates=sum(r.retry_duplicates for r in results),
        fresh_duplicates=sum(r.fresh_duplicates for r in results),
        errors=dict(errors),
        unfinished=sum(r.unfinished for r in results),
        latencies_ms=sorted(x for r in results for x in r.latencies_ms),
        lags_ms=sorted(x for r in results for x in r.lags_ms),
        nodes=len(specs),
        nodes_checked=sum(1 for h in acked if h in stored),
        seq_mismatch=sum(1 for h, (seq, _) in acked.items() if stored.get(h) != seq),
        seq_gaps=sum(1 for seq, n_stored in acked.values() if n_stored != seq),
        never_reported=sum(1 for seq, _ in acked.values() if seq == 0),
        marked_unknown=await count_marked_unknown(db_url, sqlite_file, since),
        unknown_at_end=await count_unknown_nodes(db_url, sqlite_file),
        loops=loop_figures(texts),
        cpu=CpuUse.between(cpu_a, cpu_b),
        client_cpu=sum(r.cpu_s for r in results) / max(wall, 1e-9),
    )


def print_fleet(run: DbRun) -> None:
    f = run.fleet
    assert f is not None
    lat, lag = f.latencies_ms, f.lags_ms
    errs = ", ".join(f"{k}×{v}" for k, v in sorted(f.errors.items())) or "none"
    print()
    for line in machine_lines():
        print(line)
    print(f"{run.db}: {run.version}; {f.nodes:,} nodes provisioned in {run.provision_s:.0f} s")
    print(
        f"fleet ({run.db}, {f.servers} server process(es)), after a warm-up of every node "
        f"reporting: {f.sent:,} reports sent in "
        f"{f.duration_s:g} s = {f.sent / f.duration_s:,.0f}/s (target "
        f"{f.nodes / f.interval_s:,.0f}/s); stored {f.stored:,}; errors {errs}; "
        f"unfinished at the end {f.unfinished}"
    )
    if lat:
        print(
            f"latency ms: p50 {percentile(lat, 50):.1f}, p99 {percentile(lat, 99):.1f}, "
            f"max {lat[-1]:.1f}; send lag behind schedule ms: p50 {percentile(lag, 50):.1f}, "
            f"p99 {percentile(lag, 99):.1f}, max {lag[-1]:.1f}"
        )
    ok = (
        f.seq_mismatch == 0
        and f.seq_gaps == 0
        and f.fresh_duplicates == 0
        and f.never_reported == 0
        and f.nodes_checked == f.nodes
        and f.marked_unknown == 0
        and f.unknown_at_end == 0
    )
    print(
        f"store check: {f.nodes_checked:,}/{f.nodes:,} nodes compared; stored seq ≠ last acked: "
        f"{f.seq_mismatch}; seq gaps (acked but not stored): {f.seq_gaps}; duplicates stored "
        f"as new: 0 by construction, fresh seqs acked as duplicates: {f.fresh_duplicates}; "
        f"resent after an error and acked as duplicate (correct): {f.retry_duplicates}; "
        f"nodes that never reported: {f.never_reported}; nodes marked unknown in the "
        f"window: {f.marked_unknown}, unknown at the end: {f.unknown_at_end} "
        f"→ {'OK' if ok else 'FAILED'}"
    )
    print("background loops (all replicas): loop | interval s | passes | failed | mean pass s "
          "| mean lag s | passes > interval | starts > interval late")  # fmt: skip
    for lf in f.loops:
        print(
            f"  {lf.loop} | {lf.interval_s:g} | {lf.passes} | {lf.failed} | "
            f"{lf.mean_pass_s:.3f} | {lf.mean_lag_s:.3f} | {lf.slow_passes} | {lf.late_starts}"
        )
    cpu = f.cpu
    print(
        f"CPU in cores: server(s) {cpu.server:.2f}, postgres {cpu.postgres:.2f}, clients "
        f"{cpu.clients:.2f}, other {cpu.other:.2f}; machine busy {cpu.machine:.2f} of "
        f"{cpu.machine_cores:.0f}; machine busy before the run {run.idle_busy_cores:.2f}"
    )


# -- one database, end to end ----------------------------------------------------------------


@dataclass
class DbRun:
    db: str
    servers: int = 1  # server processes the load was spread over
    version: str = ""
    nodes: int = 0
    provision_s: float = 0.0
    load: LoadResult | None = None
    baseline: BaselineResult | None = None
    group_failures: int = 0
    idle_busy_cores: float = 0.0  # machine busy before this run started (should be ~0)
    error: str | None = None
    fleet: FleetResult | None = None  # --interval: the paced fleet run and its checks


SEQ_STEP = 10_000_000  # each load run's seqs start this far above the previous run's


def _warn_if_busy(db: str, busy: float) -> None:
    if busy > 0.15:
        print(
            f"[{db}] WARNING: the machine is already {busy:.2f} cores busy "
            "before the run; figures will be low (see 'other' CPU below)",
            file=sys.stderr,
            flush=True,
        )


async def bench_one(db: str, args: argparse.Namespace) -> list[DbRun]:
    """One database: the fleet, then a load run per entry of ``--servers`` (server
    processes on the same store, agents spread over them), then the baselines."""
    runs: list[DbRun] = []
    first = DbRun(db=db)
    tmp = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-{db}-"))
    pg_name: str | None = None
    servers: list[ServerProcess] = []
    current = first
    try:
        first.idle_busy_cores = await asyncio.to_thread(idle_busy_cores)
        _warn_if_busy(db, first.idle_busy_cores)
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
            version = (await pg_server_version(db_url)).split(" on ")[0]
            first.version = f"{version}, autovacuum {await pg_setting(db_url, 'autovacuum')}"
        else:
            first.version = sqlite_versions()
        servers.append(ServerProcess(data_dir=tmp / "data", env_overrides=env))
        servers[0].start()
        owner = await asyncio.to_thread(servers[0].wait_ready, timeout_s=60.0)
        t0 = time.monotonic()
        cluster_ids = await create_fleet(
            servers[0].url, owner, nodes=args.nodes, timeout_s=args.provision_timeout
        )
        first.provision_s = time.monotonic() - t0
        specs = await asyncio.to_thread(
            load_node_specs, servers[0].data_dir / "sim-world.json", cluster_ids
        )
        first.nodes = len(specs)
        check_bodies(specs[0])
        print(f"[{db}] {first.nodes} nodes ready in {first.provision_s:.1f} s", flush=True)
        counts = [max(args.servers)] if args.interval else args.servers
        for k, count in enumerate(counts):
            current = first if k == 0 else DbRun(db=db, version=first.version)
            current.servers, current.nodes = count, first.nodes
            current.provision_s = first.provision_s
            if k:
                current.idle_busy_cores = first.idle_busy_cores
            runs.append(current)
            while len(servers) < count:  # a replica: same store and data dir, own log
                i = len(servers)
                replica = ServerProcess(
                    data_dir=servers[0].data_dir,
                    env_overrides={**env, "GPUFLEET_REPLICA_ID": f"bench-{db}-{i}"},
                    log_name=f"server-{i}.log",
                )
                servers.append(replica)
                replica.start()
                await asyncio.to_thread(replica.wait_ready, timeout_s=60.0)
            used = servers[:count]
            urls = tuple(sv.url for sv in used)
            pids = [sv.pid for sv in used if sv.pid is not None]
            if args.interval:
                current.fleet = await run_fleet(
                    args, urls=urls, specs=specs, server_pids=pids, db_url=db_url,
                    data_dir=servers[0].data_dir,
                )  # fmt: skip
                print_fleet(current)
                return runs
            print(
                f"[{db}] {count} server process(es); load: {args.client_procs} {args.client} "
                f"client process(es), {args.concurrency} in flight, warm-up = one report per "
                f"node + {args.warmup:g} s, then {args.duration:g} s",
                flush=True,
            )
            stop = threading.Event()
            load_call = asyncio.to_thread(
                run_load,
                urls=urls,
                nodes=specs,
                server_pids=pids,
                seq_base=k * SEQ_STEP,
                concurrency=args.concurrency,
                procs=args.client_procs,
                client=args.client,
                warmup_s=args.warmup,
                duration_s=args.duration,
                stop=stop,
            )
            try:
                current.load = await load_call
            except asyncio.CancelledError:
                stop.set()  # the thread stops its client processes and returns at once
                raise
            print(
                f"[{db}] {count} server process(es): {current.load.reports_s:,.0f} reports/s",
                flush=True,
            )
            current.group_failures = sum(
                sv.count_log(r"failed; retrying each batch alone") for sv in used
            )
        # Stop the servers first: the baseline gets the machine to itself, as the server
        # did (minus the load generator), and the database sees no other writer.
        for sv in servers:
            await asyncio.to_thread(sv.stop)
        rows = BaselineRows.build(specs)
        batch = args.baseline_batch or args.concurrency
        if db == "postgres":
            assert db_url is not None
            baseline = await pg_baseline(
                db_url, rows, duration_s=args.baseline_duration, batch=batch
            )
        else:
            baseline = await sqlite_baseline(
                servers[0].data_dir / "gpufleet.db",
                rows,
                duration_s=args.baseline_duration,
                batch=batch,
            )
        for run in runs:
            run.baseline = baseline
        print(
            f"[{db}] baseline: {baseline.per_report_txn:,.0f} reports/s one txn per report, "
            f"{baseline.batched:,.0f} reports/s {batch} per txn",
            flush=True,
        )
    except Exception as exc:  # noqa: BLE001 - report it, clean up, go on with the next db
        current.error = f"{type(exc).__name__}: {exc}"
        if current not in runs:
            runs.append(current)
        print(f"[{db}] FAILED: {current.error}", file=sys.stderr, flush=True)
        for sv in servers:
            print(sv.log_tail(), file=sys.stderr, flush=True)
    finally:
        for sv in servers:
            await asyncio.to_thread(sv.stop)
        if pg_name is not None:
            try:
                await pg_drop_database(args.pg_url, pg_name)
            except Exception as exc:  # noqa: BLE001 - say so; the run itself is over
                print(f"[{db}] could not drop database {pg_name}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


# -- output ----------------------------------------------------------------------------------


def print_report(runs: list[DbRun], args: argparse.Namespace) -> None:
    print()
    for line in machine_lines():
        print(line)
    for run in {r.db: r for r in runs}.values():
        print(f"{run.db}: {run.version or '?'}")
    print(
        f"load: {args.nodes} nodes, {GPUS_PER_NODE} GPUs each, 1 report per request, "
        f"{args.concurrency} requests in flight from {args.client_procs} {args.client} "
        f"client process(es) spread over each run's server process(es), "
        f"{args.duration:g} s measured after warm-up"
    )
    print()
    headers = [
        "db",
        "servers",
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
            table.append([run.db, str(run.servers), "FAILED", "", "", "", "", target])
            continue
        load, base = run.load, run.baseline
        lat = load.latencies_ms if load else []
        table.append(
            [
                run.db,
                str(run.servers),
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
        name = f"{run.db} ×{run.servers}"
        errs = ", ".join(f"{k}×{v}" for k, v in sorted(load.errors.items())) or "none"
        print(
            f"{name}: {load.ok:,} acks in {load.duration_s:g} s, errors {errs}, "
            f"acks with accepted=0: {load.not_accepted}, errors outside the window: "
            f"{load.errors_outside}, group retries logged: {run.group_failures}; "
            f"p90 {percentile(load.latencies_ms, 90):.1f} ms, "
            f"max {load.latencies_ms[-1] if load.latencies_ms else float('nan'):.1f} ms; "
            f"provisioning {run.provision_s:.1f} s, first pass {load.first_pass_s:.1f} s"
        )
        print(f"{name}: machine busy before the run: {run.idle_busy_cores:.2f} cores")
        print(
            f"{name}: CPU in cores: server(s) {cpu.server:.2f}, postgres {cpu.postgres:.2f}, "
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
    p.add_argument(
        "--servers",
        default="1,2",
        help="server processes per load run, comma-separated (default 1,2: one run with one "
        "process, one with two on the same store; agents spread over them)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="fleet mode: every node reports once per INTERVAL s (not as fast as possible) for "
        "--duration s, over the last --servers count; then checks the store (no seq gaps or "
        "duplicates) and the background loops' lag",
    )
    args = p.parse_args(argv)
    try:
        args.servers = [int(x) for x in str(args.servers).split(",") if x.strip()]
    except ValueError:
        p.error("--servers takes counts like 1,2")
    if not args.servers or min(args.servers) < 1 or args.interval < 0:
        p.error("--servers counts must be positive, --interval not negative")
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
        runs.extend(await bench_one(db, args))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = asyncio.run(amain(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; server stopped and scratch databases dropped", file=sys.stderr)
        return 130
    if not args.interval:
        print_report(runs, args)
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
