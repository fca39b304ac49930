"""The one function every lifecycle changes state through (DESIGN "One owner per
lifecycle"): the target checked against the lifecycle's table in ``core/transitions.py``,
the row's state column set, and exactly one timeline event and one audit row written,
both stamped with the caller's clock.

Each entity has a thin wrapper in its own service (``switch_node_state``,
``switch_repair_status``, ``switch_cluster_status``, ``switch_command_status``,
``switch_check_status``, ``switch_acceptance_status``/``_stage``,
``switch_startup_status``) that names the row for the event (``Subject``) and applies
the entity's own side effects (``finished_at``, ``removed_at``, a check run's lease
released...) after a change. No other module assigns a lifecycle's state column: a test
(``tests/server/test_status_owner.py``) scans ``src/`` for it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind
from gpufleet.core.transitions import Lifecycle, check_transition
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.events import record_event

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True)
class Subject:
    """The row whose state changes, as its event and audit row name it."""

    object_id: str
    label: str  # "node train-000", "check run 01J… (nccl)": in messages and errors
    project_id: str
    cluster_id: str | None  # None: an object of no cluster (an unassigned host)
    node_id: str | None
    ids: Mapping[str, str] = field(default_factory=dict)  # e.g. {"command_id": …}, in data


def transition(
    session: AsyncSession,
    *,
    lifecycle: Lifecycle[S],
    row: object,
    subject: Subject,
    target: S,
    actor: str,
    reason: str,
    now: dt.datetime,
    source_ip: str | None = None,
    data: Mapping[str, Any] | None = None,
    kind: EventKind | None = None,
    message: str | None = None,
) -> bool:
    """Move ``row`` to ``target``. False, and nothing written, if it already is there.

    Raises ``InvalidTransition`` (a ``Conflict``) naming the allowed targets when the
    table has no such move. ``data`` adds to the event's data and the audit detail;
    ``kind`` and ``message`` replace the lifecycle's event kind and the standard
    ``"<label>: <from> → <to>: <reason>"`` message where a change has a name of its own
    (an acceptance run's end is ``acceptance.finished``).
    """
    current = lifecycle.states(getattr(row, lifecycle.column))
    check_transition(lifecycle.table, entity=subject.label, current=current, target=target)
    if current is target:
        return False
    setattr(row, lifecycle.column, target.value)
    detail: dict[str, Any] = {
        **subject.ids,
        "from": current.value,
        "to": target.value,
        "reason": reason,
        **(data or {}),
    }
    record_event(
        session,
        kind=kind or lifecycle.event_kind,
        message=message or f"{subject.label}: {current.value} → {target.value}: {reason}",
        project_id=subject.project_id,
        cluster_id=subject.cluster_id,
        node_id=subject.node_id,
        actor=actor,
        data=detail,
        ts=now,
    )
    record_audit(
        session,
        actor=actor,
        action=lifecycle.audit_action,
        object_type=lifecycle.object_type,
        object_id=subject.object_id,
        project_id=subject.project_id,
        source_ip=source_ip,
        detail=dict(detail),
        ts=now,
    )
    return True
