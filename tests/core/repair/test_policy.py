"""The repair policy, rule by rule: each with a case that fires and a near miss."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Sequence

import pytest

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus, Severity
from gpufleet.core.repair.models import (
    ACTIVE_STATUSES,
    AutoApproveRule,
    ClusterFacts,
    Decision,
    FindingFact,
    Hold,
    NodeFact,
    PolicyConfig,
    Propose,
    ProposeIncident,
    RepairFact,
    RepairKind,
    RepairSource,
    Resolve,
    Supersede,
    Update,
)
from gpufleet.core.repair.policy import breaker_would_trip, next_rung, plan
from gpufleet.core.signatures.catalog import get_catalog

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
A = RepairAction

# xid-79: reboot, repeat 2 within 7 d → remove. No reboot signature in the catalog lacks
# an escalation, so the ladder tests keep to one sighting (below the repeat).
# row-remap-pending: reset_gpu, no escalation. xid-78: reprovision, no escalation.
FELL_OFF = "xid-79"
REMAP = "row-remap-pending"


# -- factories -------------------------------------------------------------------------


def node(
    name: str = "node-01",
    *,
    state: NodeState = NodeState.IN_SERVICE,
    host: str | None = None,
    rack: str | None = "rack-1",
    leaf: str | None = "leaf-01",
    pdu: str | None = "pdu-1",
) -> NodeFact:
    return NodeFact(
        id=f"id-{name}",
        name=name,
        state=state,
        host=host or f"serial-{name}",
        rack=rack,
        leaf_switch=leaf,
        pdu=pdu,
    )


def finding(
    finding_id: str,
    on: NodeFact,
    signature_id: str = FELL_OFF,
    *,
    at: dt.datetime = T0,
    last_seen: dt.datetime | None = None,
    cleared_at: dt.datetime | None = None,
    gpu: int | None = 0,
    count: int = 1,
    severity: Severity | None = None,
) -> FindingFact:
    signature = get_catalog().get(signature_id)
    return FindingFact(
        id=finding_id,
        node_id=on.id,
        signature_id=signature_id,
        severity=severity or (signature.severity if signature else Severity.CRITICAL),
        title=signature.title if signature else signature_id,
        evidence=f"NVRM: Xid (PCI:0000:18:00): {signature_id}",
        first_seen=at,
        last_seen=last_seen or at,
        cleared_at=cleared_at,
        gpu_index=gpu,
        count=count,
    )


def repair(
    repair_id: str,
    on: NodeFact,
    *,
    action: RepairAction = A.REBOOT,
    status: RepairStatus = RepairStatus.PROPOSED,
    signature_id: str = FELL_OFF,
    finding_ids: Sequence[str] = (),
    finished_at: dt.datetime | None = None,
    created_at: dt.datetime = T0,
    host: str | None = None,
    source: RepairSource = RepairSource.POLICY,
) -> RepairFact:
    return RepairFact(
        id=repair_id,
        kind=RepairKind.NODE,
        action=action,
        status=status,
        signature_id=signature_id,
        created_at=created_at,
        updated_at=finished_at or created_at,
        node_id=on.id,
        host=host or on.host,
        finding_ids=tuple(finding_ids),
        finished_at=finished_at,
        source=source,
    )


def ended(
    repair_id: str,
    on: NodeFact,
    action: RepairAction,
    status: RepairStatus,
    *,
    ago: dt.timedelta,
    now: dt.datetime = T0,
    host: str | None = None,
) -> RepairFact:
    return repair(
        repair_id,
        on,
        action=action,
        status=status,
        finished_at=now - ago,
        created_at=now - ago - HOUR,
        host=host,
    )


def incident(
    repair_id: str,
    key: str,
    members: Sequence[NodeFact],
    finding_ids: Sequence[str],
    *,
    status: RepairStatus = RepairStatus.PROPOSED,
    created_at: dt.datetime = T0,
) -> RepairFact:
    return RepairFact(
        id=repair_id,
        kind=RepairKind.INCIDENT,
        action=A.NONE,
        status=status,
        signature_id=FELL_OFF,
        created_at=created_at,
        updated_at=created_at,
        finding_ids=tuple(finding_ids),
        incident_key=key,
        node_ids=tuple(n.id for n in members),
        finished_at=created_at if status is RepairStatus.REJECTED else None,
    )


def facts(
    nodes: Sequence[NodeFact],
    findings: Sequence[FindingFact] = (),
    repairs: Sequence[RepairFact] = (),
    *,
    breaker_tripped: bool = False,
    unsupported: frozenset[RepairAction] = frozenset(),
) -> ClusterFacts:
    return ClusterFacts(
        cluster_id="cluster-1",
        nodes=tuple(nodes),
        findings=tuple(findings),
        repairs=tuple(repairs),
        breaker_tripped=breaker_tripped,
        unsupported=unsupported,
    )


def run(
    cluster: ClusterFacts, config: PolicyConfig | None = None, *, now: dt.datetime = T0
) -> list[Decision]:
    return plan(cluster, config or PolicyConfig(), now=now)


def only(decisions: list[Decision]) -> Decision:
    assert len(decisions) == 1, decisions
    return decisions[0]


def only_propose(decisions: list[Decision]) -> Propose:
    decision = only(decisions)
    assert isinstance(decision, Propose), decision
    return decision


# -- rule 1: which findings count -------------------------------------------------------


def test_xid_79_proposes_a_reboot_with_its_evidence() -> None:
    n = node(rack="rack-7", leaf="leaf-03", pdu="pdu-2")
    f = finding("f1", n, gpu=3, count=1)
    old = ended("r0", n, A.REBOOT, RepairStatus.SUCCEEDED, ago=8 * DAY)

    propose = only_propose(run(facts([n], [f], [old])))

    assert propose.node_id == n.id
    assert propose.action is A.REBOOT
    assert propose.signature_id == "xid-79"
    assert propose.finding_ids == ("f1",)
    assert propose.rule == "catalog xid-79 → reboot"
    assert propose.reason == "node-01: GPU has fallen off the bus (xid-79) → reboot"
    assert propose.auto_approve is False
    assert propose.evidence == {
        "findings": [
            {
                "id": "f1",
                "signature_id": "xid-79",
                "title": "GPU has fallen off the bus",
                "severity": "fatal",
                "evidence": "NVRM: Xid (PCI:0000:18:00): xid-79",
                "gpu_index": 3,
                "first_seen": T0.isoformat(),
                "last_seen": T0.isoformat(),
                "count": 1,
            }
        ],
        "history": [
            {
                "repair_id": "r0",
                "action": "reboot",
                "status": "succeeded",
                "finished_at": (T0 - 8 * DAY).isoformat(),
            }
        ],
        "topology": {"rack": "rack-7", "leaf_switch": "leaf-03", "pdu": "pdu-2"},
        "rule": "catalog xid-79 → reboot",
    }
    json.dumps(propose.evidence)  # the server stores it as JSON


@pytest.mark.parametrize("signature_id", ["xid-13", "xid-31", "xid-43", "no-such-signature"])
def test_workload_and_unknown_signatures_make_no_repair(signature_id: str) -> None:
    n = node()
    assert run(facts([n], [finding("f1", n, signature_id)])) == []


def test_an_unknown_signature_makes_no_repair_however_often_it_is_seen() -> None:
    n = node()
    assert run(facts([n], [finding("f1", n, "no-such-signature", count=50)])) == []


@pytest.mark.parametrize("signature_id", ["xid-13", "xid-31", "ib-link-down"])
def test_a_workload_signature_repeated_past_its_escalation_repairs_the_node(
    signature_id: str,
) -> None:
    signature = get_catalog().get(signature_id)
    assert signature is not None and signature.escalation is not None
    escalation = signature.escalation
    n = node()
    below = finding("f1", n, signature_id, count=escalation.repeat - 1)
    assert run(facts([n], [below])) == []  # the workload's, until it repeats
    repeated = finding("f1", n, signature_id, count=escalation.repeat)
    propose = only_propose(run(facts([n], [repeated])))
    assert propose.action is escalation.then
    assert f"catalog {signature_id} → {signature.action.value}; repeat: seen" in propose.rule


def test_a_cleared_finding_makes_no_repair() -> None:
    n = node()
    assert run(facts([n], [finding("f1", n, cleared_at=T0)]), now=T0 + MIN) == []


@pytest.mark.parametrize(
    "state",
    [NodeState.PROVISIONING, NodeState.REMOVING, NodeState.REMOVED, NodeState.FAILED],
)
def test_nodes_being_built_or_taken_apart_are_ignored(state: NodeState) -> None:
    n = node(state=state)
    assert run(facts([n], [finding("f1", n)])) == []


@pytest.mark.parametrize("state", [NodeState.CORDONED, NodeState.DRAINED, NodeState.ACCEPTANCE])
def test_nodes_out_of_service_but_present_are_repaired(state: NodeState) -> None:
    n = node(state=state)
    assert only_propose(run(facts([n], [finding("f1", n)]))).action is A.REBOOT


# -- rule 2: the catalog's repeat escalation ----------------------------------------------


def test_repeat_within_the_window_escalates_to_the_catalog_then() -> None:
    n = node()
    earlier = finding("f0", n, at=T0 - 3 * DAY, cleared_at=T0 - 3 * DAY + HOUR, gpu=2)
    now = finding("f1", n, gpu=2)

    propose = only_propose(run(facts([n], [earlier, now])))

    assert propose.action is A.REMOVE
    assert propose.rule == (
        "catalog xid-79 → reboot; repeat: seen 2× on GPU 2 within 7d (≥2) → remove"
    )
    assert propose.finding_ids == ("f1",)  # only open findings are behind the proposal


def test_one_finding_counted_twice_escalates() -> None:
    n = node()
    assert only_propose(run(facts([n], [finding("f1", n, count=2)]))).action is A.REMOVE


def test_repeat_outside_the_window_does_not_escalate() -> None:
    n = node()
    earlier = finding("f0", n, at=T0 - 8 * DAY, cleared_at=T0 - 8 * DAY + HOUR)
    assert only_propose(run(facts([n], [earlier, finding("f1", n)]))).action is A.REBOOT


def test_repeat_on_another_gpu_does_not_escalate() -> None:
    n = node()
    other_gpu = finding("f0", n, at=T0 - DAY, cleared_at=T0 - DAY + HOUR, gpu=5)
    propose = only_propose(run(facts([n], [other_gpu, finding("f1", n, gpu=2)])))
    assert propose.action is A.REBOOT
    assert propose.rule == "catalog xid-79 → reboot"


def test_primary_signature_is_the_most_drastic_action() -> None:
    n = node()
    remap = finding("f1", n, REMAP, at=T0 - MIN)
    fell = finding("f2", n, FELL_OFF)
    propose = only_propose(run(facts([n], [remap, fell])))
    assert (propose.signature_id, propose.action) == ("xid-79", A.REBOOT)
    assert propose.finding_ids == ("f1", "f2")


def test_primary_ties_go_to_severity_then_first_seen() -> None:
    n = node()
    gpu_lost = finding("f1", n, "gpu-lost", at=T0)  # fatal reboot
    init_failed = finding("f2", n, "gpu-init-failed", at=T0 - MIN)  # critical reboot
    assert only_propose(run(facts([n], [gpu_lost, init_failed]))).signature_id == "gpu-lost"

    earlier = finding("f3", n, "gpu-missing", at=T0 - HOUR)  # fatal reboot, earlier
    decisions = run(facts([n], [gpu_lost, init_failed, earlier]))
    assert only_propose(decisions).signature_id == "gpu-missing"


# -- rule 2: the ladder by host history ---------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "status", "expected"),
    [
        (A.REBOOT, RepairStatus.FAILED, A.REPROVISION),
        (A.REPROVISION, RepairStatus.SUCCEEDED, A.FAILOVER),
        (A.FAILOVER, RepairStatus.FAILED, A.REMOVE),
        (A.REMOVE, RepairStatus.FAILED, A.REMOVE),
    ],
)
def test_ladder_raises_past_the_hosts_last_action(
    previous: RepairAction, status: RepairStatus, expected: RepairAction
) -> None:
    n = node()
    history = ended("r0", n, previous, status, ago=2 * HOUR)
    propose = only_propose(run(facts([n], [finding("f1", n)], [history])))
    assert propose.action is expected
    assert propose.rule == (
        f"catalog xid-79 → reboot; ladder: host had {previous.value} ({status.value}) "
        f"2h ago → {expected.value}"
    )


def test_the_ladder_climbs_past_what_the_provider_cannot_do() -> None:
    n = node()
    history = ended("r0", n, A.REBOOT, RepairStatus.FAILED, ago=2 * HOUR)
    cannot = frozenset({A.REPROVISION, A.RESET_GPU})  # SSH: no reinstall, no GPU reset
    propose = only_propose(run(facts([n], [finding("f1", n)], [history], unsupported=cannot)))
    assert propose.action is A.FAILOVER
    assert propose.rule.endswith("→ reprovision; its provider cannot reprovision → failover")
    # A GPU reset a BMC cannot do becomes a reboot; a removal is always possible.
    gpu = only_propose(run(facts([n], [finding("f1", n, REMAP)], unsupported=cannot)))
    assert gpu.action is A.REBOOT and "its provider cannot reset_gpu → reboot" in gpu.rule
    everything = frozenset({A.RESET_GPU, A.REBOOT, A.REPROVISION, A.FAILOVER})
    last = only_propose(run(facts([n], [finding("f1", n)], unsupported=everything)))
    assert last.action is A.REMOVE


def test_ladder_climbs_from_reset_gpu() -> None:
    n = node()
    history = ended("r0", n, A.REBOOT, RepairStatus.FAILED, ago=2 * HOUR)
    propose = only_propose(run(facts([n], [finding("f1", n, REMAP)], [history])))
    assert propose.action is A.REPROVISION
    assert propose.evidence["history"][0]["repair_id"] == "r0"


def test_ladder_takes_the_most_drastic_previous_action() -> None:
    n = node()
    history = [
        ended("r0", n, A.REPROVISION, RepairStatus.FAILED, ago=3 * DAY),
        ended("r1", n, A.REBOOT, RepairStatus.FAILED, ago=2 * HOUR),
    ]
    assert only_propose(run(facts([n], [finding("f1", n)], history))).action is A.FAILOVER


def test_history_outside_the_ladder_window_does_not_count() -> None:
    n = node()
    history = ended("r0", n, A.REPROVISION, RepairStatus.FAILED, ago=7 * DAY + MIN)
    propose = only_propose(run(facts([n], [finding("f1", n)], [history])))
    assert (propose.action, propose.rule) == (A.REBOOT, "catalog xid-79 → reboot")


def test_a_new_host_after_failover_starts_clean() -> None:
    n = node(host="serial-NEW")
    history = ended("r0", n, A.FAILOVER, RepairStatus.SUCCEEDED, ago=2 * HOUR, host="serial-OLD")
    assert only_propose(run(facts([n], [finding("f1", n)], [history]))).action is A.REBOOT


@pytest.mark.parametrize("status", [RepairStatus.REJECTED, RepairStatus.RESOLVED])
def test_dismissed_repairs_are_not_history(status: RepairStatus) -> None:
    n = node()
    history = ended("r0", n, A.REBOOT, status, ago=2 * HOUR)
    assert only_propose(run(facts([n], [finding("f1", n)], [history]))).action is A.REBOOT


def test_a_ladder_below_the_candidate_is_not_named() -> None:
    n = node()
    history = ended("r0", n, A.RESET_GPU, RepairStatus.FAILED, ago=2 * HOUR)
    propose = only_propose(run(facts([n], [finding("f1", n)], [history])))
    assert (propose.action, propose.rule) == (A.REBOOT, "catalog xid-79 → reboot")


# -- rule 3: open repairs on the node -----------------------------------------------------


@pytest.mark.parametrize("status", sorted(ACTIVE_STATUSES))
def test_an_active_repair_blocks_anything_new(status: RepairStatus) -> None:
    n = node()
    active = repair("r1", n, status=status, finding_ids=["f0"])
    assert run(facts([n], [finding("f1", n, count=5)], [active])) == []


def test_a_member_of_an_active_incident_gets_nothing() -> None:
    n = node()
    active = incident("i1", "leaf_switch=leaf-01", [n], ["f0"], status=RepairStatus.APPROVED)
    assert run(facts([n], [finding("f1", n)], [active])) == []


def test_a_worse_finding_escalates_the_pending_proposal_in_place() -> None:
    n = node()
    remap = finding("f1", n, REMAP, at=T0 - HOUR)
    pending = repair("r1", n, action=A.RESET_GPU, signature_id=REMAP, finding_ids=["f1"])
    fell = finding("f2", n, FELL_OFF)

    update = only(run(facts([n], [remap, fell], [pending])))

    assert isinstance(update, Update)
    assert update.repair_id == "r1"
    assert (update.action, update.escalated_from) == (A.REBOOT, A.RESET_GPU)
    assert update.signature_id == "xid-79"
    assert update.finding_ids == ("f1", "f2")
    assert update.rule == "catalog xid-79 → reboot; escalates pending reset_gpu → reboot"
    assert [f["id"] for f in update.evidence["findings"]] == ["f1", "f2"]


def test_new_findings_behind_the_same_action_join_the_pending_proposal() -> None:
    n = node()
    first = finding("f1", n, at=T0 - HOUR, gpu=0)
    pending = repair("r1", n, finding_ids=["f1"])
    second = finding("f2", n, "gpu-init-failed", gpu=1)

    update = only(run(facts([n], [first, second], [pending])))

    assert isinstance(update, Update)
    assert (update.action, update.escalated_from) == (A.REBOOT, None)
    assert update.signature_id == "xid-79"  # the pending proposal's
    assert update.finding_ids == ("f1", "f2")


def test_a_pending_proposal_with_nothing_new_is_left_alone() -> None:
    n = node()
    pending = repair("r1", n, action=A.REMOVE, finding_ids=["f1"])
    # The new analysis says reboot; the pending remove is not lowered.
    assert run(facts([n], [finding("f1", n)], [pending])) == []


# -- rule 4: cooldown ---------------------------------------------------------------------


def test_a_recent_success_holds_new_proposals_until_the_cooldown_ends() -> None:
    n = node()
    done = ended("r0", n, A.REBOOT, RepairStatus.SUCCEEDED, ago=10 * MIN)

    hold = only(run(facts([n], [finding("f1", n)], [done])))

    assert isinstance(hold, Hold)
    assert hold.node_id == n.id
    assert hold.until == T0 + 20 * MIN
    assert "cooldown" in hold.reason


def test_the_cooldown_ends_and_the_ladder_applies() -> None:
    n = node()
    later = T0 + 20 * MIN
    done = ended("r0", n, A.REBOOT, RepairStatus.SUCCEEDED, ago=10 * MIN)
    decisions = run(facts([n], [finding("f1", n, at=T0)], [done]), now=later)
    assert only_propose(decisions).action is A.REPROVISION


def test_a_failed_repair_starts_no_cooldown() -> None:
    n = node()
    failed = ended("r0", n, A.REBOOT, RepairStatus.FAILED, ago=MIN)
    assert only_propose(run(facts([n], [finding("f1", n)], [failed]))).action is A.REPROVISION


# -- rule 5: incidents --------------------------------------------------------------------


def _leaf_nodes(count: int, leaf: str = "leaf-02") -> list[NodeFact]:
    """Nodes behind one leaf switch, each on its own rack and PDU."""
    return [
        node(f"node-{i:02d}", leaf=leaf, rack=f"rack-{i}", pdu=f"pdu-{i}") for i in range(count)
    ]


def _spread_nodes(count: int) -> list[NodeFact]:
    """Nodes that share nothing."""
    return [
        node(f"node-{i}", leaf=f"leaf-{i}", rack=f"rack-{i}", pdu=f"pdu-{i}") for i in range(count)
    ]


def test_nodes_behind_one_leaf_switch_become_one_incident() -> None:
    nodes = _leaf_nodes(4)
    findings = [finding(f"f{i}", n, at=T0 + i * MIN) for i, n in enumerate(nodes)]
    pending = [repair(f"r{i}", n, finding_ids=[f"f{i}"]) for i, n in enumerate(nodes[:2])]
    config = PolicyConfig(auto_approve=(AutoApproveRule("xid-79", A.REBOOT),))

    decisions = run(facts(nodes, findings, pending), config, now=T0 + 4 * MIN)

    incidents = [d for d in decisions if isinstance(d, ProposeIncident)]
    supersedes = [d for d in decisions if isinstance(d, Supersede)]
    assert len(decisions) == 3
    assert len(incidents) == 1
    assert isinstance(decisions[0], ProposeIncident)  # before the supersessions naming it
    assert not any(isinstance(d, Propose | Update) for d in decisions)
    proposal = incidents[0]
    assert proposal.incident_key == "leaf_switch=leaf-02"
    assert proposal.node_ids == tuple(sorted(n.id for n in nodes))
    assert proposal.finding_ids == ("f0", "f1", "f2", "f3")
    assert proposal.signature_id == "xid-79"
    assert proposal.evidence["label"] == "leaf_switch"
    assert proposal.evidence["value"] == "leaf-02"
    assert [m["name"] for m in proposal.evidence["nodes"]] == [n.name for n in nodes]
    assert proposal.evidence["topology"] == {"leaf_switch": "leaf-02", "pdu": None, "rack": None}
    json.dumps(proposal.evidence)
    assert sorted(s.repair_id for s in supersedes) == ["r0", "r1"]
    assert {s.incident_key for s in supersedes} == {"leaf_switch=leaf-02"}


def test_nodes_spread_over_different_leaves_get_node_repairs() -> None:
    nodes = _spread_nodes(3)
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes)]
    decisions = run(facts(nodes, findings))
    assert [type(d) for d in decisions] == [Propose, Propose, Propose]


def test_nodes_behind_one_leaf_but_not_together_get_node_repairs() -> None:
    nodes = _leaf_nodes(3)
    findings = [finding(f"f{i}", n, at=T0 + i * 4 * MIN) for i, n in enumerate(nodes)]
    decisions = run(facts(nodes, findings), now=T0 + 10 * MIN)
    assert [type(d) for d in decisions] == [Propose, Propose, Propose]


def test_the_largest_group_wins_then_the_most_specific_label() -> None:
    # Three share leaf-01 and rack-1; five share pdu-1: the PDU incident is larger.
    nodes = [node(f"node-{i}", leaf="leaf-01", rack="rack-1", pdu="pdu-1") for i in range(3)]
    nodes += [node(f"node-{i}", leaf=f"leaf-{i}", rack=f"rack-{i}", pdu="pdu-1") for i in (3, 4)]
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes)]
    decision = only(run(facts(nodes, findings)))
    assert isinstance(decision, ProposeIncident)
    assert decision.incident_key == "pdu=pdu-1"

    # On a tie the leaf switch (most specific) is named.
    decision = only(run(facts(nodes[:3], findings[:3])))
    assert isinstance(decision, ProposeIncident)
    assert decision.incident_key == "leaf_switch=leaf-01"


def test_an_open_incident_grows_instead_of_a_second_one() -> None:
    nodes = _leaf_nodes(4)
    findings = [finding(f"f{i}", n, at=T0 + i * MIN) for i, n in enumerate(nodes)]
    existing = incident("i1", "leaf_switch=leaf-02", nodes[:3], ["f0", "f1", "f2"])

    update = only(run(facts(nodes, findings, [existing]), now=T0 + 4 * MIN))

    assert isinstance(update, Update)
    assert update.repair_id == "i1"
    assert update.node_ids == tuple(sorted(n.id for n in nodes))
    assert update.finding_ids == ("f0", "f1", "f2", "f3")
    assert update.auto_approve is False


def test_a_pending_node_repair_that_joins_an_open_incident_is_superseded() -> None:
    nodes = _leaf_nodes(4)
    findings = [finding(f"f{i}", n, at=T0 + i * MIN) for i, n in enumerate(nodes)]
    existing = incident("i1", "leaf_switch=leaf-02", nodes[:3], ["f0", "f1", "f2"])
    pending = repair("r3", nodes[3], finding_ids=["f3"])

    decisions = run(facts(nodes, findings, [existing, pending]), now=T0 + 4 * MIN)

    assert [type(d) for d in decisions] == [Update, Supersede]
    supersede = decisions[1]
    assert isinstance(supersede, Supersede)
    assert (supersede.repair_id, supersede.incident_key) == ("r3", "leaf_switch=leaf-02")


def test_a_late_node_behind_an_open_incident_gets_its_own_repair() -> None:
    nodes = _leaf_nodes(4)
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes[:3])]
    findings.append(finding("f3", nodes[3], at=T0 + HOUR))
    existing = incident("i1", "leaf_switch=leaf-02", nodes[:3], ["f0", "f1", "f2"])
    decision = only(run(facts(nodes, findings, [existing]), now=T0 + HOUR))
    assert isinstance(decision, Propose)
    assert decision.node_id == nodes[3].id


def test_an_open_incident_with_nothing_new_stays_as_it_is() -> None:
    nodes = _leaf_nodes(3)
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes)]
    existing = incident("i1", "leaf_switch=leaf-02", nodes, ["f0", "f1", "f2"])
    assert run(facts(nodes, findings, [existing]), now=T0 + MIN) == []


def test_a_rejected_incident_leaves_its_nodes_to_node_repairs() -> None:
    nodes = _leaf_nodes(3)
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes)]
    rejected = incident(
        "i1", "leaf_switch=leaf-02", nodes, ["f0", "f1", "f2"], status=RepairStatus.REJECTED
    )
    decisions = run(facts(nodes, findings, [rejected]), now=T0 + MIN)
    assert [type(d) for d in decisions] == [Propose, Propose, Propose]


def test_incident_min_nodes_is_configurable() -> None:
    nodes = _leaf_nodes(3)
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes)]
    decisions = run(facts(nodes, findings), PolicyConfig(incident_min_nodes=4))
    assert [type(d) for d in decisions] == [Propose, Propose, Propose]


# -- rule 6: TTL auto-resolve -------------------------------------------------------------


def _cleared_proposal() -> ClusterFacts:
    n = node()
    cleared = finding("f1", n, at=T0 - HOUR, cleared_at=T0)
    return facts([n], [cleared], [repair("r1", n, finding_ids=["f1"], created_at=T0 - HOUR)])


def test_a_proposal_whose_findings_cleared_resolves_after_the_ttl() -> None:
    resolve = only(run(_cleared_proposal(), now=T0 + dt.timedelta(seconds=300)))
    assert isinstance(resolve, Resolve)
    assert resolve.repair_id == "r1"
    assert "cleared 5m ago" in resolve.reason


def test_a_proposal_is_kept_before_the_ttl() -> None:
    assert run(_cleared_proposal(), now=T0 + dt.timedelta(seconds=299)) == []


def test_a_reopened_finding_keeps_the_proposal() -> None:
    cluster = _cleared_proposal()
    n = cluster.nodes[0]
    reopened = finding("f2", n, at=T0 + 2 * MIN)
    cluster = facts(cluster.nodes, [*cluster.findings, reopened], cluster.repairs)
    decision = only(run(cluster, now=T0 + 10 * MIN))
    assert isinstance(decision, Update)  # the new finding joins it, no resolve
    assert decision.finding_ids == ("f1", "f2")


def test_a_finding_gone_from_the_facts_counts_as_cleared_at_the_update() -> None:
    n = node()
    stale = repair("r1", n, finding_ids=["gone"], created_at=T0 - HOUR)
    assert isinstance(only(run(facts([n], [], [stale]), now=T0 - HOUR + 5 * MIN)), Resolve)
    assert run(facts([n], [], [stale]), now=T0 - HOUR + 4 * MIN) == []


def test_a_manual_proposal_is_never_resolved() -> None:
    n = node()
    manual = repair("r1", n, finding_ids=["gone"], source=RepairSource.MANUAL)
    assert run(facts([n], [], [manual]), now=T0 + DAY) == []


def test_an_incident_resolves_when_all_its_findings_cleared() -> None:
    nodes = _leaf_nodes(3)
    findings = [finding(f"f{i}", n, cleared_at=T0 + MIN) for i, n in enumerate(nodes)]
    open_incident = incident("i1", "leaf_switch=leaf-02", nodes, ["f0", "f1", "f2"])
    cluster = facts(nodes, findings, [open_incident])
    assert run(cluster, now=T0 + 5 * MIN) == []
    resolve = only(run(cluster, now=T0 + 6 * MIN))
    assert isinstance(resolve, Resolve)
    assert resolve.repair_id == "i1"


# -- rule 7: auto-approve -----------------------------------------------------------------

XID79_REBOOT = PolicyConfig(auto_approve=(AutoApproveRule("xid-79", A.REBOOT),))


def test_auto_approve_covers_the_chosen_signature_and_action() -> None:
    n = node()
    assert only_propose(run(facts([n], [finding("f1", n)]), XID79_REBOOT)).auto_approve


def test_auto_approve_does_not_cover_another_action() -> None:
    n = node()
    propose = only_propose(run(facts([n], [finding("f1", n, count=2)]), XID79_REBOOT))
    assert (propose.action, propose.auto_approve) == (A.REMOVE, False)


def test_auto_approve_does_not_cover_another_signature() -> None:
    n = node()
    propose = only_propose(run(facts([n], [finding("f1", n, "gpu-lost")]), XID79_REBOOT))
    assert propose.auto_approve is False


def test_auto_approve_never_while_the_breaker_is_tripped() -> None:
    n = node()
    cluster = facts([n], [finding("f1", n)], breaker_tripped=True)
    assert only_propose(run(cluster, XID79_REBOOT)).auto_approve is False


def test_auto_approve_applies_to_an_escalating_update() -> None:
    n = node()
    pending = repair("r1", n, action=A.RESET_GPU, signature_id=REMAP, finding_ids=["f1"])
    cluster = facts([n], [finding("f1", n, REMAP), finding("f2", n)], [pending])
    update = only(run(cluster, XID79_REBOOT))
    assert isinstance(update, Update)
    assert update.auto_approve is True


# -- helpers and output order -------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "affected", "trips"),
    [
        (10, 0, False),
        (10, 1, True),
        (20, 1, False),
        (20, 2, True),
        (1, 0, False),
        (0, 0, True),
        (4, 0, False),  # the first repair in a small cluster always starts
        (4, 1, True),
    ],
)
def test_breaker_would_trip_above_the_share(total: int, affected: int, trips: bool) -> None:
    config = PolicyConfig(breaker_max_share=0.10)
    assert breaker_would_trip(total_nodes=total, affected_nodes=affected, config=config) is trips


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (A.NONE, A.RESET_GPU),
        (A.RESTART_WORKLOAD, A.RESET_GPU),
        (A.RESET_GPU, A.REBOOT),
        (A.REBOOT, A.REPROVISION),
        (A.REPROVISION, A.FAILOVER),
        (A.FAILOVER, A.REMOVE),
        (A.REMOVE, A.REMOVE),
    ],
)
def test_next_rung(action: RepairAction, expected: RepairAction) -> None:
    assert next_rung(action) is expected


def test_output_is_ordered_by_node_name_and_independent_of_input_order() -> None:
    nodes = _spread_nodes(6)
    findings = [finding(f"f{i}", n) for i, n in enumerate(nodes)]
    held = ended("r0", nodes[2], A.REBOOT, RepairStatus.SUCCEEDED, ago=MIN)
    cluster = facts(nodes, findings, [held])
    expected = run(cluster)
    assert [type(d) for d in expected] == [Propose, Propose, Hold, Propose, Propose, Propose]

    rng = random.Random(7)
    for _ in range(5):
        shuffled = facts(rng.sample(nodes, len(nodes)), rng.sample(findings, len(findings)), [held])
        assert run(shuffled) == expected


# -- dismissal -------------------------------------------------------------------------


def test_a_dismissed_recommendation_is_not_made_again_for_the_same_findings() -> None:
    n = node()
    f = finding("f1", n)
    dismissed = repair(
        "r1", n, status=RepairStatus.REJECTED, finding_ids=["f1"], finished_at=T0 + MIN
    )
    assert run(facts([n], [f], [dismissed]), now=T0 + HOUR) == []


def test_a_dismissed_finding_that_recurs_counts_again() -> None:
    n = node()
    f = finding("f1", n, last_seen=T0 + 2 * MIN, count=1)
    dismissed = repair(
        "r1", n, status=RepairStatus.REJECTED, finding_ids=["f1"], finished_at=T0 + MIN
    )
    proposal = only_propose(run(facts([n], [f], [dismissed]), now=T0 + HOUR))
    assert proposal.finding_ids == ("f1",)
