"""Node repair: the controller's overhead from approval to the action starting, and the
reconciler's throughput with many repairs in flight at once.

    python bench/repair.py [--db sqlite|postgres|both] [--nodes 200] [--samples 20]
                           [--pg-url postgresql://postgres@127.0.0.1:5432/test]

For each database: a fresh store (PostgreSQL: CREATE DATABASE gpufleet_bench_<random>,
dropped at the end; SQLite: a temp dir), the real app in this process (lifespan, the
in-process ASGI client authenticated as the owner, ``run_workers=False``), a sim cluster
of ``--nodes + --samples + 1`` nodes with no jobs and no sim faults, reboots that take no
time, and a project policy that lets every node be out at once (``breaker_max_share=1``,
``incident_min_nodes=10000``, ``verify_settle_s=0``). Each of the first
``--nodes + --samples`` nodes gets one open ``xid-79`` finding (a row written directly, as
the agent-findings path would store it), and one pass of the repair planner proposes a
reboot for each. The loops are driven here with ``run_once()``, back to back.

1. Throughput: approve ``--nodes`` repairs through the API, then run the executor pass
   after pass until every one is ``verifying`` (reboot asked, machine back), post one
   agent report per node through the real ingest API (not timed), and run it again until
   every one has ``succeeded``. Baseline on the same database: as many transactions as
   the executor wrote ``repair.status`` events, each an UPDATE of a repair row, an event
   INSERT and an audit INSERT (the rows ``switch_repair_status`` writes), one at a time.
2. Overhead: for ``--samples`` further repairs, one at a time (the others stay proposed):
   approve through the API, then run executor passes until the sim provider's ``reboot``
   is called (a wrapper records ``perf_counter()`` on entry). Baseline: a direct
   ``await provider.reboot()`` on the spare node.

Timings are printed, never asserted. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select, update

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CpuSnapshot,
    CpuUse,
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
from gpufleet.core.enums import EventKind, RepairStatus
from gpufleet.core.ids import new_id
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import AuditLogRow, EventRow, FindingRow, NodeRow, RepairRow
from gpufleet.server.settings import ServerSettings
from gpufleet.server.workers.repairs.executor import RepairExecutor
from gpufleet.server.workers.repairs.planner import RepairPlanner
from gpufleet.sim.models import USER_DATA_TOKEN, SimInstanceState
from gpufleet.testing.app import RunningApp, make_settings, running_app
from ingest import BodyMaker, NodeSpec

GPUS_PER_NODE = 8
SIGNATURE = "xid-79"  # catalog: fatal, kernel-log, action reboot, clears on repair
PROJECT = "bench"
POLICY: dict[str, Any] = {
    "breaker_max_share": 1.0,  # every node may be out at once: nothing holds a repair back
    "incident_min_nodes": 10_000,  # 200 nodes failing together stay 200 node repairs
    "verify_settle_s": 0.0,  # verified on the first clean report after the action
    "verify_timeout_s": 3600.0,
}
# The executor's steps in flight: RepairExecutor's default (build_loops passes none).
EXECUTOR_CONCURRENCY = int(inspect.signature(RepairExecutor).parameters["concurrency"].default)
REPORT_CONCURRENCY = 16  # agent reports in flight while the nodes report back (not timed)


# -- results ---------------------------------------------------------------------------------


@dataclass
class Phase:
    """Executor passes run back to back; only the passes themselves are timed."""

    passes: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process: the whole server (event loop + driver threads)
    other_cpu_s: float = 0.0  # the rest of the machine: PostgreSQL, the kernel, others
    pass_ms: list[float] = field(default_factory=list)


@dataclass
class Throughput:
    repairs: int = 0
    approve_s: float = 0.0
    to_verifying: Phase = field(default_factory=Phase)
    reports_s: float = 0.0
    reports: int = 0
    to_succeeded: Phase = field(default_factory=Phase)
    steps: int = 0
    events: Counter[str] = field(default_factory=Counter)
    audit_rows: int = 0
    outcome: Counter[str] = field(default_factory=Counter)

    @property
    def wall_s(self) -> float:
        return self.to_verifying.wall_s + self.to_succeeded.wall_s

    @property
    def passes(self) -> int:
        return self.to_verifying.passes + self.to_succeeded.passes

    @property
    def transitions(self) -> int:
        return self.events[EventKind.REPAIR_STATUS.value]


@dataclass
class Overhead:
    approve_ms: list[float] = field(default_factory=list)  # the approve call alone
    to_action_ms: list[float] = field(default_factory=list)  # before approve → reboot entered
    passes: list[int] = field(default_factory=list)
    pass_ms: list[float] = field(default_factory=list)  # each executor pass, one repair active
    direct_reboot_ms: list[float] = field(default_factory=list)  # baseline


@dataclass
class RawBaseline:
    transactions: int = 0
    serial_s: float = 0.0  # one transaction at a time
    concurrent_s: float = 0.0  # ``concurrency`` in flight, as the executor runs its steps
    concurrency: int = 0

    @property
    def serial_per_s(self) -> float:
        return self.transactions / self.serial_s if self.serial_s else 0.0

    @property
    def concurrent_per_s(self) -> float:
        return self.transactions / self.concurrent_s if self.concurrent_s else 0.0


@dataclass
class DbRun:
    db: str
    version: str = ""
    nodes_total: int = 0
    provision_s: float = 0.0
    planner_ms: float = 0.0
    proposals: Counter[str] = field(default_factory=Counter)
    throughput: Throughput | None = None
    raw: RawBaseline | None = None
    overhead: Overhead | None = None
    errors_logged: list[str] = field(default_factory=list)
    idle_busy_cores: float = 0.0  # machine busy before this run started (should be ~0)
    error: str | None = None


# -- helpers ---------------------------------------------------------------------------------


class ErrorLog(logging.Handler):
    """Keeps what gpufleet logs at ERROR (a failed step is logged, not raised)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f": {record.exc_info[1]!r}"
        self.messages.append(text)


@contextlib.contextmanager
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    logger = logging.getLogger("gpufleet")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class RebootRecorder:
    """Wraps the sim provider's ``reboot``: when each machine's reboot was entered."""

    def __init__(self, provider: SimProvider) -> None:
        self._provider = provider
        self.original: Callable[[str], Awaitable[None]] = provider.reboot
        self.entered: dict[str, float] = {}
        provider.reboot = self._reboot  # type: ignore[method-assign]

    async def _reboot(self, instance_id: str) -> None:
        self.entered.setdefault(instance_id, time.perf_counter())
        await self.original(instance_id)

    def restore(self) -> None:
        del self._provider.reboot  # the instance attribute; the method shows again


class CpuMeter:
    """CPU of this process, and of the rest of the machine, over the timed parts only.

    The rest is the machine's busy time less this process's, not a sum over ``postgres``
    processes: the engine's pool opens and closes overflow connections during a pass,
    and a backend that exits between two readings would take its CPU with it.
    """

    def __init__(self) -> None:
        self._a: CpuSnapshot | None = None

    def start(self) -> None:
        self._a = CpuSnapshot.take(None)

    def stop(self, phase: Phase) -> None:
        assert self._a is not None
        b = CpuSnapshot.take(None)
        mine = b.bench_s - self._a.bench_s
        phase.cpu_s += mine
        phase.other_cpu_s += max(0.0, (b.machine_busy_s - self._a.machine_busy_s) - mine)
        self._a = None


def idle_busy_cores(seconds: float = 1.0) -> float:
    """How busy the machine is with nothing of ours running (other users' processes)."""
    a = CpuSnapshot.take(None)
    time.sleep(seconds)
    return CpuUse.between(a, CpuSnapshot.take(None)).machine


def stats(values: list[float]) -> str:
    s = sorted(values)
    if not s:
        return "n/a"
    return (
        f"p50 {percentile(s, 50):8.2f}  p95 {percentile(s, 95):8.2f}  max {s[-1]:8.2f}  "
        f"(n={len(s)})"
    )


async def event_counts(db: Database) -> tuple[Counter[str], int]:
    async with db.session() as session:
        rows = (
            await session.execute(select(EventRow.kind, func.count()).group_by(EventRow.kind))
        ).all()
        audit = int(await session.scalar(select(func.count()).select_from(AuditLogRow)) or 0)
    return Counter({str(kind): int(n) for kind, n in rows}), audit


async def statuses(db: Database, repair_ids: list[str]) -> Counter[str]:
    async with db.session() as session:
        rows = (
            await session.execute(
                select(RepairRow.status, func.count())
                .where(RepairRow.id.in_(repair_ids))
                .group_by(RepairRow.status)
            )
        ).all()
    return Counter({str(status): int(n) for status, n in rows})


async def run_passes(
    executor: RepairExecutor,
    db: Database,
    repair_ids: list[str],
    *,
    until: frozenset[str],
    max_passes: int,
    cpu: CpuMeter,
) -> Phase:
    """Executor passes back to back until every repair's status is in ``until``."""
    phase = Phase()
    while True:
        now = await statuses(db, repair_ids)
        if sum(n for s, n in now.items() if s in until) == len(repair_ids):
            return phase
        if phase.passes >= max_passes:
            raise RuntimeError(
                f"repairs not {'/'.join(sorted(until))} after {max_passes} executor passes: "
                + ", ".join(f"{s} {n}" for s, n in sorted(now.items()))
            )
        cpu.start()
        t0 = time.perf_counter()
        await executor.run_once()
        took = time.perf_counter() - t0
        cpu.stop(phase)
        phase.passes += 1
        phase.wall_s += took
        phase.pass_ms.append(took * 1000.0)


async def approve(app: RunningApp, repair_id: str) -> None:
    r = await app.client.post(f"/api/v1/repairs/{repair_id}/approve", json={"reason": "bench"})
    if r.status_code != 200:
        raise RuntimeError(f"approve {repair_id}: HTTP {r.status_code}: {r.text}")


# -- set-up ----------------------------------------------------------------------------------


async def build_fleet(app: RunningApp, *, size: int, timeout_s: float) -> tuple[str, list[NodeRow]]:
    """Project, policy, one cluster of ``size`` sim nodes, provisioned until ready."""
    r = await app.client.post("/api/v1/projects", json={"name": PROJECT})
    r.raise_for_status()
    r = await app.client.put(f"/api/v1/projects/{PROJECT}/repair-policy", json=POLICY)
    r.raise_for_status()
    r = await app.client.post(
        "/api/v1/clusters",
        json={
            "project": PROJECT,
            "name": "fleet",
            "size": size,
            "gpus_per_node": GPUS_PER_NODE,
            "acceptance_tests": False,  # measured here: repairs, not acceptance
        },
    )
    r.raise_for_status()
    cluster_id = str(r.json()["id"])
    loops = build_loops(app.ctx)
    deadline = time.monotonic() + timeout_s
    status = ""
    while time.monotonic() < deadline:
        for loop in loops[:2]:  # provisioning, health (the repair loops are driven later)
            await loop.run_once()
        r = await app.client.get(f"/api/v1/clusters/{cluster_id}/status")
        r.raise_for_status()
        status = str(r.json()["status"])
        if status == "ready":
            break
    else:
        raise RuntimeError(f"cluster not ready after {timeout_s:.0f} s (status {status!r})")
    async with app.ctx.db.session() as session:
        nodes = list(
            await session.scalars(
                select(NodeRow).where(NodeRow.cluster_id == cluster_id).order_by(NodeRow.name)
            )
        )
    return cluster_id, nodes


async def add_findings(db: Database, *, cluster_id: str, nodes: list[NodeRow]) -> None:
    """One open xid-79 per node, the row the agent-findings path stores (one transaction)."""
    now = dt.datetime.now(dt.UTC)
    async with db.transaction() as session:
        for node in nodes:
            session.add(
                FindingRow(
                    id=new_id(),
                    cluster_id=cluster_id,
                    node_id=node.id,
                    gpu_uuid=None,
                    signature_id=SIGNATURE,
                    title="GPU has fallen off the bus",
                    severity="fatal",
                    source="kernel-log",
                    evidence="NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
                    count=1,
                    first_seen=now,
                    last_seen=now,
                    cleared_at=None,
                )
            )


def node_specs(provider: SimProvider, cluster_id: str) -> dict[str, NodeSpec]:
    """Node name → what its agent knows (token, GPUs), from the sim world."""
    return {
        i.node_name: NodeSpec(
            token=i.user_data[USER_DATA_TOKEN],
            hostname=i.hostname,
            serial=i.serial,
            gpu_model=i.gpu_model,
            gpus=tuple((g.index, g.uuid, g.serial) for g in i.gpus),
        )
        for i in provider.world.list_instances(cluster_id=cluster_id)
        if i.state is SimInstanceState.RUNNING and USER_DATA_TOKEN in i.user_data
    }


async def report_once(app: RunningApp, specs: list[NodeSpec]) -> None:
    """One ReportBatch per node (its first: identity + 8 GPUs) through the agent API."""
    limit = asyncio.Semaphore(REPORT_CONCURRENCY)

    async def one(client: Any, k: int, spec: NodeSpec) -> None:
        body = BodyMaker(spec, seed=k).body(1, first=True)
        async with limit:
            r = await client.post(
                "/api/v1/agent/reports",
                content=body,
                headers={
                    "authorization": f"Bearer {spec.token}",
                    "content-type": "application/json",
                },
            )
        if r.status_code != 200 or int(r.json()["accepted"]) != 1:
            raise RuntimeError(f"report of {spec.hostname}: HTTP {r.status_code}: {r.text}")

    async with app.anonymous() as client:
        await asyncio.gather(*(one(client, k, s) for k, s in enumerate(specs)))


# -- the measurements ------------------------------------------------------------------------


async def measure_throughput(
    app: RunningApp,
    executor: RepairExecutor,
    *,
    repairs: dict[str, str],  # repair id → node name
    specs: dict[str, NodeSpec],
    max_passes: int,
    cpu: CpuMeter,
) -> Throughput:
    db = app.ctx.db
    ids = sorted(repairs)
    out = Throughput(repairs=len(ids))
    t0 = time.perf_counter()
    for repair_id in ids:
        await approve(app, repair_id)
    out.approve_s = time.perf_counter() - t0
    before, audit_before = await event_counts(db)
    steps_before = executor.steps
    verifying = frozenset(
        {RepairStatus.VERIFYING.value, RepairStatus.SUCCEEDED.value, RepairStatus.FAILED.value}
    )
    out.to_verifying = await run_passes(
        executor, db, ids, until=verifying, max_passes=max_passes, cpu=cpu
    )
    mid, audit_mid = await event_counts(db)
    # The nodes report back (the agents of the rebooted machines): not the executor's time.
    t0 = time.perf_counter()
    await report_once(app, [specs[repairs[i]] for i in ids])
    out.reports_s = time.perf_counter() - t0
    out.reports = len(ids)
    mid2, audit_mid2 = await event_counts(db)
    ended = frozenset({RepairStatus.SUCCEEDED.value, RepairStatus.FAILED.value})
    out.to_succeeded = await run_passes(
        executor, db, ids, until=ended, max_passes=max_passes, cpu=cpu
    )
    after, audit_after = await event_counts(db)
    out.steps = executor.steps - steps_before
    out.events = (mid - before) + (after - mid2)
    out.audit_rows = (audit_mid - audit_before) + (audit_after - audit_mid2)
    out.outcome = await statuses(db, ids)
    return out


async def measure_overhead(
    app: RunningApp,
    executor: RepairExecutor,
    provider: SimProvider,
    *,
    repairs: dict[str, str],  # repair id → node name
    instances: dict[str, str],  # node name → instance id
    specs: dict[str, NodeSpec],
    spare_instance: str,
    max_passes: int,
) -> Overhead:
    db = app.ctx.db
    out = Overhead()
    recorder = RebootRecorder(provider)
    try:
        for repair_id in sorted(repairs):
            instance_id = instances[repairs[repair_id]]
            t0 = time.perf_counter()
            await approve(app, repair_id)
            out.approve_ms.append((time.perf_counter() - t0) * 1000.0)
            passes = 0
            while instance_id not in recorder.entered:
                if passes >= max_passes:
                    raise RuntimeError(f"no reboot of {instance_id} after {max_passes} passes")
                p0 = time.perf_counter()
                await executor.run_once()
                out.pass_ms.append((time.perf_counter() - p0) * 1000.0)
                passes += 1
            out.to_action_ms.append((recorder.entered[instance_id] - t0) * 1000.0)
            out.passes.append(passes)
            # Finish it (not timed), so the next sample is the only active repair.
            quiet = CpuMeter()
            await run_passes(
                executor,
                db,
                [repair_id],
                until=frozenset({RepairStatus.VERIFYING.value, RepairStatus.FAILED.value}),
                max_passes=max_passes,
                cpu=quiet,
            )
            await report_once(app, [specs[repairs[repair_id]]])
            await run_passes(
                executor,
                db,
                [repair_id],
                until=frozenset({RepairStatus.SUCCEEDED.value, RepairStatus.FAILED.value}),
                max_passes=max_passes,
                cpu=quiet,
            )
        # Baseline: the action itself, asked for directly (the sim's world write included).
        for _ in range(len(repairs)):
            t0 = time.perf_counter()
            await recorder.original(spare_instance)
            out.direct_reboot_ms.append((time.perf_counter() - t0) * 1000.0)
    finally:
        recorder.restore()
    return out


async def raw_transition(db: Database, repair_id: str) -> None:
    """The rows one repair transition writes (``switch_repair_status``), in one
    transaction: UPDATE repair (status, detail, timestamps), INSERT event, INSERT audit."""
    now = dt.datetime.now(dt.UTC)
    detail = {"from": "succeeded", "to": "succeeded", "reason": "bench baseline"}
    async with db.transaction() as session:
        await session.execute(
            update(RepairRow)
            .where(RepairRow.id == repair_id)
            .values(
                status=RepairStatus.SUCCEEDED.value,
                detail="bench baseline",
                updated_at=now,
                step_started_at=now,
            )
        )
        await session.execute(
            insert(EventRow).values(
                id=new_id(),
                ts=now,
                kind="bench.baseline",
                message=f"repair {repair_id}: succeeded → succeeded: bench baseline",
                project_id=None,
                cluster_id=None,
                node_id=None,
                actor="system:bench",
                data=detail,
            )
        )
        await session.execute(
            insert(AuditLogRow).values(
                id=new_id(),
                ts=now,
                actor="system:bench",
                action="repair.status",
                object_type="repair",
                object_id=repair_id,
                project_id=None,
                source_ip=None,
                result="ok",
                detail=detail,
            )
        )


async def raw_transitions(
    db: Database, repair_ids: list[str], *, count: int, concurrency: int
) -> RawBaseline:
    """``count`` raw transitions over the (ended) repairs' rows: one at a time, then
    ``concurrency`` in flight through the same engine and pool."""
    out = RawBaseline(transactions=count, concurrency=concurrency)
    t0 = time.perf_counter()
    for k in range(count):
        await raw_transition(db, repair_ids[k % len(repair_ids)])
    out.serial_s = time.perf_counter() - t0
    limit = asyncio.Semaphore(concurrency)

    async def one(k: int) -> None:
        async with limit:
            await raw_transition(db, repair_ids[k % len(repair_ids)])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(count)))
    out.concurrent_s = time.perf_counter() - t0
    return out


# -- one database, end to end ----------------------------------------------------------------


async def bench_one(db_kind: str, args: argparse.Namespace) -> DbRun:
    run = DbRun(db=db_kind)
    tmp = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-repair-{db_kind}-"))
    pg_name: str | None = None
    try:
        run.idle_busy_cores = await asyncio.to_thread(idle_busy_cores)
        if run.idle_busy_cores > 0.15:
            print(
                f"[{db_kind}] WARNING: the machine is already {run.idle_busy_cores:.2f} cores "
                "busy before the run; figures will be low (see 'rest of the machine' below)",
                file=sys.stderr,
                flush=True,
            )
        with error_log() as errors:
            try:
                if db_kind == "postgres":
                    name = new_pg_database_name()
                    await pg_create_database(args.pg_url, name)
                    pg_name = name  # created: dropped in ``finally``
                    url = pg_url_with_database(args.pg_url, name)
                    run.version = (await pg_server_version(url)).split(" on ")[0]
                else:
                    url = f"sqlite+aiosqlite:///{tmp / 'data' / 'gpufleet.db'}"
                    run.version = sqlite_versions()
                await run_app(run, url=url, data_dir=tmp / "data", args=args)
            finally:
                run.errors_logged = list(errors.messages)
    except Exception as exc:  # noqa: BLE001 - report it, clean up, go on with the next db
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


async def run_app(run: DbRun, *, url: str, data_dir: Path, args: argparse.Namespace) -> None:
    db_kind = run.db
    settings = make_settings(
        data_dir=data_dir,
        database_url=url,
        replica_id=f"bench-repair-{db_kind}",
        sim_busy_share=(0.0, 0.0),
        sim_fault_rate_per_gpu_day=0.0,
        sim_reboot_delay_s=(0.0, 0.0),
        sim_provision_delay_s=(0.0, 0.0),
    )
    total = args.nodes + args.samples + 1
    async with running_app(settings) as app:
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        loops = build_loops(app.ctx)
        planner = next(loop for loop in loops if isinstance(loop, RepairPlanner))
        executor = next(loop for loop in loops if isinstance(loop, RepairExecutor))
        t0 = time.perf_counter()
        cluster_id, nodes = await build_fleet(app, size=total, timeout_s=args.provision_timeout)
        run.provision_s = time.perf_counter() - t0
        run.nodes_total = len(nodes)
        if len(nodes) != total:
            raise RuntimeError(f"expected {total} nodes, the cluster has {len(nodes)}")
        broken, spare = nodes[:-1], nodes[-1]
        await add_findings(app.ctx.db, cluster_id=cluster_id, nodes=broken)
        print(
            f"[{db_kind}] {total} nodes ready in {run.provision_s:.1f} s; "
            f"{len(broken)} {SIGNATURE} findings written",
            flush=True,
        )

        t0 = time.perf_counter()
        await planner.run_once()
        run.planner_ms = (time.perf_counter() - t0) * 1000.0
        async with app.ctx.db.session() as session:
            proposed = (
                await session.execute(
                    select(RepairRow.id, RepairRow.node_id, RepairRow.action).where(
                        RepairRow.status == RepairStatus.PROPOSED.value
                    )
                )
            ).all()
        run.proposals = Counter(str(action) for _, _, action in proposed)
        name_of = {n.id: n.name for n in nodes}
        by_node = {name_of[str(node_id)]: str(rid) for rid, node_id, _ in proposed}
        missing = [n.name for n in broken if n.name not in by_node]
        if missing:
            raise RuntimeError(
                f"the planner proposed {len(proposed)} repairs, none for {len(missing)} nodes "
                f"(e.g. {missing[0]})"
            )
        print(
            f"[{db_kind}] planner: {len(proposed)} proposals in {run.planner_ms:.0f} ms",
            flush=True,
        )

        specs = node_specs(provider, cluster_id)
        instances = {n.name: str(n.provider_instance_id) for n in nodes}
        throughput_nodes = broken[: args.nodes]
        sample_nodes = broken[args.nodes :]
        cpu = CpuMeter()
        run.throughput = await measure_throughput(
            app,
            executor,
            repairs={by_node[n.name]: n.name for n in throughput_nodes},
            specs=specs,
            max_passes=args.max_passes,
            cpu=cpu,
        )
        t = run.throughput
        print(
            f"[{db_kind}] throughput: {t.repairs} repairs in {t.passes} passes, "
            f"{t.wall_s:.2f} s ({t.repairs / t.wall_s:,.1f} repairs/s)",
            flush=True,
        )
        run.raw = await raw_transitions(
            app.ctx.db,
            sorted(by_node[n.name] for n in throughput_nodes),
            count=t.transitions,
            concurrency=EXECUTOR_CONCURRENCY,
        )
        print(
            f"[{db_kind}] baseline: {run.raw.serial_per_s:,.0f} raw transitions/s one at a "
            f"time, {run.raw.concurrent_per_s:,.0f}/s {EXECUTOR_CONCURRENCY} in flight",
            flush=True,
        )
        if sample_nodes:
            run.overhead = await measure_overhead(
                app,
                executor,
                provider,
                repairs={by_node[n.name]: n.name for n in sample_nodes},
                instances=instances,
                specs=specs,
                spare_instance=instances[spare.name],
                max_passes=args.max_passes,
            )
            o = run.overhead
            print(
                f"[{db_kind}] overhead: approve → reboot p50 "
                f"{percentile(sorted(o.to_action_ms), 50):.1f} ms",
                flush=True,
            )


# -- output ----------------------------------------------------------------------------------


def default_interval_s() -> float:
    value = ServerSettings.model_fields["repair_interval_s"].default
    return float(value)


def print_run(run: DbRun) -> None:
    print(f"== {run.db}: {run.version or '?'} ==")
    if run.nodes_total:
        print(
            f"set-up: {run.nodes_total} sim nodes ({GPUS_PER_NODE} GPUs each, no jobs, reboots "
            f"take 0 s) provisioned in {run.provision_s:.1f} s; one open {SIGNATURE} (fatal) "
            f"finding on {run.nodes_total - 1} of them, written as FindingRow rows directly "
            "(not through the agent API); policy breaker_max_share=1.0, "
            "incident_min_nodes=10000, verify_settle_s=0"
        )
    if run.proposals:
        actions = ", ".join(f"{a}×{n}" for a, n in sorted(run.proposals.items()))
        print(
            f"planner: {sum(run.proposals.values())} proposals in {run.planner_ms:.0f} ms "
            f"(one run_once() pass; {actions})"
        )
    interval = default_interval_s()
    o = run.overhead
    if o is not None:
        passes = Counter(o.passes)
        steps = max(o.passes) if o.passes else 0
        print(
            f"overhead, approval → action start ({len(o.to_action_ms)} repairs one at a time, "
            "the others proposed; executor passes back to back), ms:"
        )
        print(f"  approve → reboot() entered   {stats(o.to_action_ms)}")
        print(f"    the approve call (API)     {stats(o.approve_ms)}")
        print(f"    one executor pass          {stats(o.pass_ms)}")
        print(
            "    passes until the reboot    "
            + ", ".join(f"{p} passes ×{n}" for p, n in sorted(passes.items()))
        )
        print(f"  baseline: provider.reboot()  {stats(o.direct_reboot_ms)}  (direct, spare node)")
        print(
            f"  in production the executor sleeps GPUFLEET_REPAIR_INTERVAL_S (default "
            f"{interval:g} s) after each pass: {steps} steps × {interval:g} s = up to "
            f"{steps * interval:g} s from approval to the reboot, on top of the above"
        )
    t = run.throughput
    if t is not None:
        a, b = t.to_verifying, t.to_succeeded
        cpu = a.cpu_s + b.cpu_s
        other = a.other_cpu_s + b.other_cpu_s
        print(
            f"throughput, {t.repairs} concurrent repairs "
            f"(executor concurrency {EXECUTOR_CONCURRENCY}):"
        )
        print(
            f"  approvals (API, one at a time)  {t.repairs} in {t.approve_s:.2f} s = "
            f"{t.repairs / t.approve_s:,.1f}/s"
        )
        print(
            f"  approved → verifying            {a.passes} passes, {a.wall_s:.2f} s "
            f"(pass ms: {', '.join(f'{ms:.0f}' for ms in a.pass_ms)})"
        )
        print(
            f"  agent reports (not timed)       {t.reports} ReportBatches posted to "
            f"/api/v1/agent/reports in {t.reports_s:.2f} s"
        )
        print(
            f"  verifying → succeeded           {b.passes} passes, {b.wall_s:.2f} s "
            f"(pass ms: {', '.join(f'{ms:.0f}' for ms in b.pass_ms)})"
        )
        outcome = ", ".join(f"{s} {n}" for s, n in sorted(t.outcome.items()))
        print(
            f"  executor: {t.repairs} repairs, {t.passes} passes, {t.steps} steps, "
            f"{t.wall_s:.2f} s → {t.repairs / t.wall_s:,.1f} repairs/s, "
            f"{t.transitions} repair.status transitions → {t.transitions / t.wall_s:,.1f}/s "
            f"(outcome: {outcome})"
        )
        rest = "PostgreSQL, kernel, others" if run.db == "postgres" else "kernel, others"
        print(
            f"  CPU over those passes: this process (the whole server) {cpu:.2f} s = "
            f"{cpu / t.wall_s:.2f} cores; rest of the machine ({rest}) {other:.2f} s = "
            f"{other / t.wall_s:.2f} cores"
        )
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(t.events.items()))
        print(
            f"  rows the executor wrote: {sum(t.events.values())} events ({kinds}), "
            f"{t.audit_rows} audit rows"
        )
        if run.raw is not None and run.raw.serial_s and run.raw.concurrent_s:
            r = run.raw
            rate = t.transitions / t.wall_s
            print(
                f"  baseline: {r.transactions} transactions, each UPDATE repair + INSERT event + "
                "INSERT audit_log (SQLAlchemy core, the app's engine):"
            )
            print(
                f"    one at a time      {r.serial_s:.2f} s = {r.serial_per_s:,.0f}/s; "
                f"executor transitions/s = {rate / r.serial_per_s:.1%} of it"
            )
            print(
                f"    {r.concurrency} in flight       {r.concurrent_s:.2f} s = "
                f"{r.concurrent_per_s:,.0f}/s; executor transitions/s = "
                f"{rate / r.concurrent_per_s:.1%} of it"
            )
    print(f"machine busy before the run: {run.idle_busy_cores:.2f} cores")
    if run.errors_logged:
        print(f"errors logged: {len(run.errors_logged)}; first: {run.errors_logged[0]}")
    else:
        print("errors logged: none")
    if run.error:
        print(f"FAILED: {run.error}")
    print()


def print_report(runs: list[DbRun], args: argparse.Namespace) -> None:
    print()
    for line in machine_lines():
        print(line)
    print(
        f"load: {args.nodes} concurrent repairs; {args.samples} approval → action samples; "
        "app in this process, loops driven with run_once() back to back"
    )
    print()
    for run in runs:
        print_run(run)
    headers = [
        "db",
        "approve → reboot p50 ms",
        "p95 ms",
        "passes",
        "repairs/s",
        "transitions/s",
        "raw/s 1 at a time",
        "raw/s concurrent",
        "executor ÷ raw (1 / concurrent)",
    ]
    table: list[list[str]] = []
    for run in runs:
        o, t, r = run.overhead, run.throughput, run.raw
        to_action = sorted(o.to_action_ms) if o else []
        row = [run.db if not run.error else f"{run.db} (FAILED)"]
        row += [
            f"{percentile(to_action, 50):.1f}" if to_action else "",
            f"{percentile(to_action, 95):.1f}" if to_action else "",
            "/".join(str(p) for p in sorted(set(o.passes))) if o else "",
        ]
        if t is not None and t.wall_s:
            row += [f"{t.repairs / t.wall_s:,.1f}", f"{t.transitions / t.wall_s:,.1f}"]
        else:
            row += ["", ""]
        if t is not None and r is not None and r.serial_s and r.concurrent_s and t.wall_s:
            rate = t.transitions / t.wall_s
            row += [
                f"{r.serial_per_s:,.0f}",
                f"{r.concurrent_per_s:,.0f}",
                f"{rate / r.serial_per_s:.1%} / {rate / r.concurrent_per_s:.1%}",
            ]
        else:
            row += ["", "", ""]
        table.append(row)
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--nodes", type=int, default=200, help="concurrent repairs (default 200)")
    p.add_argument("--samples", type=int, default=20, help="approval → action samples (default 20)")
    p.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="admin URL; the bench creates and drops its own database next to it",
    )
    p.add_argument("--max-passes", type=int, default=50, help="per phase, then it fails")
    p.add_argument("--provision-timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.samples < 0 or args.max_passes < 1:
        p.error("--nodes and --max-passes must be positive, --samples not negative")
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
    print_report(runs, args)
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
