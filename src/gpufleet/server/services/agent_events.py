"""Timeline events from agents: each event id stored once, on the node's cluster.

The agent (and the helpers it runs, such as ``gpufleet slurm epilog``) makes the id, so a
batch resent after a lost answer adds nothing. An id already held, by any event, counts
as a duplicate: a node can only ever lose its own event by reusing an id.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import EventAck, EventBatch
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import Conflict
from gpufleet.server.db.tables import EventRow
from gpufleet.server.services.node_callers import NodeCaller


async def apply_event_batch(
    session: AsyncSession, *, caller: NodeCaller, batch: EventBatch
) -> EventAck:
    ids = [e.id for e in batch.events]
    if len(ids) != len(set(ids)):
        raise Conflict("events in one batch must have distinct ids", field="id")
    held = set(await session.scalars(select(EventRow.id).where(EventRow.id.in_(ids))))
    fresh = [e for e in batch.events if e.id not in held]
    for event in fresh:
        session.add(
            EventRow(
                id=event.id,
                ts=event.at,
                kind=EventKind(event.kind.value).value,
                message=event.message,
                project_id=caller.project_id,
                cluster_id=caller.cluster_id,
                node_id=caller.node_id,
                actor=f"agent:{caller.node_id}",
                data={**event.data, "source": "agent"},
            )
        )
    return EventAck(node_id=caller.node_id, accepted=len(fresh), duplicates=len(ids) - len(fresh))
