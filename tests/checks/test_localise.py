"""Failure localisation, against an oracle: a probe fails when its node set holds a bad
node or both ends of a bad link. Every bad-node position, every pair of bad nodes, every
bad link, on 16 and 64 nodes (and odd sizes)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.checks.localise import Localiser, Report, rounds_bound


def names(n: int) -> list[str]:
    return [f"n{i:03d}" for i in range(n)]


def localise(
    nodes: Sequence[str],
    *,
    bad: Collection[str] = (),
    links: Collection[tuple[str, str]] = (),
    known_good: Sequence[str] = (),
    roundtrip: bool = False,
) -> Report:
    def fails(probe: Sequence[str]) -> bool:
        members = set(probe)
        return bool(members & set(bad)) or any(a in members and b in members for a, b in links)

    loc = Localiser.start(nodes, known_good=known_good)
    for _ in range(10 * len(nodes) + 10):
        probes = loc.plan_round()
        if not probes:
            break
        used = [n for p in probes for n in p.nodes]
        assert len(used) == len(set(used)), f"probes of one round share nodes: {probes}"
        assert all(len(p.nodes) >= 2 for p in probes), "a probe of one node tests no fabric"
        if roundtrip:
            loc = Localiser.from_json(json.loads(json.dumps(loc.to_json())))
        loc.record({p.id: fails(p.nodes) for p in probes})
    else:
        raise AssertionError("localisation did not end")
    assert loc.done
    return loc.report()


@pytest.mark.parametrize("n", [4, 5, 7, 16, 64])
def test_one_bad_node_is_found_at_every_position_within_the_bound(n: int) -> None:
    nodes = names(n)
    worst = 0
    for bad in nodes:
        report = localise(nodes, bad={bad})
        assert report.bad_nodes == (bad,), (bad, report)
        assert report.bad_links == () and report.unresolved == (), report
        assert bad not in report.good
        worst = max(worst, report.rounds)
    assert worst <= rounds_bound(n), (n, worst)


@pytest.mark.parametrize("n", [16, 64])
def test_rounds_are_log2_n_with_a_known_good_node(n: int) -> None:
    nodes = names(n)
    for bad in nodes:
        report = localise(nodes, bad={bad}, known_good=["spare-1"])
        assert report.bad_nodes == (bad,)
        assert report.rounds <= (n - 1).bit_length(), (bad, report.rounds)


@pytest.mark.parametrize("n", [2, 3])
def test_two_or_three_nodes_need_a_known_good_node(n: int) -> None:
    """A failed pair cannot tell its two nodes (or their link) apart without a third."""
    nodes = names(n)
    for bad in nodes:
        assert localise(nodes, bad={bad}, known_good=["g1", "g2"]).bad_nodes == (bad,)
    report = localise(names(2), bad={"n000"})
    assert report.bad_nodes == () and "no known-good node" in report.unresolved[0]


def test_two_bad_nodes_are_both_found() -> None:
    nodes = names(16)
    worst = 0
    for pair in itertools.combinations(nodes, 2):
        report = localise(nodes, bad=set(pair))
        assert sorted(report.bad_nodes) == sorted(pair), (pair, report)
        assert report.unresolved == ()
        worst = max(worst, report.rounds)
    assert worst <= rounds_bound(16)


def test_a_bad_link_between_two_good_nodes_is_named_as_a_link() -> None:
    """Both ends pass alone and with others; only together do they fail. The search
    names the link (never a node), in at most 2 rounds per halving plus one."""
    nodes = names(16)
    worst = 0
    for a, b in itertools.combinations(nodes, 2):
        report = localise(nodes, links={(a, b)})
        assert report.bad_nodes == (), (a, b, report)
        assert [sorted(link) for link in report.bad_links] == [[a, b]], (a, b, report)
        worst = max(worst, report.rounds)
    assert worst <= 2 * 4 - 1, worst  # 7 on 16 nodes: more than one bad node needs


def test_state_survives_a_restart_between_rounds() -> None:
    nodes = names(16)
    for bad in nodes[::5]:
        assert localise(nodes, bad={bad}, roundtrip=True).bad_nodes == (bad,)
    report = localise(nodes, links={(nodes[2], nodes[11])}, roundtrip=True)
    assert [sorted(link) for link in report.bad_links] == [[nodes[2], nodes[11]]]


def test_a_failure_that_does_not_reproduce_is_unresolved_not_blamed() -> None:
    report = localise(names(8))
    assert report.bad_nodes == () and report.bad_links == ()
    assert report.unresolved and "not reproduced" in report.unresolved[0]


def test_every_node_bad_with_no_partner_is_unresolved() -> None:
    nodes = names(4)
    report = localise(nodes, bad=set(nodes))
    assert report.bad_nodes == ()
    assert report.unresolved and "no known-good node" in report.unresolved[0]
    # With a known-good partner every one of them is named.
    report = localise(nodes, bad=set(nodes), known_good=["spare-1", "spare-2", "spare-3"])
    assert sorted(report.bad_nodes) == nodes


def test_a_single_suspect_is_paired_with_a_known_good_node() -> None:
    assert localise(["x"], bad={"x"}, known_good=["g"]).bad_nodes == ("x",)
    assert localise(["x"], bad={"x"}).unresolved  # nothing to pair with


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=40),
    data=st.data(),
)
def test_any_set_of_bad_nodes_is_found_or_left_unresolved(n: int, data: st.DataObject) -> None:
    nodes = names(n)
    bad = data.draw(st.sets(st.sampled_from(nodes), min_size=1, max_size=max(1, n // 3)))
    report = localise(nodes, bad=bad)
    assert set(report.bad_nodes) <= bad  # never blames a good node
    assert not set(report.good) & bad
    found_or_open = set(report.bad_nodes) | {
        node for line in report.unresolved for node in nodes if node in line
    }
    assert bad <= found_or_open
