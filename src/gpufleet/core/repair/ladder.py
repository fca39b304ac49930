"""How drastic an action is, the escalation ladder, and the small formatting helpers the
policy's ``rule`` strings share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.core.enums import RepairAction
from gpufleet.core.repair.models import (
    ENDED_STATUSES,
    LADDER,
    NODE_ACTIONS,
    RepairFact,
    RepairKind,
)

# Every action from least to most drastic; ``RepairAction`` is declared in that order.
_ORDER: tuple[RepairAction, ...] = tuple(RepairAction)


def rank(action: RepairAction) -> int:
    """Position of ``action`` from least (``none``) to most drastic (``remove``)."""
    return _ORDER.index(action)


def most_drastic(first: RepairAction, *others: RepairAction) -> RepairAction:
    return max((first, *others), key=rank)


def next_rung(action: RepairAction) -> RepairAction:
    """The next step of ``LADDER`` above ``action``; ``remove`` stays ``remove``, and an
    action below the ladder (``none``, ``restart_workload``) enters it at ``reset_gpu``."""
    if action not in NODE_ACTIONS:
        return LADDER[0]
    return LADDER[min(LADDER.index(action) + 1, len(LADDER) - 1)]


@dataclass(frozen=True, slots=True)
class LadderStep:
    """The host's most drastic ended repair within the window, and the rung after it."""

    previous: RepairFact
    action: RepairAction


def ladder_step(
    host: str, repairs: Iterable[RepairFact], *, now: dt.datetime, window_s: float
) -> LadderStep | None:
    """The rung the host's history asks for, or ``None`` when the host has no node repair
    that succeeded or failed within ``window_s``. History follows the host, not the
    node: a failover puts the node on a new host, which starts clean."""
    previous: RepairFact | None = None
    for repair in repairs:
        if (
            repair.kind is not RepairKind.NODE
            or repair.host != host
            or repair.status not in ENDED_STATUSES
            or repair.finished_at is None
            or seconds_between(repair.finished_at, now) > window_s
        ):
            continue
        if previous is None or _ladder_key(repair) > _ladder_key(previous):
            previous = repair
    if previous is None:
        return None
    return LadderStep(previous=previous, action=next_rung(previous.action))


def _ladder_key(repair: RepairFact) -> tuple[int, dt.datetime, str]:
    # The most drastic action wins; among equals the most recent one is named in the rule.
    assert repair.finished_at is not None  # filtered by the caller
    return (rank(repair.action), repair.finished_at, repair.id)


def seconds_between(earlier: dt.datetime, later: dt.datetime) -> float:
    return (later - earlier).total_seconds()


def format_duration(seconds: float) -> str:
    """A short human duration for rule strings: ``45s``, ``12m``, ``2h``, ``7d``."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d"
