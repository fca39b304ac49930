"""Health aggregation: GPU → node → cluster. Pure functions.

The rules an operator relies on:
- a node that never reported, or whose last report is older than the staleness window,
  is ``unknown`` — never ``healthy``;
- fewer GPUs reporting than the node spec expects is ``unhealthy`` (a GPU fell off);
- an open finding decides by its severity (warning → degraded, critical/fatal → unhealthy).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from gpufleet.core.enums import Health, Severity

_RANK = {Health.HEALTHY: 0, Health.DEGRADED: 1, Health.UNKNOWN: 2, Health.UNHEALTHY: 3}


def health_from_severities(severities: Iterable[Severity]) -> Health:
    worst = Health.HEALTHY
    for severity in severities:
        if severity in (Severity.CRITICAL, Severity.FATAL):
            return Health.UNHEALTHY
        if severity is Severity.WARNING:
            worst = Health.DEGRADED
    return worst


def worst(healths: Iterable[Health]) -> Health:
    result = Health.HEALTHY
    for h in healths:
        if _RANK[h] > _RANK[result]:
            result = h
    return result


def is_stale(*, last_report_at: dt.datetime | None, now: dt.datetime, staleness_s: float) -> bool:
    if last_report_at is None:
        return True
    return (now - last_report_at).total_seconds() > staleness_s


def shown_health(
    stored: Health, *, last_report_at: dt.datetime | None, now: dt.datetime, staleness_s: float
) -> Health:
    """A node's stored health, except that a silent node reads as unknown at once.

    The health loop writes ``unknown`` within one pass; this closes the gap between
    passes so a stale node is never shown healthy. Unhealthy stays unhealthy.
    """
    return silenced(
        stored, silent=is_stale(last_report_at=last_report_at, now=now, staleness_s=staleness_s)
    )


def silenced(stored: Health, *, silent: bool) -> Health:
    """``shown_health`` of a node whose silence is already judged (by a query)."""
    if silent and stored is not Health.UNHEALTHY:
        return Health.UNKNOWN
    return stored


def node_health(
    *,
    last_report_at: dt.datetime | None,
    now: dt.datetime,
    staleness_s: float,
    expected_gpus: int,
    reporting_gpus: int,
    finding_severities: Iterable[Severity] = (),
) -> Health:
    """Health of one node from its report freshness, its GPU count and open findings."""
    from_findings = health_from_severities(finding_severities)
    if from_findings is Health.UNHEALTHY:
        return Health.UNHEALTHY
    if is_stale(last_report_at=last_report_at, now=now, staleness_s=staleness_s):
        return Health.UNKNOWN
    if reporting_gpus < expected_gpus:
        return Health.UNHEALTHY
    return from_findings


def cluster_health(node_healths: Iterable[Health]) -> Health:
    """Healthy only when every node is. Unknown when no node has reported at all.

    Unhealthy when at least half of the nodes are unhealthy or unknown; else degraded
    if any node is not healthy. A 1,000-node cluster with one bad node is degraded, not down.
    """
    counts = {h: 0 for h in Health}
    total = 0
    for h in node_healths:
        counts[h] += 1
        total += 1
    if total == 0 or counts[Health.UNKNOWN] == total:
        return Health.UNKNOWN
    bad = counts[Health.UNHEALTHY] + counts[Health.UNKNOWN]
    if bad * 2 >= total:
        return Health.UNHEALTHY
    if bad or counts[Health.DEGRADED]:
        return Health.DEGRADED
    return Health.HEALTHY
