"""Evaluate the catalog's metric and state rules on samples. Pure; time is passed in.

One ``RuleTracker`` per (signature, GPU/port) keeps only what its rule needs, so memory
stays flat at 1 Hz sampling:

* value rules without a window: the current sample decides;
* value rules with ``window_s`` and ``min_count``: the window is cut into 10 buckets and
  a bucket counts once however many samples in it breach. That keeps the catalog's
  meaning ("6 of 10 one-minute samples", gpud's HW-slowdown rule) independent of the
  agent's sample rate: at 1 Hz, counting raw samples would fire after 6 seconds;
* delta rules: only the non-zero increases of the counter and their times are kept. A
  decrease is a reset or rollover (driver reload, ``perfquery -R``, 32-bit wrap) and
  counts as no increase, as the catalog says.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.agent.collectors.base import Condition
from gpufleet.core.signatures.models import MetricRule, StateRule

BUCKETS_PER_WINDOW = 10


def compare(op: str, left: float, right: float) -> bool:
    if op == ">":
        return left > right
    if op == ">=":
        return left >= right
    if op == "<":
        return left < right
    if op == "<=":
        return left <= right
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "&":
        return (int(left) & int(right)) != 0
    raise ValueError(f"unknown operator {op!r}")


@dataclass(slots=True)
class MetricTracker:
    rule: MetricRule
    buckets: deque[int] = field(default_factory=deque)
    increases: deque[tuple[float, float]] = field(default_factory=deque)
    last_value: float | None = None

    def evaluate(self, values: Mapping[str, float], t: float) -> tuple[bool, str] | None:
        """(active, evidence), or None when the sample lacks the rule's fields."""
        rule = self.rule
        value = values.get(rule.field)
        if value is None:
            return None
        if rule.value_field is not None:
            other = values.get(rule.value_field)
            if other is None:
                return None
            threshold = other
        else:
            assert rule.value is not None
            threshold = rule.value
        if rule.mode == "delta":
            return self._delta(value, threshold, t)
        breach = compare(rule.op, value, threshold)
        evidence = f"{rule.field}={_fmt(value)} ({rule.op} {_fmt(threshold)})"
        if rule.window_s is None:
            return breach, evidence
        width = rule.window_s / BUCKETS_PER_WINDOW
        bucket = int(t // width)
        if breach and (not self.buckets or self.buckets[-1] != bucket):
            self.buckets.append(bucket)
        while self.buckets and self.buckets[0] <= bucket - BUCKETS_PER_WINDOW:
            self.buckets.popleft()
        hits = len(self.buckets)
        return hits >= rule.min_count, f"{evidence} in {hits} of the last {rule.window_s:g} s"

    def _delta(self, value: float, threshold: float, t: float) -> tuple[bool, str]:
        rule = self.rule
        assert rule.window_s is not None
        last, self.last_value = self.last_value, value
        if last is not None and value > last:
            self.increases.append((t, value - last))
        while self.increases and self.increases[0][0] <= t - rule.window_s:
            self.increases.popleft()
        increase = sum(inc for _, inc in self.increases)
        active = compare(rule.op, increase, threshold)
        return active, (
            f"{rule.field} rose by {_fmt(increase)} in {rule.window_s:g} s "
            f"({rule.op} {_fmt(threshold)}; now {_fmt(value)})"
        )


@dataclass(slots=True)
class StateTracker:
    rule: StateRule
    active_since: float | None = None

    def evaluate(self, cond: Condition, t: float) -> tuple[bool, str]:
        active = cond.active and _params_match(self.rule.params, cond.attrs)
        if not active:
            self.active_since = None
            return False, cond.evidence
        if self.active_since is None:
            self.active_since = t
        grace = self.rule.params.get("grace_s")
        if isinstance(grace, int | float) and not isinstance(grace, bool):
            # e.g. fabric manager still training links just after boot: not a fault yet.
            return t - self.active_since >= grace, cond.evidence
        return True, cond.evidence


def _params_match(params: Mapping[str, object], attrs: Mapping[str, str]) -> bool:
    """The Slurm-reason parameters (state, reason_pattern, exclude_reason_prefix), and
    ``daemon`` / ``mismatch``: the attribute must be that value."""
    for key in ("daemon", "mismatch"):
        want = params.get(key)
        if isinstance(want, str) and attrs.get(key) != want:
            return False
    state = params.get("state")
    if isinstance(state, str) and state != "any" and attrs.get("state") != state:
        return False
    reason = attrs.get("reason", "")
    prefix = params.get("exclude_reason_prefix")
    if isinstance(prefix, str) and reason.startswith(prefix):
        return False
    pattern = params.get("reason_pattern")
    return not (isinstance(pattern, str) and not re.search(pattern, reason))


def _fmt(value: float) -> str:
    return f"{value:g}"
