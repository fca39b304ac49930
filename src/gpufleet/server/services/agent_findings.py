"""Finding changes from agents: fold, open, clear — each change exactly once, in order.

Every change carries the agent's finding ``seq``; the node row keeps the highest applied
one, so a replay after a timeout or a spool replay after an outage changes nothing twice.
The whole batch, the node's new health and the events commit in one transaction; the
findings service folds, opens and clears (the agent's running count: a fold keeps the
larger count), the node health service writes the health.

A finding the server closed while the agent's episode went on (a repair closes the
node's findings when it acts; the agent, even rebooted, keeps counting the episode it
has open) opens again at the next sighting, counting only what came after: the agent's
running count less what the closed findings of that episode counted (kept on the new
finding as its ``count_offset``).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import FindingAck, FindingBatch, FindingReport, FindingState
from gpufleet.core.errors import Conflict
from gpufleet.server.db.tables import FindingRow
from gpufleet.server.services.findings import (
    Sighting,
    clear_finding,
    open_findings,
    open_or_fold_finding,
)
from gpufleet.server.services.node_callers import NodeCaller, node_of_caller
from gpufleet.server.services.node_health import refresh_node_health


async def apply_finding_batch(
    session: AsyncSession,
    *,
    caller: NodeCaller,
    batch: FindingBatch,
    now: dt.datetime,
    staleness_s: float,
) -> FindingAck:
    # The node row stays locked to the commit: batches of one node apply one at a time,
    # each seeing the last one's ``last_finding_seq``.
    node = await node_of_caller(session, caller, for_update=True)
    project_id = caller.project_id
    seqs = [f.seq for f in batch.findings]
    if len(seqs) != len(set(seqs)):
        raise Conflict("finding changes in one batch must have distinct seq", field="seq")
    fresh = sorted(
        (f for f in batch.findings if f.seq > node.last_finding_seq), key=lambda f: f.seq
    )
    open_rows: dict[str | None, FindingRow] = {
        row.fold_key: row for row in await open_findings(session, node_ids=[node.id])
    }
    actor = f"node:{node.name}"
    for change in fresh:
        if change.state is FindingState.OPEN:
            open_row = open_rows.get(change.key)
            counted = 0 if open_row is not None else await _counted_before(session, node.id, change)
            open_rows[change.key] = open_or_fold_finding(
                session,
                node=node,
                project_id=project_id,
                open_row=open_row,
                sighting=_sighting(change, counted=counted),
                actor=actor,
                now=now,
            )
            continue
        row = open_rows.get(change.key)
        if row is not None and clear_finding(
            session,
            row=row,
            node=node,
            project_id=project_id,
            at=change.last_seen,
            actor=actor,
            episode_began=change.first_seen,
            last_sighting=change.last_seen,
        ):
            del open_rows[change.key]
        # else nothing open under that key (clearing twice is harmless), or the clear
        # ends an earlier episode than the open one
    if fresh:
        node.last_finding_seq = fresh[-1].seq
        await refresh_node_health(
            session,
            node=node,
            project_id=project_id,
            actor=actor,
            now=now,
            staleness_s=staleness_s,
            open_findings=list(open_rows.values()),
        )
    return FindingAck(
        node_id=node.id,
        accepted=len(fresh),
        duplicates=len(batch.findings) - len(fresh),
        last_seq=node.last_finding_seq,
    )


async def _counted_before(session: AsyncSession, node_id: str, change: FindingReport) -> int:
    """What the closed findings of this agent episode (same key, same first sighting)
    counted: the server closed them while the episode went on. Asked only when a change
    opens a finding, never for a fold."""
    counted = await session.scalar(
        select(func.coalesce(func.sum(FindingRow.count), 0)).where(
            FindingRow.node_id == node_id,
            FindingRow.fold_key == change.key,
            FindingRow.first_seen == change.first_seen,
            FindingRow.cleared_at.is_not(None),
        )
    )
    return int(counted or 0)


def _sighting(change: FindingReport, *, counted: int = 0) -> Sighting:
    return Sighting(
        key=change.key,
        signature_id=change.signature_id,
        title=change.title or change.signature_id,
        severity=change.severity,
        source=change.source,
        evidence=change.evidence,
        first_seen=change.first_seen,
        last_seen=change.last_seen,
        # The agent's detector counts the episode itself and re-sends its running count.
        running_count=change.count,
        counted_before=counted,
        gpu_uuid=change.gpu_uuid,
        gpu_index=change.gpu_index,
        pci_bus_id=change.pci_bus_id,
        component=change.component,
    )


__all__ = ["apply_finding_batch"]
