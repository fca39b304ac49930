"""Finding changes from agents: fold, open, clear — each change exactly once, in order.

Every change carries the agent's finding ``seq``; the node row keeps the highest applied
one, so a replay after a timeout or a spool replay after an outage changes nothing twice.
The whole batch, the node's new health and the events commit in one transaction.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import FindingAck, FindingBatch, FindingReport, FindingState
from gpufleet.core.enums import EventKind, NodeState, Severity
from gpufleet.core.errors import Conflict, Unauthorized
from gpufleet.core.health import health_from_severities, node_health
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import ClusterRow, FindingRow, GpuRow, NodeRow
from gpufleet.server.services.events import record_event

_REJECT_STATES = frozenset({NodeState.REMOVING.value, NodeState.REMOVED.value})


async def apply_finding_batch(
    session: AsyncSession,
    *,
    token_hash: str,
    batch: FindingBatch,
    now: dt.datetime,
    staleness_s: float,
) -> FindingAck:
    found = (
        await session.execute(
            select(NodeRow, ClusterRow.project_id)
            .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
            .where(NodeRow.token_hash == token_hash)
            .with_for_update(of=NodeRow)
        )
    ).first()
    if found is None or found[0].state in _REJECT_STATES:
        raise Unauthorized("unknown or revoked node token")
    node, project_id = found
    seqs = [f.seq for f in batch.findings]
    if len(seqs) != len(set(seqs)):
        raise Conflict("finding changes in one batch must have distinct seq", field="seq")
    fresh = sorted(
        (f for f in batch.findings if f.seq > node.last_finding_seq), key=lambda f: f.seq
    )
    open_rows = {
        row.fold_key: row
        for row in await session.scalars(
            select(FindingRow).where(FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None))
        )
    }
    for change in fresh:
        if change.state is FindingState.OPEN:
            _open(
                session,
                node=node,
                project_id=project_id,
                change=change,
                open_rows=open_rows,
                now=now,
            )
        else:
            _clear(session, node=node, project_id=project_id, change=change, open_rows=open_rows)
    if fresh:
        node.last_finding_seq = fresh[-1].seq
        await _refresh_health(
            session,
            node=node,
            project_id=project_id,
            open_rows=list(open_rows.values()),
            now=now,
            staleness_s=staleness_s,
        )
    return FindingAck(
        node_id=node.id,
        accepted=len(fresh),
        duplicates=len(batch.findings) - len(fresh),
        last_seq=node.last_finding_seq,
    )


def _open(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    change: FindingReport,
    open_rows: dict[str | None, FindingRow],
    now: dt.datetime,
) -> None:
    row = open_rows.get(change.key)
    if row is not None:
        # A repeat folds into the open finding: count and last-seen grow, never shrink.
        row.count = max(row.count, change.count)
        row.last_seen = max(row.last_seen, change.last_seen)
        row.evidence = change.evidence or row.evidence
        if _rank(change.severity) > _rank(Severity(row.severity)):
            row.severity = change.severity.value
        return
    row = FindingRow(
        id=new_id(),
        cluster_id=node.cluster_id,
        node_id=node.id,
        gpu_uuid=change.gpu_uuid,
        fold_key=change.key,
        gpu_index=change.gpu_index,
        pci_bus_id=change.pci_bus_id,
        component=change.component,
        signature_id=change.signature_id,
        title=change.title or change.signature_id,
        severity=change.severity.value,
        source=change.source.value,
        evidence=change.evidence,
        count=change.count,
        first_seen=change.first_seen,
        last_seen=change.last_seen,
        cleared_at=None,
    )
    session.add(row)
    open_rows[change.key] = row
    where = f" GPU {change.gpu_index}" if change.gpu_index is not None else ""
    record_event(
        session,
        kind=EventKind.FINDING_OPENED,
        message=f"node {node.name}{where}: {row.title} ({change.severity.value})",
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=f"node:{node.name}",
        data={
            "finding_id": row.id,
            "signature": change.signature_id,
            "severity": change.severity.value,
            "gpu_uuid": change.gpu_uuid,
            "evidence": change.evidence[:500],
        },
        ts=now,
    )


def _clear(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    change: FindingReport,
    open_rows: dict[str | None, FindingRow],
) -> None:
    row = open_rows.get(change.key)
    if row is None:
        return  # nothing open under that key: clearing twice is harmless
    if change.first_seen < row.first_seen:
        # The end of an earlier episode under the same key, which began before this
        # open finding did (an agent that restarted without its memory re-sends the
        # clears it cannot know were delivered). It says nothing about this one.
        return
    del open_rows[change.key]
    row.cleared_at = max(change.last_seen, row.first_seen)
    row.last_seen = max(row.last_seen, change.last_seen)
    record_event(
        session,
        kind=EventKind.FINDING_CLEARED,
        message=f"node {node.name}: {row.title} cleared",
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=f"node:{node.name}",
        data={"finding_id": row.id, "signature": row.signature_id},
        ts=change.last_seen,
    )


async def refresh_node_health(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    now: dt.datetime,
    staleness_s: float,
) -> None:
    """Recompute a node's and its GPUs' health from its open findings (after a repair
    closed some)."""
    await session.flush()
    open_rows = list(
        await session.scalars(
            select(FindingRow).where(FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None))
        )
    )
    await _refresh_health(
        session,
        node=node,
        project_id=project_id,
        open_rows=open_rows,
        now=now,
        staleness_s=staleness_s,
        actor="system:repairs",
    )


async def _refresh_health(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    open_rows: list[FindingRow],
    now: dt.datetime,
    staleness_s: float,
    actor: str | None = None,
) -> None:
    gpus = list(
        await session.scalars(
            select(GpuRow).where(GpuRow.node_id == node.id, GpuRow.removed_at.is_(None))
        )
    )
    for gpu in gpus:
        gpu.health = health_from_severities(
            Severity(f.severity) for f in open_rows if f.gpu_uuid == gpu.uuid
        ).value
    reporting = sum(1 for g in gpus if g.sampled_at is not None)
    health = node_health(
        last_report_at=node.last_report_at,
        now=now,
        staleness_s=staleness_s,
        expected_gpus=node.expected_gpus,
        reporting_gpus=reporting if node.last_report_at else node.expected_gpus,
        finding_severities=[Severity(f.severity) for f in open_rows],
    )
    if health.value == node.health:
        return
    record_event(
        session,
        kind=EventKind.NODE_HEALTH,
        message=f"node {node.name} health: {node.health} → {health.value}",
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=actor or f"node:{node.name}",
        data={"from": node.health, "to": health.value},
        ts=now,
    )
    node.health = health.value
    node.updated_at = now


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2, Severity.FATAL: 3}


def _rank(severity: Severity) -> int:
    return _SEVERITY_RANK[severity]


__all__ = ["apply_finding_batch", "refresh_node_health"]
