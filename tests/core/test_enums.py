"""The one severity ranking the agent, the findings service and the repair policy share."""

from __future__ import annotations

import itertools

from gpufleet.core.enums import SEVERITY_ORDER, Severity, severity_rank, worse


def test_severities_rank_from_info_to_fatal() -> None:
    assert set(SEVERITY_ORDER) == set(Severity)
    assert [severity_rank(s) for s in SEVERITY_ORDER] == [0, 1, 2, 3]
    assert severity_rank(Severity.INFO) < severity_rank(Severity.WARNING)
    assert severity_rank(Severity.CRITICAL) < severity_rank(Severity.FATAL)


def test_worse_picks_the_higher_rank_either_way_round() -> None:
    for a, b in itertools.product(Severity, repeat=2):
        expected = a if severity_rank(a) >= severity_rank(b) else b
        assert worse(a, b) is expected is worse(b, a)
    assert worse(Severity.WARNING, Severity.FATAL) is Severity.FATAL
