"""The simulator's mutable state: nodes, faults, the job, and what it counts."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.core.repair.models import FindingFact
from gpufleet.fleetsim.faults import FaultDraw
from gpufleet.fleetsim.model import Fix

# Simulated seconds become datetimes only where core's policy takes them.
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def timestamp(seconds: float) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


def seconds(when: dt.datetime) -> float:
    return (when - EPOCH).total_seconds()


class Role(StrEnum):
    JOB = "job"
    SPARE = "spare"
    OUT = "out"


class Holder(StrEnum):
    """Who keeps a node out of the job."""

    NONE = ""
    FRAMEWORK = "framework"  # the job framework excluded the host its error named
    HUMAN = "human"  # a person found it
    GPUFLEET = "gpufleet"  # cordoned by a repair (or left cordoned by a failed one)
    SERVICE = "service"  # removed for hardware service


@dataclass(slots=True, eq=False)
class Fault:
    id: int
    draw: FaultDraw
    fix: Fix
    nodes: set[int]
    started: float
    human_scheduled: bool = False

    @property
    def cause(self) -> str:
        return self.draw.cause.name


@dataclass(slots=True, eq=False)
class Node:
    index: int
    id: str
    leaf: str
    role: Role = Role.SPARE
    slot: int = -1
    fault: Fault | None = None
    holder: Holder = Holder.NONE
    host_seq: int = 0
    findings: list[FindingFact] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"{self.id}/h{self.host_seq}"


@dataclass(slots=True)
class Interruption:
    cause: str
    start: float
    rollback_s: float
    end: float | None = None


@dataclass(slots=True)
class Job:
    running: bool = False
    run_start: float = 0.0
    productive_s: float = 0.0
    notice_at: float = 0.0  # the job may not restart before it noticed the failure
    manual_ok_at: float = 0.0  # ... nor, without automation, before a person restarts it
    restart_pending: bool = False
    token: int = 0
    current: Interruption | None = None


@dataclass(slots=True)
class Counts:
    actions: Counter[str] = field(default_factory=Counter)  # gpufleet node repairs, by action
    human_fixes: int = 0
    human_approvals: int = 0
    triage: int = 0
    not_needed: int = 0
    insufficient: int = 0
    incidents: int = 0
    breaker_trips: int = 0
    recurrences: int = 0
    skipped_faults: int = 0  # drawn on an empty slot or a node already broken
    plan_calls: int = 0
