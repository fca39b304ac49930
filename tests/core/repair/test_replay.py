"""The dry run over a small synthetic history, and how a different policy changes it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence

import pytest
from pydantic import TypeAdapter

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus
from gpufleet.core.errors import InvalidInput
from gpufleet.core.repair.models import (
    AutoApproveRule,
    FindingFact,
    NodeFact,
    PolicyConfig,
    RepairFact,
    RepairKind,
)
from gpufleet.core.repair.replay import ReplayReport, replay
from gpufleet.core.signatures.catalog import get_catalog

T0 = dt.datetime(2026, 3, 2, 0, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
A = RepairAction


def node(name: str, leaf: str, *, state: NodeState = NodeState.IN_SERVICE) -> NodeFact:
    # Every node on its own rack and PDU: only the leaf switch is ever shared here.
    return NodeFact(
        id=f"id-{name}",
        name=name,
        state=state,
        host=f"serial-{name}",
        rack=f"rack-{name}",
        leaf_switch=leaf,
        pdu=f"pdu-{name}",
    )


def finding(
    finding_id: str,
    on: NodeFact,
    signature_id: str,
    *,
    at: dt.datetime,
    cleared_at: dt.datetime | None = None,
    last_seen: dt.datetime | None = None,
    gpu: int = 0,
    count: int = 1,
) -> FindingFact:
    signature = get_catalog().get(signature_id)
    assert signature is not None
    return FindingFact(
        id=finding_id,
        node_id=on.id,
        signature_id=signature_id,
        severity=signature.severity,
        title=signature.title,
        evidence=f"line for {signature_id}",
        first_seen=at,
        last_seen=last_seen or at,
        cleared_at=cleared_at,
        gpu_index=gpu,
        count=count,
    )


N1 = node("node-01", "leaf-01")
N2 = node("node-02", "leaf-02")
LEAF9 = [node(f"node-1{i}", "leaf-09") for i in range(4)]
NODES = [N1, N2, *LEAF9]
FINDINGS = [
    # node-01: fell off the bus, cleared an hour later → proposed, then resolved.
    finding("f1", N1, "xid-79", at=T0 + HOUR, cleared_at=T0 + 2 * HOUR),
    # node-02: a pending row remap, then the GPU falls off the bus → escalated in place.
    finding("f2", N2, "row-remap-pending", at=T0 + 3 * HOUR),
    finding("f3", N2, "xid-79", at=T0 + 3 * HOUR + 30 * MIN, gpu=1),
    # Four nodes behind leaf-09 within three minutes → one incident.
    *(finding(f"g{i}", n, "xid-79", at=T0 + 6 * HOUR + i * MIN) for i, n in enumerate(LEAF9)),
]


def run(
    config: PolicyConfig | None = None,
    *,
    nodes: Sequence[NodeFact] = NODES,
    findings: Sequence[FindingFact] = FINDINGS,
    history: Sequence[RepairFact] = (),
    end: dt.datetime = T0 + DAY,
) -> ReplayReport:
    return replay(
        nodes=nodes,
        findings=findings,
        history=history,
        config=config or PolicyConfig(),
        start=T0,
        end=end,
    )


def timeline(report: ReplayReport) -> list[tuple[dt.timedelta, str, str, str | None]]:
    return [
        (e.at - T0, e.subject, e.kind, None if e.action is None else e.action.value)
        for e in report.entries
    ]


def test_replay_reports_proposals_escalations_resolves_and_incidents() -> None:
    report = run()

    assert timeline(report) == [
        (HOUR, "node-01", "propose", "reboot"),
        (2 * HOUR + 5 * MIN, "node-01", "resolve", "reboot"),
        (3 * HOUR, "node-02", "propose", "reset_gpu"),
        (3 * HOUR + 30 * MIN, "node-02", "escalate", "reboot"),
        (6 * HOUR, "node-10", "propose", "reboot"),
        (6 * HOUR + MIN, "node-11", "propose", "reboot"),
        (6 * HOUR + 2 * MIN, "leaf_switch=leaf-09", "incident", None),
        (6 * HOUR + 2 * MIN, "node-10", "supersede", "reboot"),
        (6 * HOUR + 2 * MIN, "node-11", "supersede", "reboot"),
        (6 * HOUR + 3 * MIN, "leaf_switch=leaf-09", "update", None),
    ]
    assert report.summary == {
        "propose": 4,
        "escalate": 1,
        "update": 1,
        "resolve": 1,
        "supersede": 2,
        "incident": 1,
        "hold": 0,
        "action:reboot": 4,
        "action:reset_gpu": 1,
        "auto_approved": 0,
    }
    escalation = report.entries[3]
    assert escalation.signature_id == "xid-79"
    assert escalation.rule == "catalog xid-79 → reboot; escalates pending reset_gpu → reboot"
    assert not any(e.auto_approved for e in report.entries)


def test_report_is_json_and_reads_back() -> None:
    # As the API sends it (pydantic writes the dataclass) and the client reads it.
    adapter = TypeAdapter(ReplayReport)
    report = run()
    text = adapter.dump_json(report)
    data = json.loads(text)
    assert adapter.validate_json(text) == report
    assert data["entries"][0] == {
        "at": (T0 + HOUR).isoformat().replace("+00:00", "Z"),
        "subject": "node-01",
        "kind": "propose",
        "action": "reboot",
        "signature_id": "xid-79",
        "auto_approved": False,
        "reason": "node-01: GPU has fallen off the bus (xid-79) → reboot",
        "rule": "catalog xid-79 → reboot",
    }
    assert data["summary"]["incident"] == 1


def test_a_different_config_changes_the_outcome() -> None:
    report = run(PolicyConfig(incident_min_nodes=5, ttl_s=3 * 3600.0))
    kinds = [(e.subject, e.kind) for e in report.entries]
    assert ("leaf_switch=leaf-09", "incident") not in kinds
    assert [s for s, k in kinds if k == "propose"] == [
        "node-01",
        "node-02",
        "node-10",
        "node-11",
        "node-12",
        "node-13",
    ]
    assert report.summary["supersede"] == 0
    resolve = next(e for e in report.entries if e.kind == "resolve")
    assert resolve.at == T0 + 5 * HOUR  # cleared at 2 h, TTL 3 h


def test_auto_approved_repairs_succeed_at_once_so_cooldown_and_ladder_follow() -> None:
    findings = [
        finding("f1", N1, "xid-79", at=T0 + HOUR),  # never cleared in the stored data
        finding("f2", N1, "xid-79", at=T0 + HOUR + 10 * MIN, gpu=1),
    ]
    config = PolicyConfig(auto_approve=(AutoApproveRule("xid-79", A.REBOOT),))

    report = run(config, nodes=[N1], findings=findings)

    assert timeline(report) == [
        (HOUR, "node-01", "propose", "reboot"),
        (HOUR + 10 * MIN, "node-01", "hold", None),
        (HOUR + 30 * MIN, "node-01", "propose", "reprovision"),
    ]
    assert [e.auto_approved for e in report.entries] == [True, False, False]
    assert "ladder: host had reboot (succeeded) 30m ago → reprovision" in report.entries[2].rule
    assert report.summary["auto_approved"] == 1
    assert report.summary["hold"] == 1

    # Without the opt-in the first proposal waits for a human, and so does the node.
    manual = run(nodes=[N1], findings=findings)
    assert timeline(manual) == [
        (HOUR, "node-01", "propose", "reboot"),
        (HOUR + 10 * MIN, "node-01", "update", "reboot"),
    ]


def test_a_finding_counted_again_at_last_seen_escalates() -> None:
    repeated = finding(
        "f1", N1, "xid-79", at=T0 + HOUR, last_seen=T0 + 2 * HOUR, count=2
    )  # xid-79: twice within 7 d → remove
    assert timeline(run(nodes=[N1], findings=[repeated])) == [
        (HOUR, "node-01", "propose", "reboot"),
        (2 * HOUR, "node-01", "escalate", "remove"),
    ]


def test_history_before_the_start_feeds_the_ladder() -> None:
    before = RepairFact(
        id="r0",
        kind=RepairKind.NODE,
        action=A.REBOOT,
        status=RepairStatus.FAILED,
        signature_id="xid-79",
        created_at=T0 - 2 * HOUR,
        updated_at=T0 - HOUR,
        node_id=N1.id,
        host=N1.host,
        finished_at=T0 - HOUR,
    )
    within = dataclasses.replace(before, id="r1", finished_at=T0 + 30 * MIN)
    findings = [finding("f1", N1, "xid-79", at=T0 + HOUR)]

    assert timeline(run(nodes=[N1], findings=findings, history=[before])) == [
        (HOUR, "node-01", "propose", "reprovision"),
    ]
    # What really happened within the range is what the simulation replaces.
    assert timeline(run(nodes=[N1], findings=findings, history=[within])) == [
        (HOUR, "node-01", "propose", "reboot"),
    ]


def test_findings_open_at_the_start_are_replayed_and_after_the_end_are_not() -> None:
    findings = [
        finding("f1", N1, "xid-79", at=T0 - HOUR),
        finding("f2", N2, "xid-79", at=T0 + 2 * DAY),
    ]
    assert timeline(run(findings=findings)) == [(dt.timedelta(0), "node-01", "propose", "reboot")]


def test_a_node_removed_since_is_replayed_as_in_service() -> None:
    removed = node("node-01", "leaf-01", state=NodeState.REMOVED)
    findings = [finding("f1", removed, "xid-79", at=T0 + HOUR)]
    assert [e.kind for e in run(nodes=[removed], findings=findings).entries] == ["propose"]


def test_replay_is_pure() -> None:
    assert run() == run()


def test_end_before_start_is_refused() -> None:
    with pytest.raises(InvalidInput, match="before start"):
        run(end=T0 - MIN)
