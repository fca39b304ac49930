"""Bodies of ``/api/v1/clusters/{id}/rollouts`` and ``/api/v1/rollouts`` (a cluster's
migration to another stack inside maintenance windows); the answers are
``core.rollouts``'s."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet.core.enums import WindowClose
from gpufleet.core.rollouts import Opening, Rollout, RolloutNode
from gpufleet.core.stacks import STACK_NAME
from gpufleet.server.schemas.common import Request

__all__ = ["CreateRolloutRequest", "Opening", "RollbackRequest", "Rollout",
           "RolloutActionRequest", "RolloutNode"]  # fmt: skip

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
    on_window_close: WindowClose = WindowClose.WAIT
    reason: Reason = ""


class RolloutActionRequest(Request):
    """Pause, resume or abort a rollout; ``retry_failed`` (resume) gives failed nodes
    another try."""

    reason: Reason = ""
    retry_failed: bool = False


class RollbackRequest(Request):
    reason: Reason = ""
