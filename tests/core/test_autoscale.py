"""The autoscaling policy (``gpufleet.core.autoscale.decide``): scenarios, and properties
over generated clusters: scale-down never takes a busy, repairing, accepting, held or
coming node, never goes under the minimum; scale-up never goes over the maximum."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.core.autoscale import (
    AutoscalePolicy,
    NodePhase,
    NodeView,
    PendingWork,
    ScaleState,
    decide,
    nodes_needed,
    removable,
)

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)
POLICY = AutoscalePolicy(
    min_nodes=2,
    max_nodes=10,
    scale_up_after_s=120,
    scale_down_after_s=1800,
    up_cooldown_s=300,
    down_cooldown_s=600,
    max_step=4,
)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def node(
    name: str, phase: NodePhase = NodePhase.IN_SERVICE, *, idle_s: float = 0, **kw: bool
) -> NodeView:
    return NodeView(name=name, phase=phase, idle_since=ago(idle_s), **kw)


def state(
    nodes: list[NodeView],
    pending: Sequence[PendingWork] = (),
    *,
    last_up_at: dt.datetime | None = None,
    last_down_at: dt.datetime | None = None,
) -> ScaleState:
    return ScaleState(
        nodes=nodes, pending=list(pending), gpus_per_node=8, now=NOW,
        last_up_at=last_up_at, last_down_at=last_down_at,
    )  # fmt: skip


def test_under_the_minimum_it_adds_up_to_it() -> None:
    decision = decide(POLICY, state([node("a")]))
    assert decision.add == 1 and "under the minimum of 2" in decision.reasons[0]


def test_work_pending_long_enough_asks_for_the_nodes_it_needs_less_those_coming() -> None:
    pending = [
        PendingWork("job-1", 16, ago(600)),  # two whole nodes
        PendingWork("job-2", 2, ago(300)),
        PendingWork("job-3", 4, ago(200)),  # with job-2: one node
        PendingWork("job-4", 8, ago(30)),  # not long enough yet
    ]
    nodes = [node("a", busy=True), node("b", busy=True), node("c", NodePhase.COMING)]
    decision = decide(POLICY, state(nodes, pending))
    assert decision.add == 2 and not decision.remove  # 3 needed, 1 on its way
    (why,) = decision.reasons
    assert "3 job(s) wait for 22 GPUs" in why and "job-1: 16 GPUs for 10 min" in why
    assert "3 node(s) needed, 1 on their way, 0 free; adding 2" in why


def test_a_step_is_capped_and_the_maximum_holds() -> None:
    pending = [PendingWork(f"j{i}", 8, ago(600)) for i in range(20)]
    nodes = [node(x, busy=True) for x in "ab"]
    assert decide(POLICY, state(nodes, pending)).add == 4  # max_step
    nodes = [node(f"n{i}", busy=True) for i in range(9)]
    decision = decide(POLICY, state(nodes, pending))
    assert decision.add == 1 and "the maximum is 10" in decision.reasons[0]
    full = [node(f"n{i}", busy=True) for i in range(10)]
    decision = decide(POLICY, state(full, pending))
    assert decision.add == 0 and "at the maximum of 10 node(s)" in decision.reasons[0]


def test_the_up_cooldown_waits_and_says_so() -> None:
    pending = [PendingWork("j", 8, ago(600))]
    nodes = [node(x, busy=True) for x in "ab"]
    decision = decide(POLICY, state(nodes, pending, last_up_at=ago(100)))
    assert decision.add == 0 and "cooldown after the last step up (300 s)" in decision.reasons[0]
    assert decide(POLICY, state(nodes, pending, last_up_at=ago(301))).add == 1


def test_work_too_big_for_the_maximum_is_named_and_not_counted() -> None:
    pending = [PendingWork("huge", 8 * 11, ago(600))]
    decision = decide(POLICY, state([node(x, busy=True) for x in "ab"], pending))
    assert decision.add == 0
    assert "huge wants 88 GPUs: more than 10 node(s) of 8 hold; not counted" in decision.reasons[0]


def test_scale_down_takes_only_idle_removable_nodes_longest_idle_first() -> None:
    nodes = [
        node("busy", busy=True, idle_s=9000),
        node("repairing", NodePhase.IN_SERVICE, idle_s=9000, repairing=True),
        node("accepting", NodePhase.IN_SERVICE, idle_s=9000, accepting=True),
        node("held", NodePhase.HELD, idle_s=9000),
        node("coming", NodePhase.COMING, idle_s=9000),
        node("idle-1h", idle_s=3600),
        node("idle-2h", idle_s=7200),
        node("idle-10m", idle_s=600),  # not idle long enough
    ]
    decision = decide(POLICY, state(nodes))
    assert decision.remove == ("idle-2h", "idle-1h") and decision.add == 0
    assert "idle-2h idle 2.0 h" in decision.reasons[0]


def test_scale_down_keeps_the_minimum_and_waits_for_work_and_cooldowns() -> None:
    idle = [node(x, idle_s=9000) for x in "abc"]
    assert decide(POLICY, state(idle)).remove == ("a",)  # 3 nodes, minimum 2
    waiting = [PendingWork("j", 1, ago(10))]
    blocked = decide(POLICY, state(idle, waiting))
    assert blocked.remove == () and "no step down while work waits" in blocked.reasons[0]
    assert decide(POLICY, state(idle, last_up_at=ago(100))).remove == ()
    assert decide(POLICY, state(idle, last_down_at=ago(599))).remove == ()
    assert decide(POLICY, state(idle, last_down_at=ago(601))).remove == ("a",)


def test_small_jobs_are_packed_big_ones_take_whole_nodes() -> None:
    work = [PendingWork("a", 1, NOW)] * 7 + [PendingWork("b", 24, NOW)]
    assert nodes_needed(work, 8) == 1 + 3


def test_a_policy_that_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="min_nodes <= max_nodes"):
        AutoscalePolicy(min_nodes=5, max_nodes=2)
    with pytest.raises(ValueError, match="max_step"):
        AutoscalePolicy(min_nodes=0, max_nodes=2, max_step=0)


NODES = st.builds(
    NodeView,
    name=st.uuids().map(str),
    phase=st.sampled_from(list(NodePhase)),
    busy=st.booleans(),
    idle_since=st.one_of(st.none(), st.integers(0, 20_000).map(ago)),
    repairing=st.booleans(),
    accepting=st.booleans(),
)
WORK = st.builds(
    PendingWork,
    id=st.text(min_size=1, max_size=8),
    gpus=st.integers(1, 200),
    since=st.integers(0, 2000).map(ago),
)
POLICIES = st.builds(
    lambda lo, extra, step, up, down: AutoscalePolicy(
        min_nodes=lo, max_nodes=lo + extra, max_step=step,
        scale_up_after_s=up, scale_down_after_s=down,
    ),
    st.integers(0, 5), st.integers(0, 20), st.integers(1, 8),
    st.integers(0, 600), st.integers(0, 5000),
)  # fmt: skip


@settings(max_examples=300, database=None, deadline=None)
@given(
    POLICIES, st.lists(NODES, max_size=25, unique_by=lambda n: n.name), st.lists(WORK, max_size=10)
)
def test_no_decision_breaks_the_rules(
    policy: AutoscalePolicy, nodes: list[NodeView], pending: list[PendingWork]
) -> None:
    decision = decide(policy, state(nodes, pending))
    live = len(nodes)
    by_name = {n.name: n for n in nodes}
    for name in decision.remove:
        gone = by_name[name]
        assert removable(gone), gone
        assert gone.idle_since is not None
        assert (NOW - gone.idle_since).total_seconds() >= policy.scale_down_after_s
    assert not (decision.add and decision.remove)
    assert live - len(decision.remove) >= min(live, policy.min_nodes)
    assert decision.add == 0 or live + decision.add <= policy.max_nodes
    assert decision.add <= max(policy.max_step, policy.min_nodes)
    assert decision.reasons or not decision.changes


def test_a_free_node_counts_toward_what_the_work_needs() -> None:
    """A two-node job waits with one node free: one more node, not two."""
    state = ScaleState(
        nodes=[
            NodeView("n0", NodePhase.IN_SERVICE, busy=False, idle_since=NOW),
            NodeView("n1", NodePhase.IN_SERVICE, busy=True),
        ],
        pending=[PendingWork("big", 16, NOW - dt.timedelta(minutes=5))],
        gpus_per_node=8,
        now=NOW,
    )
    decision = decide(AutoscalePolicy(min_nodes=1, max_nodes=8), state)
    assert decision.add == 1
    assert "2 node(s) needed, 0 on their way, 1 free; adding 1" in decision.reasons[0]
