"""What every check backend does: start a run's invocations, follow them, stop them.

A backend is told the run (``BackendJob``) and the handles it returned before, which the
runner stores on the run row (``progress["handles"]``), so a restarted server follows a
run it did not start. Every method is idempotent: calling ``start`` again for the same
run finds what the first call made instead of starting it twice.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.checks.aggregate import InvocationOutput
from gpufleet.checks.runners import CheckPlan, Launcher


@dataclass(frozen=True, slots=True)
class BackendJob:
    run_id: str
    cluster_id: str
    plan: CheckPlan
    node_ids: Mapping[str, str]  # node name → node id
    forced: bool
    now: dt.datetime


@dataclass(frozen=True, slots=True)
class Polled:
    """``done``: every invocation has ended (``outputs`` holds each)."""

    done: bool
    outputs: dict[str, InvocationOutput] = field(default_factory=dict)
    handles: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class StartRefused(Exception):
    """The backend could not start the run now (nodes became busy, the scheduler said
    no); the run stays pending and is tried again, up to a limit."""


class CheckBackend(Protocol):
    name: str
    launcher: Launcher

    async def start(self, job: BackendJob) -> dict[str, Any]:
        """Start what can start now; returns the handles to store. Raises
        ``StartRefused`` or ``DriverError``."""
        ...

    async def poll(self, job: BackendJob, handles: Mapping[str, Any]) -> Polled:
        """Where the run is; ends what is left over once it is done (a reservation)."""
        ...

    async def cancel(
        self, job: BackendJob, handles: Mapping[str, Any]
    ) -> dict[str, InvocationOutput]:
        """Stop everything still running; returns what output there is."""
        ...
