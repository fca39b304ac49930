"""What every state change writes: one timeline event and one audit row, alike."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.events import record_event


@dataclass(frozen=True)
class Change:
    """A state change of one object: ``entity`` is "cluster" or "node"."""

    entity: str
    object_id: str
    name: str
    project_id: str
    cluster_id: str
    node_id: str | None
    old: str
    new: str


def record_transition(
    session: AsyncSession,
    *,
    change: Change,
    kind: EventKind,
    actor: str,
    reason: str,
    now: dt.datetime,
    source_ip: str | None = None,
) -> None:
    detail = {"from": change.old, "to": change.new, "reason": reason}
    record_event(
        session,
        kind=kind,
        message=f"{change.entity} {change.name}: {change.old} → {change.new}: {reason}",
        project_id=change.project_id,
        cluster_id=change.cluster_id,
        node_id=change.node_id,
        actor=actor,
        data=detail,
        ts=now,
    )
    record_audit(
        session,
        actor=actor,
        action=f"{change.entity}.state" if change.entity == "node" else f"{change.entity}.status",
        object_type=change.entity,
        object_id=change.object_id,
        project_id=change.project_id,
        source_ip=source_ip,
        detail=detail,
    )
