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
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select, update
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

_GPU_COLUMNS = list(cast(Table, GpuRow.__table__).columns)


@dataclass(frozen=True)
class PendingBatch:
    token_hash: str
    batch: ReportBatch


@dataclass
class _NodeWork:
    node: NodeRow
    project_id: str
    gpus_by_uuid: dict[str, GpuRow]
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
    nodes = await nodes_by_token_hash(session, token_hashes={i.token_hash for i in items})
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
        for gpu in await session.scalars(
            select(GpuRow).where(GpuRow.node_id.in_(list(work)), GpuRow.removed_at.is_(None))
        ):
            work[gpu.node_id].gpus_by_uuid[gpu.uuid] = gpu
        for node_id, severity in await session.execute(
            select(FindingRow.node_id, FindingRow.severity).where(
                FindingRow.node_id.in_(list(work)), FindingRow.cleared_at.is_(None)
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
    by_index = {g.index: g for g in w.gpus_by_uuid.values()}
    for sample in latest.gpus:
        values = _gpu_values(sample, latest.sampled_at)
        existing = w.gpus_by_uuid.get(sample.uuid)
        if existing is not None:
            gpu_updates[existing.id] = {"id": existing.id, **values}
            continue
        replaced = by_index.get(sample.index)
        if replaced is not None and replaced.uuid != sample.uuid:
            # A different GPU in the same slot: the old one left (swap). Health follows the
            # hardware, so the new GPU starts clean and the old row keeps its history.
            gpu_updates[replaced.id] = {"id": replaced.id, "removed_at": now}
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
        w.gpus_by_uuid[sample.uuid] = row
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


async def _write(
    session: AsyncSession,
    *,
    work: dict[str, _NodeWork],
    gpu_updates: dict[str, dict[str, Any]],
    gpu_inserts: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    # Node rows first, then GPU rows, each in id order: the same order as the findings
    # path (which locks the node, then writes its GPUs), so the two never deadlock.
    node_rows = sorted((w for w in work.values() if w.updates), key=lambda w: w.node.id)
    if node_rows:
        shapes_n: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for w in node_rows:
            params = {"b_id": w.node.id, **{f"v_{k}": v for k, v in w.updates.items()}}
            shapes_n[tuple(sorted(w.updates))].append(params)
        table = cast(Table, NodeRow.__table__)
        for cols, rows_n in shapes_n.items():
            stmt = (
                update(table)
                .where(table.c.id == bindparam("b_id"))
                .values({c: bindparam(f"v_{c}") for c in cols})
            )
            if "last_report_seq" in cols:
                # Never move a node's sequence backwards, even if two replicas race.
                stmt = stmt.where(table.c.last_report_seq < bindparam("v_last_report_seq"))
            await session.execute(stmt, rows_n)
    if gpu_inserts:
        await session.execute(insert(GpuRow), gpu_inserts)
    if gpu_updates:
        # Group by the set of columns so each executemany has one statement shape.
        shapes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for _gpu_id, values in sorted(gpu_updates.items()):
            shapes[tuple(sorted(values))].append(values)
        for rows in shapes.values():
            await session.execute(update(GpuRow), rows)
    if events:
        await session.execute(insert(EventRow), events)
