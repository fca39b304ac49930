"""Findings: the one writer of a finding's state, and the listing.

Three sources change findings, all through the functions here:

* the agent's detectors (``agent_findings``): a sighting carries the agent's running
  ``count`` of the episode, so a fold keeps the larger count (a re-sent change never adds);
  a clear carries when its episode began and ends only an episode that began no later;
* active checks (``check_findings``): a failing run is one more occurrence (count + 1);
  a passing run clears;
* repairs: a verified (or final) repair closes the node's open findings.

Open-or-fold: one open finding per node and fold key; a sighting under an open key folds
into it (count as above, ``last_seen`` and severity only grow, new evidence replaces the
old); otherwise it opens a new finding with a ``finding.opened`` event. A clear stamps
``cleared_at`` (never before ``first_seen``) with a ``finding.cleared`` event. ``last_seen``
is when the fault was last observed: a clear moves it only by the sighting it carries.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, FindingSource, Severity, worse
from gpufleet.core.errors import InvalidInput
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Finding, Page
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.events import record_event


@dataclass(frozen=True)
class Sighting:
    """A fault one source saw on a node, under its fold key."""

    key: str
    signature_id: str
    title: str
    severity: Severity
    source: FindingSource
    evidence: str
    first_seen: dt.datetime
    last_seen: dt.datetime
    # The reporter's own running count of this episode (the agent's detector), or None:
    # this sighting is one more occurrence (an active check that failed again).
    running_count: int | None = None
    # For an agent's sighting that opens a finding: what findings of the same episode the
    # server closed before counted (its running count goes on from there).
    counted_before: int = 0
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    pci_bus_id: str | None = None
    component: str | None = None


async def open_findings(
    session: AsyncSession,
    *,
    node_ids: Iterable[str],
    signature_ids: Iterable[str] | None = None,
) -> list[FindingRow]:
    """The open findings of these nodes (of these signatures, if given)."""
    query = select(FindingRow).where(
        FindingRow.node_id.in_(list(node_ids)), FindingRow.cleared_at.is_(None)
    )
    if signature_ids is not None:
        query = query.where(FindingRow.signature_id.in_(list(signature_ids)))
    return list(await session.scalars(query))


def open_or_fold_finding(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    open_row: FindingRow | None,
    sighting: Sighting,
    actor: str,
    now: dt.datetime,
    context: str = "",
    data: dict[str, Any] | None = None,
) -> FindingRow:
    """Fold ``sighting`` into ``open_row`` (the node's open finding under its key, which
    the caller looked up), or open a new finding. Returns the finding.

    ``context`` ends the ``finding.opened`` message (", check run …"); ``data`` is added to
    the event's data."""
    if open_row is not None:
        _fold(open_row, sighting)
        return open_row
    row = FindingRow(
        id=new_id(),
        cluster_id=node.cluster_id,
        node_id=node.id,
        gpu_uuid=sighting.gpu_uuid,
        fold_key=sighting.key,
        gpu_index=sighting.gpu_index,
        pci_bus_id=sighting.pci_bus_id,
        component=sighting.component,
        signature_id=sighting.signature_id,
        title=sighting.title,
        severity=sighting.severity.value,
        source=sighting.source.value,
        evidence=sighting.evidence,
        count=(
            1
            if sighting.running_count is None
            else max(1, sighting.running_count - sighting.counted_before)
        ),
        count_offset=sighting.counted_before,
        first_seen=sighting.first_seen,
        last_seen=sighting.last_seen,
        cleared_at=None,
    )
    session.add(row)
    where = f" GPU {sighting.gpu_index}" if sighting.gpu_index is not None else ""
    where += f" {sighting.component}" if sighting.component else ""
    record_event(
        session,
        kind=EventKind.FINDING_OPENED,
        message=f"node {node.name}{where}: {row.title} ({row.severity})"
        + (f", {context}" if context else ""),
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=actor,
        data={
            "finding_id": row.id,
            "signature": row.signature_id,
            "severity": row.severity,
            "gpu_uuid": row.gpu_uuid,
            "evidence": row.evidence[:500],
            **(data or {}),
        },
        ts=now,
    )
    return row


def _fold(row: FindingRow, sighting: Sighting) -> None:
    if sighting.running_count is None:
        row.count += 1
    else:
        row.count = max(row.count, sighting.running_count - row.count_offset)
    row.last_seen = max(row.last_seen, sighting.last_seen)
    row.evidence = sighting.evidence or row.evidence
    row.severity = worse(Severity(row.severity), sighting.severity).value


def clear_finding(
    session: AsyncSession,
    *,
    row: FindingRow,
    node: NodeRow,
    project_id: str,
    at: dt.datetime,
    actor: str,
    why: str = "",
    episode_began: dt.datetime | None = None,
    last_sighting: dt.datetime | None = None,
    data: dict[str, Any] | None = None,
) -> bool:
    """Clear an open finding at ``at``, with its event. False when the clear is not this
    finding's: ``episode_began`` (when the clearing reporter's episode began) is earlier
    than the finding's ``first_seen``: it ends an earlier episode under the same key.

    ``last_sighting``: when the reporter last observed the fault, if the clear says.
    ``why`` ends the event's message and is its data's ``reason``."""
    if episode_began is not None and episode_began < row.first_seen:
        # An agent that restarted without its memory re-sends clears it cannot know were
        # delivered: the end of an earlier episode says nothing about this one.
        return False
    row.cleared_at = max(at, row.first_seen)
    if last_sighting is not None:
        row.last_seen = max(row.last_seen, last_sighting)
    record_event(
        session,
        kind=EventKind.FINDING_CLEARED,
        message=f"node {node.name}: {row.title} cleared" + (f" ({why})" if why else ""),
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=actor,
        data={
            "finding_id": row.id,
            "signature": row.signature_id,
            **({"reason": why} if why else {}),
            **(data or {}),
        },
        ts=row.cleared_at,
    )
    return True


async def close_findings_for_repair(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    actor: str,
    why: str,
    now: dt.datetime,
    seen_before: dt.datetime | None = None,
) -> list[FindingRow]:
    """A repair closes the node's open findings (those last seen at or before
    ``seen_before``, if given: a fault seen after the repair acted is not fixed by it).
    Returns the findings closed."""
    query = select(FindingRow).where(FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None))
    if seen_before is not None:
        query = query.where(FindingRow.last_seen <= seen_before)
    closed = list(await session.scalars(query))
    for row in closed:
        clear_finding(
            session, row=row, node=node, project_id=project_id, at=now, actor=actor, why=why
        )
    return closed


def finding_row_to_finding(row: FindingRow) -> Finding:
    return Finding(
        id=row.id,
        cluster_id=row.cluster_id,
        node_id=row.node_id,
        gpu_uuid=row.gpu_uuid,
        gpu_index=row.gpu_index,
        pci_bus_id=row.pci_bus_id,
        component=row.component,
        signature_id=row.signature_id,
        title=row.title,
        severity=Severity(row.severity),
        source=FindingSource(row.source),
        evidence=row.evidence,
        count=row.count,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        cleared_at=row.cleared_at,
    )


async def list_findings(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str | None = None,
    node_id: str | None = None,
    gpu_uuid: str | None = None,
    signature_id: str | None = None,
    is_open: bool | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[Finding]:
    """Newest first; ``cursor`` is the last finding id of the previous page."""
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[FindingRow] = select(FindingRow).join(
        ClusterRow, ClusterRow.id == FindingRow.cluster_id
    )
    visible = caller.visible_project_ids()
    if visible is not None:
        query = query.where(ClusterRow.project_id.in_(visible))
    if cluster_id:
        query = query.where(FindingRow.cluster_id == cluster_id)
    if node_id:
        query = query.where(FindingRow.node_id == node_id)
    if gpu_uuid:
        query = query.where(FindingRow.gpu_uuid == gpu_uuid)
    if signature_id:
        query = query.where(FindingRow.signature_id == signature_id)
    if is_open is True:
        query = query.where(FindingRow.cleared_at.is_(None))
    elif is_open is False:
        query = query.where(FindingRow.cleared_at.is_not(None))
    if cursor:
        query = query.where(FindingRow.id < cursor)
    rows = (await session.scalars(query.order_by(FindingRow.id.desc()).limit(limit + 1))).all()
    items = [finding_row_to_finding(r) for r in rows[:limit]]
    return Page[Finding](items=items, next_cursor=items[-1].id if len(rows) > limit else None)
