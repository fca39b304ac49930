"""Rules 1 and 2 of the policy, for one node: which findings count, the action the catalog
asks for (raised by its repeat escalation), and the ladder by host history."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus, severity_rank
from gpufleet.core.repair.ladder import (
    format_duration,
    ladder_step,
    next_rung,
    rank,
    seconds_between,
)
from gpufleet.core.repair.models import (
    NODE_ACTIONS,
    FindingFact,
    NodeFact,
    PolicyConfig,
    RepairFact,
    RepairKind,
)
from gpufleet.core.signatures.models import Catalog, Signature

# A node being built or taken apart is not repaired by the policy.
IGNORED_NODE_STATES = frozenset(
    {NodeState.PROVISIONING, NodeState.REMOVING, NodeState.REMOVED, NodeState.FAILED}
)


def counted_signature(finding: FindingFact, catalog: Catalog) -> Signature | None:
    """The catalog entry when ``finding`` counts towards a node repair, else ``None``:
    closed findings, unknown signatures and workload actions never make a repair."""
    if not finding.open:
        return None
    signature = catalog.get(finding.signature_id)
    if signature is None or signature.action not in NODE_ACTIONS:
        return None
    return signature


def _escalating_signature(finding: FindingFact, catalog: Catalog) -> Signature | None:
    """The catalog entry of an open finding whose own action is the workload's but whose
    repeat escalation climbs to a node repair; else ``None``."""
    if not finding.open:
        return None
    signature = catalog.get(finding.signature_id)
    if signature is None or signature.escalation is None:
        return None
    return signature if signature.escalation.then in NODE_ACTIONS else None


def repeat_count(
    finding: FindingFact,
    node_findings: Sequence[FindingFact],
    *,
    within_s: float,
    now: dt.datetime,
) -> int:
    """How often ``finding``'s signature was seen on its node (on its GPU, when it names
    one) with a last sighting within ``within_s``: open and closed findings alike."""
    total = 0
    for other in node_findings:
        if other.signature_id != finding.signature_id:
            continue
        if finding.gpu_index is not None and other.gpu_index != finding.gpu_index:
            continue
        if seconds_between(other.last_seen, now) > within_s:
            continue
        total += other.count
    return total


@dataclass(frozen=True, slots=True)
class Candidate:
    """One counted finding and the action it asks for on its own."""

    finding: FindingFact
    signature: Signature
    action: RepairAction
    rule: str


@dataclass(frozen=True, slots=True)
class NodeAnalysis:
    """What one node needs: the final action, the primary signature and why."""

    node: NodeFact
    findings: tuple[FindingFact, ...]  # the counted open findings, oldest first
    primary: Candidate
    action: RepairAction
    rule: str

    @property
    def signature(self) -> Signature:
        return self.primary.signature

    @property
    def finding_ids(self) -> tuple[str, ...]:
        return tuple(sorted(f.id for f in self.findings))


def _candidate(
    finding: FindingFact,
    signature: Signature,
    node_findings: Sequence[FindingFact],
    *,
    now: dt.datetime,
) -> Candidate:
    rule = f"catalog {signature.id} → {signature.action.value}"
    escalation = signature.escalation
    if escalation is None:
        return Candidate(finding, signature, signature.action, rule)
    seen = repeat_count(finding, node_findings, within_s=escalation.within_s, now=now)
    if seen < escalation.repeat or rank(escalation.then) <= rank(signature.action):
        return Candidate(finding, signature, signature.action, rule)
    where = f" on GPU {finding.gpu_index}" if finding.gpu_index is not None else ""
    rule += (
        f"; repeat: seen {seen}×{where} within {format_duration(escalation.within_s)}"
        f" (≥{escalation.repeat}) → {escalation.then.value}"
    )
    return Candidate(finding, signature, escalation.then, rule)


def _primary_key(candidate: Candidate) -> tuple[int, int, dt.datetime, str]:
    # Most drastic action first, then the higher severity, then the earliest first_seen.
    return (
        -rank(candidate.action),
        -severity_rank(candidate.finding.severity),
        candidate.finding.first_seen,
        candidate.finding.id,
    )


def _dismissed(node: NodeFact, repairs: Sequence[RepairFact]) -> dict[str, dt.datetime]:
    """Findings named by a node repair an admin dismissed, with when it was dismissed."""
    out: dict[str, dt.datetime] = {}
    for repair in repairs:
        if (
            repair.kind is RepairKind.NODE
            and repair.node_id == node.id
            and repair.status is RepairStatus.REJECTED
        ):
            at = repair.finished_at or repair.updated_at
            for finding_id in repair.finding_ids:
                out[finding_id] = max(at, out.get(finding_id, at))
    return out


def analyse_node(
    node: NodeFact,
    node_findings: Sequence[FindingFact],
    repairs: Sequence[RepairFact],
    *,
    catalog: Catalog,
    config: PolicyConfig,
    now: dt.datetime,
    unsupported: frozenset[RepairAction] = frozenset(),
) -> NodeAnalysis | None:
    """The node's final action and the rule behind it, or ``None`` when nothing counts.
    An action in ``unsupported`` (the cluster's provider cannot take it) climbs to the
    next rung it can take; ``remove`` always can."""
    if node.state in IGNORED_NODE_STATES:
        return None
    dismissed = _dismissed(node, repairs)
    candidates: list[Candidate] = []
    for finding in node_findings:
        until = dismissed.get(finding.id)
        if until is not None and finding.last_seen <= until:
            continue  # an admin dismissed a repair for it; it counts again if it recurs
        signature = counted_signature(finding, catalog)
        if signature is not None:
            candidates.append(_candidate(finding, signature, node_findings, now=now))
            continue
        # The workload's own (``none``, ``restart_workload``) until it repeats as the
        # catalog's escalation says: then the node is suspect (Xid 31 again and again on
        # one GPU across jobs, a port down three times in a day).
        escalates = _escalating_signature(finding, catalog)
        if escalates is not None:
            candidate = _candidate(finding, escalates, node_findings, now=now)
            if candidate.action in NODE_ACTIONS:
                candidates.append(candidate)
    if not candidates:
        return None
    primary = min(candidates, key=_primary_key)
    action, rule = primary.action, primary.rule
    step = ladder_step(node.host, repairs, now=now, window_s=config.ladder_window_s)
    if step is not None and rank(step.action) > rank(action):
        previous = step.previous
        assert previous.finished_at is not None  # ladder_step only keeps ended repairs
        ago = format_duration(seconds_between(previous.finished_at, now))
        rule += (
            f"; ladder: host had {previous.action.value} ({previous.status.value})"
            f" {ago} ago → {step.action.value}"
        )
        action = step.action
    while action in unsupported and action is not RepairAction.REMOVE:
        climbed = next_rung(action)
        rule += f"; its provider cannot {action.value} → {climbed.value}"
        action = climbed
    findings = tuple(sorted((c.finding for c in candidates), key=lambda f: (f.first_seen, f.id)))
    return NodeAnalysis(node=node, findings=findings, primary=primary, action=action, rule=rule)
