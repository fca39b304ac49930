"""Health aggregation: GPU → node → cluster. Unknown is never healthy."""

from __future__ import annotations

import datetime as dt

import pytest

from gpufleet.core.enums import Health, Severity
from gpufleet.core.health import (
    cluster_health,
    health_from_severities,
    is_stale,
    node_health,
    shown_health,
    worst,
)

H, D, U, K = Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY, Health.UNKNOWN
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("severities", "expected"),
    [
        ([], H),
        ([Severity.INFO], H),
        ([Severity.INFO, Severity.WARNING], D),
        ([Severity.WARNING, Severity.CRITICAL], U),
        ([Severity.FATAL], U),
    ],
)
def test_health_from_severities(severities: list[Severity], expected: Health) -> None:
    assert health_from_severities(severities) is expected


def test_worst_orders_unknown_between_degraded_and_unhealthy() -> None:
    assert worst([]) is H
    assert worst([H, D]) is D
    assert worst([D, K]) is K
    assert worst([K, U, H]) is U


@pytest.mark.parametrize(
    ("last", "expected"),
    [(None, True), (ago(0), False), (ago(45), False), (ago(45.001), True), (ago(3600), True)],
)
def test_is_stale(last: dt.datetime | None, expected: bool) -> None:
    assert is_stale(last_report_at=last, now=NOW, staleness_s=45) is expected


def _node(
    *,
    last: dt.datetime | None = NOW,
    expected: int = 8,
    reporting: int = 8,
    severities: tuple[Severity, ...] = (),
) -> Health:
    return node_health(
        last_report_at=last,
        now=NOW,
        staleness_s=45,
        expected_gpus=expected,
        reporting_gpus=reporting,
        finding_severities=severities,
    )


def test_node_healthy_when_fresh_and_complete() -> None:
    assert _node() is H
    assert _node(reporting=9) is H
    assert _node(expected=0, reporting=0) is H


def test_node_never_reported_or_silent_is_unknown() -> None:
    assert _node(last=None) is K
    assert _node(last=ago(46)) is K
    assert _node(last=ago(46), reporting=0) is K  # silence outranks a missing GPU
    assert _node(last=ago(46), severities=(Severity.WARNING,)) is K


def test_node_missing_gpu_is_unhealthy() -> None:
    assert _node(reporting=7) is U
    assert _node(reporting=0) is U
    assert _node(reporting=7, severities=(Severity.WARNING,)) is U


def test_node_findings_decide_by_severity() -> None:
    assert _node(severities=(Severity.WARNING,)) is D
    assert _node(severities=(Severity.INFO,)) is H
    assert _node(severities=(Severity.CRITICAL,)) is U
    # A critical finding stays unhealthy even when the node went silent.
    assert _node(last=None, severities=(Severity.FATAL,)) is U


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([], K),
        ([K, K, K], K),
        ([H, H, H], H),
        ([H, H, D], D),
        ([H, H, H, K], D),
        ([H, K], U),  # half bad
        ([H, U], U),
        ([H, H, U, K], U),
        ([D, D], D),
        ([H] * 999 + [U], D),
    ],
)
def test_cluster_health(nodes: list[Health], expected: Health) -> None:
    assert cluster_health(nodes) is expected


def test_cluster_health_accepts_a_generator() -> None:
    assert cluster_health(h for h in [H, H]) is H


def test_shown_health_reads_a_silent_node_as_unknown_unless_known_bad() -> None:
    def shown(stored: Health, last: dt.datetime | None) -> Health:
        return shown_health(stored, last_report_at=last, now=NOW, staleness_s=45)

    assert shown(H, ago(10)) is H
    assert shown(D, ago(10)) is D
    assert shown(H, ago(100)) is K
    assert shown(D, None) is K
    assert shown(U, ago(100)) is U
