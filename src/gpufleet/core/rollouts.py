"""A stack rollout as the API answers it (``/api/v1/clusters/{id}/rollouts``,
``/api/v1/rollouts/{id}``): a cluster's migration to another stack inside maintenance
windows (``core/windows.py``), node by node, with each node's progress.

The server answers with these and the client and the CLI read them
(tests/client/test_types.py: the API's answers live in ``core``).
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict

from gpufleet.core.enums import RolloutNodeStatus, RolloutStatus, WindowClose
from gpufleet.core.windows import Window


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


class Opening(_Answer):
    start: dt.datetime
    end: dt.datetime


class RolloutNode(_Answer):
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


class Rollout(_Answer):
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
    on_window_close: WindowClose
    reservation: str  # the scheduler's maintenance reservation, "" for none
    counts: dict[str, int]  # nodes by status
    detail: str
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    nodes: list[RolloutNode]
