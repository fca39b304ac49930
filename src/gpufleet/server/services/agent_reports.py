"""Agent reports: apply many nodes' report batches in one transaction.

The ingest path is the server's hottest: a 2,000-node fleet reporting every 10 s is 200
batches a second. ``apply_report_batches`` therefore works set-wise: one query finds the
nodes by token hash (``node_callers.nodes_by_token_hash``, which refuses what every agent
route refuses), one loads their GPUs, one their open findings; then executemany updates.
Callers (see ``server/ingest.py``) group concurrent requests into one call.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    String,
    Table,
    any_,
    bindparam,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import GpuSample, NodeReport, ReportAck, ReportBatch
from gpufleet.core.enums import EventKind, Health, Severity
from gpufleet.core.errors import Conflict, GpufleetError, Unauthorized
from gpufleet.core.health import node_health
from gpufleet.core.ids import new_id
from gpufleet.core.stacks import NodeSoftware
from gpufleet.server.db.tables import EventRow, FindingRow, GpuRow, NodeRow
from gpufleet.server.services.hosts import bind_by_hostname
from gpufleet.server.services.node_callers import REFUSED, nodes_by_token_hash
from gpufleet.server.services.node_health import stage_node_health
from gpufleet.server.services.stacks import record_node_software
from gpufleet.server.services.telemetry_history import (
    NodeSample,
    first_report_of_minute,
    write_history,
)

_GPU_TABLE = cast(Table, GpuRow.__table__)
_GPU_COLUMNS = list(_GPU_TABLE.columns)
_NODE_TABLE = cast(Table, NodeRow.__table__)
# Core statements, built once: each GPU row is updated by primary key, the SET columns
# taken from the parameters' keys (an executemany per shape of those keys).
_UPDATE_GPU = update(_GPU_TABLE).where(_GPU_TABLE.c.id == bindparam("b_id"))
_SELECT_GPUS = select(
    _GPU_TABLE.c.node_id, _GPU_TABLE.c.id, _GPU_TABLE.c.uuid, _GPU_TABLE.c.index
).where(_GPU_TABLE.c.removed_at.is_(None))


@dataclass(frozen=True)
class PendingBatch:
    token_hash: str
    batch: ReportBatch


class _Gpu(NamedTuple):
    """What the report path needs of a GPU row: plain columns, no ORM object (eight of
    these per report cost more to load as ``GpuRow`` objects than to write)."""

    id: str
    uuid: str
    slot: int  # the GPU's index on the node


@dataclass
class _NodeWork:
    node: NodeRow
    project_id: str
    gpus_by_uuid: dict[str, _Gpu]
    severities: list[Severity]
    last_seq: int
    updates: dict[str, Any] = field(default_factory=dict)


def _gpu_values(sample: GpuSample, sampled_at: dt.datetime) -> dict[str, Any]:
    return {
        "index": sample.index,
        "utilization_pct": sample.utilization_pct,
        "memory_used_mib": sample.memory_used_mib,
        "memory_total_mib": sample.memory_total_mib,
        "temperature_c": sample.temperature_c,
        "power_w": sample.power_w,
        "sm_clock_mhz": sample.sm_clock_mhz,
        "ecc_sbe_volatile": sample.ecc_sbe_volatile,
        "ecc_dbe_volatile": sample.ecc_dbe_volatile,
        "ecc_sbe_aggregate": sample.ecc_sbe_aggregate,
        "ecc_dbe_aggregate": sample.ecc_dbe_aggregate,
        "sampled_at": sampled_at,
    }


async def apply_report_batches(
    session: AsyncSession,
    *,
    items: list[PendingBatch],
    now: dt.datetime,
    staleness_s: float,
    report_interval_s: float,
) -> list[ReportAck | GpufleetError]:
    """Store the batches; return one ack (or the error for that batch) per item, in order.

    Idempotent: a report whose ``seq`` is not above the node's stored ``last_report_seq``
    is counted as a duplicate and changes nothing.
    """
    # One query for every batch's token: a lookup per request would cost more than the
    # write. Refused nodes are left out, so they cannot come back to life by reporting.
    pg = session.get_bind().dialect.name == "postgresql"
    nodes = await _lock_nodes(session, token_hashes={i.token_hash for i in items}, pg=pg)
    work: dict[str, _NodeWork] = {}
    by_hash: dict[str, _NodeWork] = {}
    for token_hash, (node, project_id) in nodes.items():
        w = _NodeWork(
            node=node,
            project_id=project_id,
            gpus_by_uuid={},
            severities=[],
            last_seq=node.last_report_seq,
        )
        work[node.id] = w
        by_hash[token_hash] = w
    if work:
        ids = list(work)
        for node_id, gpu_id, uuid, index in await session.execute(
            _SELECT_GPUS.where(_one_of(_GPU_TABLE.c.node_id, ids, pg=pg))
        ):
            work[node_id].gpus_by_uuid[uuid] = _Gpu(gpu_id, uuid, index)
        for node_id, severity in await session.execute(
            select(FindingRow.node_id, FindingRow.severity).where(
                _one_of(FindingRow.node_id, ids, pg=pg), FindingRow.cleared_at.is_(None)
            )
        ):
            work[node_id].severities.append(Severity(severity))

    results: list[ReportAck | GpufleetError] = []
    gpu_updates: dict[str, dict[str, Any]] = {}
    gpu_inserts: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    history: dict[str, NodeSample] = {}  # node id → its minute of telemetry history
    renamed: list[NodeRow] = []  # nodes whose hostname changed (or was first seen)
    software: list[tuple[_NodeWork, NodeSoftware]] = []  # nodes that run other software
    for item in items:
        found = by_hash.get(item.token_hash)
        if found is None:
            results.append(Unauthorized(REFUSED))
            continue
        w = found
        fresh = sorted((r for r in item.batch.reports if r.seq > w.last_seq), key=lambda r: r.seq)
        duplicates = len(item.batch.reports) - len(fresh)
        if _has_repeated_seq(fresh):
            results.append(Conflict("reports in one batch must have distinct seq", field="seq"))
            continue
        if fresh:
            latest = fresh[-1]
            _apply_latest(
                w,
                latest=latest,
                now=now,
                gpu_updates=gpu_updates,
                gpu_inserts=gpu_inserts,
                events=events,
            )
            w.last_seq = latest.seq
            if first_report_of_minute(last_report_at=w.node.last_report_at, now=now):
                history[w.node.id] = NodeSample.from_report(
                    node_id=w.node.id,
                    cluster_id=w.node.cluster_id,
                    expected_gpus=w.node.expected_gpus,
                    gpus=latest.gpus,
                )
            health = node_health(
                last_report_at=now,
                now=now,
                staleness_s=staleness_s,
                expected_gpus=w.node.expected_gpus,
                reporting_gpus=len(latest.gpus),
                finding_severities=w.severities,
            )
            changed = stage_node_health(
                w.node,
                updates=w.updates,
                project_id=w.project_id,
                target=health,
                actor=f"node:{w.node.name}",
                now=now,
                reason=_health_reason(w, latest, health),
            )
            if changed is not None:
                events.append(changed)
            w.updates.update(last_report_at=now, last_report_seq=latest.seq)
        if item.batch.identity is not None:
            ident = item.batch.identity
            if ident.hostname != w.node.hostname:
                w.updates["hostname"] = ident.hostname
                w.node.hostname = ident.hostname
                renamed.append(w.node)
            if ident.serial and ident.serial != w.node.serial:
                w.updates["serial"] = ident.serial
                w.node.serial = ident.serial
            if ident.boot_id and ident.boot_id != w.node.boot_id:
                booted = _booted(w, boot_id=ident.boot_id, now=now)
                if booted is not None:
                    events.append(booted)
            if ident.software is not None and (
                ident.software.model_dump(exclude_none=True) != (w.node.software or {})
            ):
                software.append((w, ident.software))
        results.append(
            ReportAck(
                node_id=w.node.id,
                accepted=len(fresh),
                duplicates=duplicates,
                last_seq=w.last_seq,
                report_interval_s=report_interval_s,
                node_state=w.node.state,
            )
        )

    await _write(
        session, work=work, gpu_updates=gpu_updates, gpu_inserts=gpu_inserts, events=events
    )
    await write_history(session, samples=[history[k] for k in sorted(history)], now=now)
    if renamed:  # a node that names its hostname is bound to that inventory host
        await bind_by_hostname(session, nodes=renamed, now=now)
    for w, runs in software:  # rare: after an agent start that finds other software
        await record_node_software(
            session, node=w.node, project_id=w.project_id, software=runs, now=now
        )
    return results


def _one_of(column: Any, ids: list[str], *, pg: bool) -> ColumnElement[bool]:
    """``column IN ids``; on PostgreSQL ``= ANY(array)``: one statement text whatever the
    group's size, so the driver's prepared statement is reused (an IN list is a new
    statement, prepared again, for each length)."""
    if pg:
        return cast(ColumnElement[bool], column == any_(bindparam("ids", ids, type_=_ID_ARRAY)))
    return cast(ColumnElement[bool], column.in_(ids))


_ID_ARRAY = ARRAY(String())
# What another writer may change in a node row that the report path reads.
_LOCKED_COLUMNS = (
    "last_report_seq",
    "last_report_at",
    "health",
    "state",
    "boot_id",
    "hostname",
    "serial",
    "updated_at",
)


def _padded(token_hashes: set[str]) -> set[str]:
    """The hashes and as many that name no node (no hash is empty or starts with ``-``)
    as make their count a power of two: the lookup's ``IN`` list then has a handful of
    lengths, not one per group size, and the driver reuses its prepared statements."""
    size = 1 << max(0, len(token_hashes) - 1).bit_length()
    return token_hashes | {f"-{i}" for i in range(size - len(token_hashes))}


async def _lock_nodes(
    session: AsyncSession, *, token_hashes: set[str], pg: bool
) -> dict[str, tuple[NodeRow, str]]:
    """The reporting nodes, by token hash; on PostgreSQL locked (``FOR UPDATE``, in id
    order, so two writers never deadlock) until the group commits.

    The lock is what makes a retry safe against a slow replica: without it both could
    read the same ``last_report_seq``, both take the batch as fresh and both stage its
    events (a health change twice); the guarded UPDATE would keep the seq right but not
    the events. The nodes are found by token first (only ``node_callers`` does that),
    then locked by id, reading the columns another writer may have changed in between;
    if any did (rare: a write committed between the two statements), every node is read
    again under the lock, refused states and tokens checked again."""
    if pg:
        token_hashes = _padded(token_hashes)
    nodes = await nodes_by_token_hash(session, token_hashes=token_hashes)
    if not nodes or not pg:
        return nodes  # SQLite: one writer at a time, the transaction is the lock
    by_id = {node.id: node for node, _ in nodes.values()}
    table = _NODE_TABLE
    locked = await session.execute(
        select(table.c.id, *(table.c[c] for c in _LOCKED_COLUMNS))
        .where(_one_of(table.c.id, sorted(by_id), pg=pg))
        .order_by(table.c.id)
        .with_for_update()
    )
    rows = locked.all()
    same = len(rows) == len(by_id) and all(
        tuple(row[1:]) == tuple(getattr(by_id[row[0]], c) for c in _LOCKED_COLUMNS) for row in rows
    )
    if same:
        return nodes
    for node in by_id.values():
        session.expunge(node)  # read again below, as the lock left it
    return await nodes_by_token_hash(session, token_hashes=token_hashes)


def _booted(w: _NodeWork, *, boot_id: str, now: dt.datetime) -> dict[str, Any] | None:
    """Record a new kernel boot id (the proof a reboot happened); an event when the node
    had reported another one before."""
    before = w.node.boot_id
    w.updates.update(boot_id=boot_id, boot_seen_at=now)
    w.node.boot_id, w.node.boot_seen_at = boot_id, now
    if before is None:
        return None
    return _event(
        w,
        kind=EventKind.NODE_BOOTED,
        now=now,
        message=f"node {w.node.name} booted (boot id {before} → {boot_id})",
        data={"old_boot_id": before, "new_boot_id": boot_id},
    )


def _has_repeated_seq(reports: list[NodeReport]) -> bool:
    seqs = [r.seq for r in reports]
    return len(seqs) != len(set(seqs))


def _health_reason(w: _NodeWork, latest: NodeReport, health: Health) -> str:
    if health is Health.UNHEALTHY and len(latest.gpus) < w.node.expected_gpus:
        return f"{len(latest.gpus)} of {w.node.expected_gpus} GPUs reporting"
    return ""


def _apply_latest(
    w: _NodeWork,
    *,
    latest: NodeReport,
    now: dt.datetime,
    gpu_updates: dict[str, dict[str, Any]],
    gpu_inserts: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    by_index: dict[int, _Gpu] | None = None  # built only when a GPU is new (rare)
    for sample in latest.gpus:
        values = _gpu_values(sample, latest.sampled_at)
        existing = w.gpus_by_uuid.get(sample.uuid)
        if existing is not None:
            values["b_id"] = existing.id
            gpu_updates[existing.id] = values
            continue
        if by_index is None:
            by_index = {g.slot: g for g in w.gpus_by_uuid.values()}
        replaced = by_index.get(sample.index)
        if replaced is not None and replaced.uuid != sample.uuid:
            # A different GPU in the same slot: the old one left (swap). Health follows the
            # hardware, so the new GPU starts clean and the old row keeps its history.
            gpu_updates[replaced.id] = {"b_id": replaced.id, "removed_at": now}
            del w.gpus_by_uuid[replaced.uuid]
            events.append(
                _event(
                    w,
                    kind=EventKind.NODE_GPUS_CHANGED,
                    now=now,
                    message=f"node {w.node.name}: GPU {sample.index} replaced "
                    f"({replaced.uuid} → {sample.uuid})",
                    data={
                        "index": sample.index,
                        "old_uuid": replaced.uuid,
                        "new_uuid": sample.uuid,
                    },
                )
            )
        row = GpuRow(
            id=new_id(),
            node_id=w.node.id,
            uuid=sample.uuid,
            serial=sample.serial,
            model=sample.model,
            health=Health.HEALTHY.value,
            first_seen=now,
            removed_at=None,
            **values,
        )
        w.gpus_by_uuid[sample.uuid] = _Gpu(row.id, row.uuid, row.index)
        gpu_inserts.append({c.key: getattr(row, c.key) for c in _GPU_COLUMNS})


def _event(
    w: _NodeWork, *, kind: EventKind, now: dt.datetime, message: str, data: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": new_id(),
        "ts": now,
        "kind": kind.value,
        "message": message,
        "project_id": w.project_id,
        "cluster_id": w.node.cluster_id,
        "node_id": w.node.id,
        "actor": f"node:{w.node.name}",
        "data": data,
    }


# PostgreSQL: the common shapes (a report's GPU samples, a node's seq and health) are
# one UPDATE ... FROM unnest(arrays) per group instead of an executemany of a statement
# per row: PostgreSQL plans and runs one statement, and the driver sends a dozen arrays.
_SAMPLE_COLUMNS = (
    ("index", "integer"),
    ("utilization_pct", "float8"),
    ("memory_used_mib", "float8"),
    ("memory_total_mib", "float8"),
    ("temperature_c", "float8"),
    ("power_w", "float8"),
    ("sm_clock_mhz", "float8"),
    ("ecc_sbe_volatile", "bigint"),
    ("ecc_dbe_volatile", "bigint"),
    ("ecc_sbe_aggregate", "bigint"),
    ("ecc_dbe_aggregate", "bigint"),
    ("sampled_at", "timestamptz"),
)
_SAMPLE_SHAPE = tuple(sorted(["b_id", *(c for c, _ in _SAMPLE_COLUMNS)]))
_PG_UPDATE_SAMPLES = text(
    "UPDATE gpu SET "  # noqa: S608 - names from the constant above; values are bound
    + ", ".join(f"{c} = v.{c}" for c, _ in _SAMPLE_COLUMNS)
    + " FROM unnest(CAST(:b_id AS varchar[]), "
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _SAMPLE_COLUMNS)
    + ") AS v(b_id, "
    + ", ".join(c for c, _ in _SAMPLE_COLUMNS)
    + ") WHERE gpu.id = v.b_id"
)
_REPORT_SHAPE = ("health", "last_report_at", "last_report_seq")
# Never move a node's sequence backwards, even if two replicas race.
_PG_UPDATE_REPORTED = text(
    "UPDATE node SET health = v.health, last_report_at = v.last_report_at, "
    "last_report_seq = v.last_report_seq "
    "FROM unnest(CAST(:b_id AS varchar[]), CAST(:health AS varchar[]), "
    "CAST(:last_report_at AS timestamptz[]), CAST(:last_report_seq AS bigint[])) "
    "AS v(b_id, health, last_report_at, last_report_seq) "
    "WHERE node.id = v.b_id AND node.last_report_seq < v.last_report_seq"
)

# The columns every report writes: no index may cover one (db/tables.py, NodeRow), so
# these updates stay heap-only on PostgreSQL.
WRITTEN_BY_EVERY_REPORT: dict[str, tuple[str, ...]] = {
    "node": _REPORT_SHAPE,
    "gpu": tuple(c for c, _ in _SAMPLE_COLUMNS),
}


def _arrays(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, list[Any]]:
    return {k: [r[k] for r in rows] for k in keys}


async def _write(
    session: AsyncSession,
    *,
    work: dict[str, _NodeWork],
    gpu_updates: dict[str, dict[str, Any]],
    gpu_inserts: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    pg = session.get_bind().dialect.name == "postgresql"
    # Node rows first, then GPU rows, each in id order: the same order as the findings
    # path (which locks the node, then writes its GPUs), so the two never deadlock.
    node_rows = sorted((w for w in work.values() if w.updates), key=lambda w: w.node.id)
    if node_rows:
        shapes_n: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for w in node_rows:
            shapes_n[tuple(sorted(w.updates))].append({"b_id": w.node.id, **w.updates})
        table = _NODE_TABLE
        for cols, rows_n in shapes_n.items():
            if pg and cols == _REPORT_SHAPE:
                await session.execute(_PG_UPDATE_REPORTED, _arrays(rows_n, ("b_id", *cols)))
                continue
            stmt = (
                update(table)
                .where(table.c.id == bindparam("b_id"))
                .values({c: bindparam(f"v_{c}") for c in cols})
            )
            if "last_report_seq" in cols:
                # Never move a node's sequence backwards, even if two replicas race.
                stmt = stmt.where(table.c.last_report_seq < bindparam("v_last_report_seq"))
            params = [{"b_id": r["b_id"], **{f"v_{c}": r[c] for c in cols}} for r in rows_n]
            await session.execute(stmt, params)
    if gpu_inserts:
        await session.execute(insert(GpuRow), gpu_inserts)
    if gpu_updates:
        # Group by the set of columns so each executemany has one statement shape.
        shapes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for _gpu_id, values in sorted(gpu_updates.items()):
            shapes[tuple(sorted(values))].append(values)
        for cols, rows in shapes.items():
            if pg and cols == _SAMPLE_SHAPE:
                await session.execute(_PG_UPDATE_SAMPLES, _arrays(rows, cols))
            else:
                await session.execute(_UPDATE_GPU, rows)
    if events:
        await session.execute(insert(EventRow), events)
