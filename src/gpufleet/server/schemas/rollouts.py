"""Bodies and answers of ``/api/v1/clusters/{id}/rollouts`` and ``/api/v1/rollouts``: a
cluster's migration to another stack inside maintenance windows."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, Field

from gpufleet.core.enums import RolloutNodeStatus, RolloutStatus
from gpufleet.core.stacks import STACK_NAME
from gpufleet.core.windows import Window
from gpufleet.server.schemas.common import Request

Reason = Annotated[str, Field(max_length=2000)]


class CreateRolloutRequest(Request):
    """Migrate the cluster to ``to_stack`` inside ``window`` (``2026-12-06T02:00/2h``
    once; ``sat 02:00/4h``, ``mon,wed 22:00/3h`` or ``daily 01:00/90m`` every week or
    day), local time in ``tz``; at most ``max_unavailable`` nodes (``2`` or ``25%``) out
    at once; paused after ``failure_budget`` nodes fail."""

    to_stack: Annotated[str, Field(pattern=STACK_NAME)]
    window: Annotated[str, Field(min_length=1, max_length=120)]
    tz: Annotated[str, Field(min_length=1, max_length=64)] = "UTC"
    max_unavailable: Annotated[str, Field(min_length=1, max_length=8)] = "1"
    failure_budget: Annotated[int, Field(ge=1, le=10_000)] = 1
    reason: Reason = ""


class RolloutActionRequest(Request):
    """Pause, resume or abort a rollout; ``retry_failed`` (resume) gives failed nodes
    another try."""

    reason: Reason = ""
    retry_failed: bool = False


class RollbackRequest(Request):
    reason: Reason = ""


class Opening(BaseModel):
    start: dt.datetime
    end: dt.datetime


class RolloutNode(BaseModel):
    node_id: str
    node_name: str
    position: int
    status: RolloutNodeStatus
    from_stack: str | None
    repair_id: str | None
    repair_status: str | None  # the migration's repair, while it has one
    attempts: int
    detail: str
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class Rollout(BaseModel):
    id: str
    cluster_id: str
    cluster_name: str
    from_stack: str | None
    to_stack: str
    status: RolloutStatus
    window: Window
    window_text: str  # the window as a person reads it
    open_now: bool
    next_opening: Opening | None  # the current opening, else the next (None: no more)
    max_unavailable: str
    failure_budget: int
    failures: int
    reservation: str  # the scheduler's maintenance reservation, "" for none
    counts: dict[str, int]  # nodes by status
    detail: str
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    nodes: list[RolloutNode]
