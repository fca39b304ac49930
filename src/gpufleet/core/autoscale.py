"""The autoscaling policy: how many nodes to add and which to remove, from what waits and
what idles. Pure: the server's autoscaler and ``bench/autoscale.py`` call the same
``decide``, so the bench measures the policy the product runs.

Rules (an operator of a large GPU fleet pays for every idle GPU-hour, and loses more when
a node is taken from under a job):

- **Up** when GPU work has been pending longer than ``scale_up_after_s``: the nodes it
  needs (a job bigger than a node takes whole nodes; smaller ones are packed) less those
  already on their way (provisioning, in acceptance) and those free in service (the work
  waits for them and more), at most ``max_step`` per decision,
  never over ``max_nodes``, and not within ``up_cooldown_s`` of the last step up. Work
  that could not fit even at ``max_nodes`` is named and does not count.
- **Down** only while nothing waits, not within ``down_cooldown_s`` of any step, never
  under ``min_nodes``: the nodes idle longest first, each idle (no job) for at least
  ``scale_down_after_s``, in service, and with no open repair, no acceptance run and no
  hold. A node that runs a job, is being repaired, is in acceptance, or is still coming is
  never removed.
- Under ``min_nodes`` (a cluster after removals or failures), up to it at once.

Every decision carries its reasons: the pending work and its GPUs, the idle times.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class AutoscalePolicy:
    """One cluster's autoscaling settings."""

    min_nodes: int
    max_nodes: int
    scale_up_after_s: float = 120.0  # work pending this long asks for nodes
    scale_down_after_s: float = 1800.0  # a node idle this long may go
    up_cooldown_s: float = 300.0  # between two steps up
    down_cooldown_s: float = 600.0  # after any step, before a step down
    max_step: int = 8  # nodes added (or removed) by one decision

    def __post_init__(self) -> None:
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise ValueError(
                f"need 0 <= min_nodes <= max_nodes, got {self.min_nodes} and {self.max_nodes}"
            )
        if self.max_step < 1:
            raise ValueError(f"max_step must be at least 1, got {self.max_step}")
        for name in ("scale_up_after_s", "scale_down_after_s", "up_cooldown_s", "down_cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


class NodePhase(StrEnum):
    COMING = "coming"  # provisioning or in acceptance: capacity on its way
    IN_SERVICE = "in_service"
    HELD = "held"  # cordoned, drained, being repaired: not capacity, not removable


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    phase: NodePhase
    busy: bool = False  # a job runs on it
    idle_since: dt.datetime | None = None  # when its last job ended (or it came up)
    repairing: bool = False  # an open repair
    accepting: bool = False  # an acceptance run


@dataclass(frozen=True, slots=True)
class PendingWork:
    """A job or pod that waits for GPUs."""

    id: str
    gpus: int
    since: dt.datetime


@dataclass(frozen=True, slots=True)
class ScaleState:
    nodes: Sequence[NodeView]
    pending: Sequence[PendingWork]
    gpus_per_node: int
    now: dt.datetime
    last_up_at: dt.datetime | None = None
    last_down_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    add: int = 0
    remove: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return self.add > 0 or bool(self.remove)


def nodes_for(work: PendingWork, gpus_per_node: int) -> int:
    """Whole nodes a job needs when nothing else runs there."""
    return max(1, math.ceil(work.gpus / gpus_per_node))


def nodes_needed(work: Sequence[PendingWork], gpus_per_node: int) -> int:
    """Nodes that would start all of ``work``: a job bigger than a node takes whole nodes;
    the smaller ones share (their GPUs packed, rounded up to whole nodes)."""
    big = sum(nodes_for(w, gpus_per_node) for w in work if w.gpus > gpus_per_node)
    small = sum(w.gpus for w in work if w.gpus <= gpus_per_node)
    return big + math.ceil(small / gpus_per_node)


def decide(policy: AutoscalePolicy, state: ScaleState) -> Decision:
    """What to do now (module doc). Pure: the same state gives the same decision."""
    now = state.now
    live = len(state.nodes)
    coming = sum(1 for n in state.nodes if n.phase is NodePhase.COMING)
    reasons: list[str] = []

    if live < policy.min_nodes:
        add = min(policy.min_nodes - live, policy.max_nodes - live)
        return Decision(
            add=add, reasons=(f"{live} node(s), under the minimum of {policy.min_nodes}",)
        )

    fits = [w for w in state.pending if w.gpus <= policy.max_nodes * state.gpus_per_node]
    for work in state.pending:
        if work not in fits:
            reasons.append(
                f"{work.id} wants {work.gpus} GPUs: more than {policy.max_nodes} node(s) of "
                f"{state.gpus_per_node} hold; not counted"
            )
    waiting = [w for w in fits if (now - w.since).total_seconds() >= policy.scale_up_after_s]

    if waiting:
        needed = nodes_needed(waiting, state.gpus_per_node)
        gpus = sum(w.gpus for w in waiting)
        listing = _listing(waiting, now)
        room = policy.max_nodes - live
        # A free node in service counts too: the work waits for it and more (a job of
        # two nodes with one free needs one more, not two).
        free = sum(1 for n in state.nodes if n.phase is NodePhase.IN_SERVICE and not n.busy)
        add = min(needed - coming - free, policy.max_step, room)
        if _within(now, state.last_up_at, policy.up_cooldown_s):
            reasons.append(
                f"{len(waiting)} job(s) wait for {gpus} GPUs ({listing}); in the cooldown "
                f"after the last step up ({policy.up_cooldown_s:.0f} s)"
            )
            return Decision(reasons=tuple(reasons))
        if add <= 0:
            why = (
                f"at the maximum of {policy.max_nodes} node(s)"
                if room <= 0
                else f"{coming} node(s) already on their way and {free} free"
            )
            reasons.append(f"{len(waiting)} job(s) wait for {gpus} GPUs ({listing}); {why}")
            return Decision(reasons=tuple(reasons))
        reasons.append(
            f"{len(waiting)} job(s) wait for {gpus} GPUs ({listing}): {needed} node(s) "
            f"needed, {coming} on their way, {free} free; adding {add}"
            + (f" (at most {policy.max_step} a step)" if add == policy.max_step else "")
            + (f" (the maximum is {policy.max_nodes})" if add == room else "")
        )
        return Decision(add=add, reasons=tuple(reasons))

    if state.pending:
        reasons.append(
            f"{len(state.pending)} job(s) pending for less than {policy.scale_up_after_s:.0f} s; "
            "no step down while work waits"
        )
        return Decision(reasons=tuple(reasons))
    last_step = max((t for t in (state.last_up_at, state.last_down_at) if t), default=None)
    if _within(now, last_step, policy.down_cooldown_s):
        return Decision(reasons=tuple(reasons))
    idle = sorted(
        (
            n
            for n in state.nodes
            if removable(n)
            and n.idle_since is not None
            and (now - n.idle_since).total_seconds() >= policy.scale_down_after_s
        ),
        key=lambda n: (n.idle_since, n.name),
    )
    spare = live - policy.min_nodes
    take = idle[: max(0, min(spare, policy.max_step))]
    if take:
        shown = ", ".join(f"{n.name} idle {_age(now, n.idle_since)}" for n in take[:5])
        more = f" and {len(take) - 5} more" if len(take) > 5 else ""
        reasons.append(
            f"nothing waits; {len(take)} node(s) idle for over "
            f"{policy.scale_down_after_s:.0f} s: {shown}{more}"
        )
    return Decision(remove=tuple(n.name for n in take), reasons=tuple(reasons))


def removable(node: NodeView) -> bool:
    """A node the autoscaler may take away: in service, no job, no repair, no acceptance."""
    return (
        node.phase is NodePhase.IN_SERVICE
        and not node.busy
        and not node.repairing
        and not node.accepting
    )


def _within(now: dt.datetime, then: dt.datetime | None, seconds: float) -> bool:
    return then is not None and (now - then).total_seconds() < seconds


def _age(now: dt.datetime, since: dt.datetime | None) -> str:
    seconds = 0.0 if since is None else (now - since).total_seconds()
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _listing(work: Sequence[PendingWork], now: dt.datetime) -> str:
    shown = ", ".join(f"{w.id}: {w.gpus} GPUs for {_age(now, w.since)}" for w in work[:5])
    return shown + (f" and {len(work) - 5} more" if len(work) > 5 else "")
