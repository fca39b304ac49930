"""How an acceptance run's status and stage change: the one way each moves, checked
against ``core.transitions`` (``ACCEPTANCE_TRANSITIONS``, ``ACCEPTANCE_STAGE_TRANSITIONS``),
each change one event and one audit row (``services/transitions.py``).

Status: pending → running → passed | failed | error | cancelled. Stage, forward only:
node → cluster → gating → done (see ``workers/acceptance/``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.acceptance import OPEN_STATUSES, AcceptanceStatus
from gpufleet.core.enums import AcceptanceStage, EventKind
from gpufleet.core.transitions import ACCEPTANCE_RUN, ACCEPTANCE_RUN_STAGE
from gpufleet.server.db.tables import AcceptanceRunRow
from gpufleet.server.services.transitions import Subject, transition


def _subject(run: AcceptanceRunRow, project_id: str) -> Subject:
    return Subject(
        object_id=run.id,
        label=f"acceptance run {run.id} ({run.trigger})",
        project_id=project_id,
        cluster_id=run.cluster_id,
        node_id=run.node_ids[0] if len(run.node_ids) == 1 else None,
        ids={"acceptance_run_id": run.id},
    )


def switch_acceptance_status(
    session: AsyncSession,
    *,
    run: AcceptanceRunRow,
    project_id: str,
    target: AcceptanceStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
    data: dict[str, Any] | None = None,
    kind: EventKind | None = None,
    message: str | None = None,
) -> bool:
    """The one way a run's status changes. False if unchanged. ``kind``/``message``: the
    end of a run is recorded as ``acceptance.finished`` with its verdict."""
    if not transition(
        session, lifecycle=ACCEPTANCE_RUN, row=run, subject=_subject(run, project_id),
        target=target, actor=actor, reason=reason, now=now, data=data, kind=kind,
        message=message,
    ):  # fmt: skip
        return False
    run.updated_at = now
    if target is AcceptanceStatus.RUNNING and run.started_at is None:
        run.started_at = now
    if target not in OPEN_STATUSES:
        run.finished_at = now
    return True


def switch_acceptance_stage(
    session: AsyncSession,
    *,
    run: AcceptanceRunRow,
    project_id: str,
    target: AcceptanceStage,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> bool:
    """The one way a run moves to its next stage. False if it already is there."""
    if not transition(
        session, lifecycle=ACCEPTANCE_RUN_STAGE, row=run, subject=_subject(run, project_id),
        target=target, actor=actor, reason=reason, now=now,
    ):  # fmt: skip
        return False
    run.updated_at = now
    return True
