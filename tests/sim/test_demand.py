"""The demand traces are the same on every run, in arrival order, and hold real work."""

from __future__ import annotations

import pytest

from gpufleet.sim.demand import DAY, TRACES


@pytest.mark.parametrize("name", sorted(TRACES))
def test_traces_are_seeded_ordered_and_sane(name: str) -> None:
    first, again = TRACES[name](days=2), TRACES[name](days=2)
    assert first == again and first  # seeded
    assert [j.arrive_s for j in first] == sorted(j.arrive_s for j in first)
    assert len({j.id for j in first}) == len(first)
    assert all(j.gpus >= 1 and j.duration_s > 0 for j in first)
    assert all(0 <= j.arrive_s < 2 * DAY + 3600 for j in first)
    assert TRACES[name](days=2, seed=99) != first  # the seed matters
