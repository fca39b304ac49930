"""Badput, MTTR and MTBF on hand-built histories whose answers are worked out by hand."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest

from gpufleet.core.enums import NodeState
from gpufleet.core.reliability import (
    FindingSpan,
    JobSpan,
    NodeHistory,
    ReliabilityReport,
    RepairSpan,
    StateChange,
    gpu_model_of,
    reliability_report,
)

N = NodeState
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
SINCE, UNTIL = T0, T0 + dt.timedelta(days=1)


def at(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def node(
    node_id: str,
    *moves: tuple[float, NodeState, NodeState],
    gpus: int = 8,
    cluster: str = "c1",
    created: float = -100.0,
    removed: float | None = None,
    state: NodeState = N.IN_SERVICE,
    model: str = "NVIDIA H100 80GB HBM3",
) -> NodeHistory:
    return NodeHistory(
        node_id=node_id,
        name=f"n-{node_id}",
        cluster=cluster,
        host=f"host-{node_id}",
        gpus=gpus,
        gpu_model=model,
        created_at=at(created),
        removed_at=None if removed is None else at(removed),
        state=state,
        changes=tuple(StateChange(at(h), a, b) for h, a, b in moves),
    )


def finding(
    node_id: str, signature: str, seen: float, cleared: float | None = None, sev: str = "critical"
) -> FindingSpan:
    return FindingSpan(node_id, signature, sev, at(seen), None if cleared is None else at(cleared))


def repair(rid: str, node_id: str, signature: str, made: float, done: float | None) -> RepairSpan:
    return RepairSpan(rid, (node_id,), signature, at(made), None if done is None else at(done))


def report(
    nodes: Sequence[NodeHistory],
    findings: Sequence[FindingSpan] = (),
    repairs: Sequence[RepairSpan] = (),
    jobs: Sequence[JobSpan] = (),
    since: dt.datetime = SINCE,
    until: dt.datetime = UNTIL,
) -> ReliabilityReport:
    return reliability_report(
        nodes=list(nodes),
        findings=list(findings),
        repairs=list(repairs),
        jobs=list(jobs),
        since=since,
        until=until,
    )


def test_a_repaired_node_loses_its_gpus_for_the_outage_and_times_the_repair() -> None:
    # Xid 79 seen at 1:00, the repair proposed at 1:05, the node out 1:10 → 3:10.
    history = node(
        "a",
        (1 + 10 / 60, N.IN_SERVICE, N.CORDONED),
        (1.5, N.CORDONED, N.REPAIRING),
        (3 + 10 / 60, N.REPAIRING, N.IN_SERVICE),
    )
    got = report(
        [history, node("b")],
        findings=[finding("a", "xid-79", 1.0, 3.2)],
        repairs=[repair("r1", "a", "xid-79", 1 + 5 / 60, 3 + 10 / 60)],
    )
    assert got.gpu_hours == 16 * 24
    assert got.gpu_hours_lost == pytest.approx(16.0)  # 8 GPUs × 2 h
    assert got.available_pct == pytest.approx(100 * (1 - 16 / 384))
    assert got.failures == 1
    assert got.mttr_h == pytest.approx(2 + 10 / 60, abs=1e-3)  # from detection at 1:00
    assert got.mtbf_h == pytest.approx(48 - 2)  # in-service node-hours per failure
    (outage,) = got.outages
    assert (outage.signature, outage.cause, outage.repair_id) == ("xid-79", "repair", "r1")
    assert (outage.ended, outage.detected_at, outage.back_at) == (
        "in_service",
        at(1),
        at(3 + 1 / 6),
    )
    (sig,) = got.by_signature
    assert (sig.key, sig.gpu_hours_lost, sig.outages) == ("xid-79", 16.0, 1)
    hosts = {r.name: r for r in got.by_host}
    assert hosts["host-a"].failures == 1 and hosts["host-a"].mtbf_h == pytest.approx(22.0)
    assert hosts["host-b"].failures == 0 and hosts["host-b"].mtbf_h is None
    (cluster,) = got.by_cluster
    assert (cluster.name, cluster.gpus, cluster.node_hours) == ("c1", 16, 48.0)


def test_overlapping_findings_blame_the_worst_open_one_when_no_repair_was_made() -> None:
    # A thermal warning since 0:30, an uncorrectable ECC error at 2:00; drained at 2:30
    # by hand, back at 4:30.
    history = node("a", (2.5, N.IN_SERVICE, N.DRAINING), (4.5, N.DRAINING, N.IN_SERVICE))
    got = report(
        [history],
        findings=[
            finding("a", "thermal-slowdown", 0.5, None, sev="warning"),
            finding("a", "ecc-dbe", 2.0, 4.0),
            finding("a", "xid-13", 3.0, 3.5),  # opened after the drain: not the cause
        ],
    )
    (outage,) = got.outages
    assert (outage.signature, outage.cause, outage.detected_at) == ("ecc-dbe", "finding", at(2))
    assert got.mttr_h == pytest.approx(2.5)
    assert got.gpu_hours_lost == pytest.approx(16.0)


def test_a_repair_that_failed_then_succeeded_is_one_outage_of_the_first_cause() -> None:
    # A reboot at 1:00 that fails acceptance, then a GPU reset that passes: the node is
    # out from 1:00 to 5:00 without a pause, acceptance included.
    history = node(
        "a",
        (1, N.IN_SERVICE, N.CORDONED),
        (1.5, N.CORDONED, N.REPAIRING),
        (2, N.REPAIRING, N.ACCEPTANCE),
        (2.5, N.ACCEPTANCE, N.CORDONED),
        (3, N.CORDONED, N.REPAIRING),
        (4, N.REPAIRING, N.ACCEPTANCE),
        (5, N.ACCEPTANCE, N.IN_SERVICE),
    )
    got = report(
        [history],
        findings=[finding("a", "xid-48", 0.9, 4.1)],
        repairs=[repair("r1", "a", "xid-48", 0.95, 2.5), repair("r2", "a", "xid-48", 2.5, 5)],
    )
    (outage,) = got.outages
    assert (outage.repair_id, outage.out_at, outage.back_at) == ("r1", at(1), at(5))
    assert got.gpu_hours_lost == pytest.approx(32.0)
    assert got.failures == 1
    assert got.mttr_h == pytest.approx(4.1)


def test_a_removed_node_counts_as_lost_until_it_goes_and_is_not_timed() -> None:
    history = node(
        "a",
        (6, N.IN_SERVICE, N.CORDONED),
        (7, N.CORDONED, N.REMOVING),
        (8, N.REMOVING, N.REMOVED),
        removed=8,
        state=N.REMOVED,
    )
    got = report(
        [history],
        findings=[finding("a", "gpu-fallen-off-bus", 5.5)],
        repairs=[repair("r1", "a", "gpu-fallen-off-bus", 5.6, 8)],
    )
    assert got.gpu_hours == pytest.approx(8 * 8)  # present 0:00 → 8:00
    assert got.gpu_hours_lost == pytest.approx(16.0)
    assert got.mttr_h is None and got.failures == 1
    (cluster,) = got.by_cluster
    assert (cluster.removed, cluster.recovered) == (1, 0)
    assert got.outages[0].ended == "removed" and got.outages[0].back_at is None


def test_the_window_clips_an_outage_and_counts_a_failure_where_it_began() -> None:
    # Out from 22:00 the day before to 2:00: two hours of it inside the window; the
    # failure began before it (not counted), the recovery inside it (timed in full).
    history = node("a", (-2, N.IN_SERVICE, N.REPAIRING), (2, N.REPAIRING, N.IN_SERVICE))
    got = report([history], repairs=[repair("r1", "a", "xid-79", -2.5, 2)])
    assert got.gpu_hours_lost == pytest.approx(16.0)
    assert got.failures == 0 and got.mtbf_h is None
    assert got.mttr_h == pytest.approx(4.5)
    assert [(d.key, d.gpu_hours_lost) for d in got.by_day] == [("2026-11-01", 16.0)]


def test_lost_hours_are_split_at_midnight_and_an_ongoing_outage_runs_to_the_end() -> None:
    history = node("a", (22, N.IN_SERVICE, N.CORDONED), state=N.CORDONED)
    got = report(
        [history],
        findings=[finding("a", "nvlink-down", 21.5)],
        until=at(26),
    )
    assert [(d.key, d.gpu_hours_lost) for d in got.by_day] == [
        ("2026-11-01", 16.0),
        ("2026-11-02", 16.0),
    ]
    (outage,) = got.outages
    assert outage.ended == "ongoing" and outage.gpu_hours_lost == 32.0
    assert got.mttr_h is None and got.failures == 1


def test_an_admins_cordon_with_nothing_behind_it_is_unattributed_and_no_failure() -> None:
    history = node("a", (3, N.IN_SERVICE, N.CORDONED), (4, N.CORDONED, N.IN_SERVICE))
    got = report([history], findings=[finding("a", "xid-79", 1, 2)])  # cleared before
    assert got.outages[0].signature == "unattributed"
    assert got.failures == 0 and got.gpu_hours_lost == 8.0


def test_failed_jobs_are_put_down_to_a_critical_finding_that_came_while_they_ran() -> None:
    history = node("a", (10, N.IN_SERVICE, N.CORDONED), (11, N.CORDONED, N.IN_SERVICE))
    jobs = [
        JobSpan("j1", ("a", "b"), "NODE_FAIL", at(2), at(9.6), 120.0),  # Xid at 9.5
        JobSpan("j2", ("b",), "FAILED", at(1), at(3), 16.0),  # b is healthy: its own doing
        JobSpan("j3", ("a",), "COMPLETED", at(9), at(9.7), 5.0),  # not failed
        JobSpan("j4", ("a",), "failed", at(12), at(13), 4.0),  # ran after: finding older
    ]
    got = report(
        [history, node("b", model="NVIDIA A100-SXM4-80GB")],
        findings=[finding("a", "xid-79", 9.5, 10.5), finding("a", "thermal", 9.55, sev="warning")],
        repairs=[repair("r1", "a", "xid-79", 9.8, 11)],
        jobs=jobs,
    )
    assert got.job_gpu_hours_lost == 120.0
    sig = {r.key: r for r in got.by_signature}["xid-79"]
    assert (sig.gpu_hours_lost, sig.job_gpu_hours_lost) == (8.0, 120.0)
    model = {r.key: r for r in got.by_gpu_model}
    assert model["NVIDIA H100 80GB HBM3"].job_gpu_hours_lost == 120.0
    assert "NVIDIA A100-SXM4-80GB" not in model  # b lost nothing


def test_an_incident_repair_blames_each_member_node() -> None:
    moves = ((1, N.IN_SERVICE, N.CORDONED), (2, N.CORDONED, N.IN_SERVICE))
    incident = RepairSpan("i1", ("a", "b"), "ib-link-down", at(0.9), at(2))
    got = report([node("a", *moves), node("b", *moves), node("c")], repairs=[incident])
    assert {o.node: o.repair_id for o in got.outages} == {"n-a": "i1", "n-b": "i1"}
    assert got.by_signature[0].outages == 2 and got.gpu_hours_lost == 16.0


def test_nothing_happened_means_nothing_lost() -> None:
    got = report([node("a"), node("b", created=12)])
    assert got.gpu_hours == 8 * 24 + 8 * 12
    assert (got.gpu_hours_lost, got.failures, got.available_pct) == (0.0, 0, 100.0)
    assert got.outages == [] and got.mttr_h is None and got.mtbf_h is None
    assert report([]).available_pct is None


def test_the_gpu_model_is_the_most_common_one() -> None:
    assert gpu_model_of(["H100", None, "H100", "A100"]) == "H100"
    assert gpu_model_of([None]) == ""


def test_a_repair_proposed_after_the_node_left_is_still_its_cause() -> None:
    # Cordoned at 1:00 (by hand, or by a check) with an Xid open since 0:50; the repair
    # is proposed at 1:20 and the node is back at 2:00.
    history = node("a", (1, N.IN_SERVICE, N.CORDONED), (2, N.CORDONED, N.IN_SERVICE))
    got = report(
        [history],
        findings=[finding("a", "xid-79", 50 / 60, 1.9), finding("a", "xid-79", -30, -29)],
        repairs=[repair("r1", "a", "xid-79", 1 + 20 / 60, 2), repair("r0", "a", "x", -5, -4)],
    )
    (outage,) = got.outages
    assert (outage.repair_id, outage.cause, outage.detected_at) == ("r1", "repair", at(50 / 60))
