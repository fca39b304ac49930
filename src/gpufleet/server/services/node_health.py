"""Node and GPU health: the one writer of ``node.health`` and ``gpu.health``.

Every change of a node's health writes a ``node.health`` event naming the caller's actor,
the old and the new value and, when there is one, the reason. Three callers:

* agent findings, active-check findings and verified repairs: ``refresh_node_health``
  recomputes the node and its GPUs from the open findings (``core.health`` rules);
* the health loop: ``set_node_health`` marks a silent node ``unknown`` (or ``unhealthy``
  when an open critical finding says more than the silence);
* the set-wise report ingest: ``stage_node_health`` changes the node in memory and hands
  back the event as row values, so the hot path keeps its one executemany per table.

GPU health follows the open findings on that GPU and is written only by the refresh; the
node's event covers it (a GPU that turns bad also opened a finding, which has its event).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, Health, Severity
from gpufleet.core.health import health_from_severities, node_health
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import FindingRow, GpuRow, NodeRow
from gpufleet.server.services.events import record_event


async def refresh_node_health(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    actor: str,
    now: dt.datetime,
    staleness_s: float,
    open_findings: Sequence[FindingRow] | None = None,
) -> bool:
    """Recompute a node's and its GPUs' health from its open findings, its report
    freshness and its GPU count. True when the node's health changed.

    ``open_findings``: the node's open findings when the caller holds them already (the
    agent ingest); None reads them (after a flush, so this transaction's changes count).
    """
    if open_findings is None:
        await session.flush()
        open_findings = list(
            await session.scalars(
                select(FindingRow).where(
                    FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None)
                )
            )
        )
    gpus = list(
        await session.scalars(
            select(GpuRow).where(GpuRow.node_id == node.id, GpuRow.removed_at.is_(None))
        )
    )
    for gpu in gpus:
        gpu.health = health_from_severities(
            Severity(f.severity) for f in open_findings if f.gpu_uuid == gpu.uuid
        ).value
    reporting = sum(1 for g in gpus if g.sampled_at is not None)
    target = node_health(
        last_report_at=node.last_report_at,
        now=now,
        staleness_s=staleness_s,
        expected_gpus=node.expected_gpus,
        reporting_gpus=reporting if node.last_report_at else node.expected_gpus,
        finding_severities=[Severity(f.severity) for f in open_findings],
    )
    return set_node_health(
        session, node=node, project_id=project_id, target=target, actor=actor, now=now
    )


def set_node_health(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    target: Health,
    actor: str,
    now: dt.datetime,
    reason: str = "",
) -> bool:
    """Set a node's health, with its event. True when it changed; the same health again
    writes nothing."""
    values = _change(node, target=target, now=now, reason=reason)
    if values is None:
        return False
    record_event(
        session,
        kind=EventKind.NODE_HEALTH,
        message=values["message"],
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=actor,
        data=values["data"],
        ts=now,
    )
    return True


def stage_node_health(
    node: NodeRow,
    *,
    updates: dict[str, Any],
    project_id: str,
    target: Health,
    actor: str,
    now: dt.datetime,
    reason: str = "",
) -> dict[str, Any] | None:
    """``set_node_health`` for a caller that writes nodes and events set-wise.

    Puts the health into ``updates`` (the caller's column values for the node's row,
    written whether or not it changed, so the newest report wins a race between
    replicas) and changes ``node`` in memory; returns the ``event`` row's values when the
    health changed, for the caller to insert with its other events."""
    updates["health"] = target.value
    values = _change(node, target=target, now=now, reason=reason)
    if values is None:
        return None
    return {
        "id": new_id(),
        "ts": now,
        "kind": EventKind.NODE_HEALTH.value,
        "project_id": project_id,
        "cluster_id": node.cluster_id,
        "node_id": node.id,
        "actor": actor,
        **values,
    }


def _change(
    node: NodeRow, *, target: Health, now: dt.datetime, reason: str
) -> dict[str, Any] | None:
    """Apply the change to ``node``; the event's message and data, or None if no change."""
    old = node.health
    if target.value == old:
        return None
    node.health = target.value
    node.updated_at = now
    data: dict[str, Any] = {"from": old, "to": target.value}
    if reason:
        data["reason"] = reason
    return {
        "message": f"node {node.name} health: {old} → {target.value}"
        + (f" ({reason})" if reason else ""),
        "data": data,
    }


__all__ = ["refresh_node_health", "set_node_health", "stage_node_health"]
