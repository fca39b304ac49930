"""The repair policy: from a cluster's findings and repair history to recommendations.

Pure: no I/O and no clock (``now`` is passed in), so the server's reconciler and the dry
run (``replay.py``) run the same code. The rules, in the order they apply, are in
DESIGN.md "Repair semantics"; each ``Decision`` says in ``rule`` which of them fired.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from gpufleet.core.enums import RepairAction, RepairStatus
from gpufleet.core.repair.analysis import NodeAnalysis, analyse_node
from gpufleet.core.repair.evidence import node_evidence, node_history
from gpufleet.core.repair.incidents import Member, form_groups, grow_incident, propose_incident
from gpufleet.core.repair.ladder import format_duration, next_rung, rank, seconds_between
from gpufleet.core.repair.models import (
    ACTIVE_STATUSES,
    OPEN_STATUSES,
    ClusterFacts,
    Decision,
    FindingFact,
    Hold,
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
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.models import Catalog

__all__ = ["breaker_would_trip", "next_rung", "plan"]

# Output order within one node name. An incident sorts under its first member's name and
# before the supersessions that point at it, so applying in order never meets a dangling key.
_TYPE_ORDER: dict[type, int] = {
    Resolve: 0,
    ProposeIncident: 1,
    Supersede: 2,
    Update: 3,
    Propose: 4,
    Hold: 5,
}


def plan(
    facts: ClusterFacts,
    config: PolicyConfig,
    *,
    now: dt.datetime,
    catalog: Catalog | None = None,
) -> list[Decision]:
    """What the policy recommends for ``facts`` at ``now``: new proposals, in-place
    updates and escalations, incidents, auto-resolves, supersessions and cooldown holds,
    ordered by node name then decision type. ``catalog`` defaults to the packaged one."""
    planner = _Planner(
        facts, config, now=now, catalog=catalog if catalog is not None else get_catalog()
    )
    return planner.run()


def breaker_would_trip(*, total_nodes: int, affected_nodes: int, config: PolicyConfig) -> bool:
    """Whether starting one more repair would put more than ``breaker_max_share`` of the
    cluster out of service. ``affected_nodes``: nodes already cordoned, draining,
    drained or repairing, or with an active repair. One repair at a time is always
    allowed (else a 10% share would block every repair in a cluster under 10 nodes); an
    empty cluster trips (fail closed)."""
    if total_nodes <= 0:
        return True
    if affected_nodes == 0:
        return False
    return (affected_nodes + 1) / total_nodes > config.breaker_max_share


class _Planner:
    def __init__(
        self,
        facts: ClusterFacts,
        config: PolicyConfig,
        *,
        now: dt.datetime,
        catalog: Catalog,
    ) -> None:
        self.facts = facts
        self.config = config
        self.now = now
        self.catalog = catalog
        self.names = {n.id: n.name for n in facts.nodes}
        self.findings = {f.id: f for f in facts.findings}
        by_node: dict[str, list[FindingFact]] = {}
        for finding in facts.findings:
            by_node.setdefault(finding.node_id, []).append(finding)
        self.analyses: dict[str, NodeAnalysis] = {}
        for node in sorted(facts.nodes, key=lambda n: (n.name, n.id)):
            analysis = analyse_node(
                node,
                by_node.get(node.id, []),
                facts.repairs,
                catalog=catalog,
                config=config,
                now=now,
                unsupported=facts.unsupported,
            )
            if analysis is not None:
                self.analyses[node.id] = analysis
        self.out: list[tuple[tuple[str, int, str], Decision]] = []

    # -- the rules, in order ---------------------------------------------------------

    def run(self) -> list[Decision]:
        resolved = self._resolve_expired()
        proposed = [
            r
            for r in self.facts.repairs
            if r.status is RepairStatus.PROPOSED and r.id not in resolved
        ]
        incidents = sorted(
            (r for r in proposed if r.kind is RepairKind.INCIDENT),
            key=lambda r: (r.incident_key or "", r.id),
        )
        pending: dict[str, RepairFact] = {}
        for repair in sorted(proposed, key=lambda r: (r.created_at, r.id)):
            if repair.kind is RepairKind.NODE and repair.node_id is not None:
                pending[repair.node_id] = repair  # the newest, should there be two
        in_incident: dict[str, RepairFact] = {}
        for incident in incidents:
            for node_id in incident.node_ids:
                in_incident.setdefault(node_id, incident)
        active = self._active_nodes()

        fresh: list[str] = []
        for node_id, analysis in self.analyses.items():
            if node_id in active or node_id in in_incident or node_id in pending:
                continue
            hold = self._cooldown(analysis)
            if hold is not None:
                self._emit(self._name(node_id), hold)
            else:
                fresh.append(node_id)

        members = self._members([*in_incident, *pending, *fresh], active)
        assigned: dict[str, str] = {}
        pool = [members[n] for n in [*pending, *fresh] if n in members and n not in in_incident]
        for incident in incidents:
            self._grow_incident(incident, members, assigned, pool)
        blocked = frozenset(
            r.incident_key
            for r in self.facts.repairs
            if r.kind is RepairKind.INCIDENT
            and r.status in OPEN_STATUSES
            and r.incident_key is not None
        )
        for group in form_groups(
            [m for m in pool if m.node.id not in assigned],
            blocked_keys=blocked,
            min_nodes=self.config.incident_min_nodes,
            window_s=self.config.incident_window_s,
        ):
            proposal = propose_incident(
                group,
                catalog=self.catalog,
                min_nodes=self.config.incident_min_nodes,
                window_s=self.config.incident_window_s,
            )
            self._emit(self._sort_name(proposal.node_ids), proposal)
            assigned.update((m.node.id, group.key) for m in group.members)

        for node_id, repair in pending.items():
            key = assigned.get(node_id)
            if key is None and node_id in in_incident:
                key = in_incident[node_id].incident_key or in_incident[node_id].id
            if key is not None and node_id not in active:
                reason = f"{self._name(node_id)}: folded into incident {key}"
                self._emit(self._name(node_id), Supersede(repair.id, reason, key))
            elif key is None and node_id in self.analyses and node_id not in active:
                self._update_node(self.analyses[node_id], repair)
        for node_id in fresh:
            if node_id not in assigned:
                self._propose_node(self.analyses[node_id])
        self.out.sort(key=lambda item: item[0])
        return [decision for _, decision in self.out]

    def _resolve_expired(self) -> set[str]:
        """Rule 6: a proposal whose findings all cleared ``ttl_s`` ago resolves itself."""
        done: set[str] = set()
        for repair in sorted(self.facts.repairs, key=lambda r: r.id):
            if (
                repair.status is not RepairStatus.PROPOSED
                or repair.source is RepairSource.MANUAL  # an admin asked for it
                or not repair.finding_ids
            ):
                continue
            node_ids = self._nodes_of(repair)
            if any(n in self.analyses for n in node_ids):
                continue  # a counted finding is open again (or still) on the node
            cleared = self._latest_clear(repair)
            if cleared is None or seconds_between(cleared, self.now) < self.config.ttl_s:
                continue
            subject = repair.incident_key or self._name(repair.node_id or "")
            reason = (
                f"{subject}: the findings behind {repair.action.value} cleared "
                f"{format_duration(seconds_between(cleared, self.now))} ago "
                f"(TTL {format_duration(self.config.ttl_s)})"
            )
            self._emit(self._sort_name(node_ids), Resolve(repair.id, reason))
            done.add(repair.id)
        return done

    def _latest_clear(self, repair: RepairFact) -> dt.datetime | None:
        latest: dt.datetime | None = None
        for finding_id in repair.finding_ids:
            finding = self.findings.get(finding_id)
            if finding is None:
                cleared = repair.updated_at  # gone from the facts: long cleared
            elif finding.cleared_at is None:
                return None
            else:
                cleared = finding.cleared_at
            latest = cleared if latest is None else max(latest, cleared)
        return latest

    def _active_nodes(self) -> set[str]:
        """Rule 3: a node with a repair under way gets nothing new."""
        active: set[str] = set()
        for repair in self.facts.repairs:
            if repair.status in ACTIVE_STATUSES:
                active.update(self._nodes_of(repair))
        return active

    def _cooldown(self, analysis: NodeAnalysis) -> Hold | None:
        """Rule 4: no new repair soon after one succeeded. A failed one starts no
        cooldown: its node goes straight to the next rung."""
        node_id = analysis.node.id
        last: RepairFact | None = None
        for repair in self.facts.repairs:
            if (
                repair.status is RepairStatus.SUCCEEDED
                and repair.finished_at is not None
                and node_id in self._nodes_of(repair)
                and (last is None or (repair.finished_at, repair.id) > _finished(last))
            ):
                last = repair
        if last is None or last.finished_at is None:
            return None
        if seconds_between(last.finished_at, self.now) >= self.config.cooldown_s:
            return None
        until = last.finished_at + dt.timedelta(seconds=self.config.cooldown_s)
        reason = (
            f"{analysis.node.name}: {_what(analysis)} would get {analysis.action.value}, "
            f"but {last.action.value} ({last.id}) succeeded "
            f"{format_duration(seconds_between(last.finished_at, self.now))} ago; "
            f"cooldown until {until.isoformat()}"
        )
        return Hold(node_id, reason, until)

    def _members(self, node_ids: Iterable[str], active: set[str]) -> dict[str, Member]:
        """Rule 5's candidates, less the findings a rejected incident named."""
        excluded = {
            finding_id
            for r in self.facts.repairs
            if r.kind is RepairKind.INCIDENT and r.status is RepairStatus.REJECTED
            for finding_id in r.finding_ids
        }
        members: dict[str, Member] = {}
        for node_id in node_ids:
            analysis = self.analyses.get(node_id)
            if analysis is None or node_id in active:
                continue
            findings = tuple(f for f in analysis.findings if f.id not in excluded)
            if findings:
                members[node_id] = Member(node=analysis.node, findings=findings)
        return members

    def _grow_incident(
        self,
        incident: RepairFact,
        members: dict[str, Member],
        assigned: dict[str, str],
        pool: list[Member],
    ) -> None:
        key = incident.incident_key or incident.id
        for node_id in incident.node_ids:
            assigned.setdefault(node_id, key)
        named = [self.findings[f] for f in incident.finding_ids if f in self.findings]
        joiners, update = grow_incident(
            incident,
            current=[members[n] for n in incident.node_ids if n in members],
            pool=[m for m in pool if m.node.id not in assigned],
            anchors=[f.first_seen for f in named],
            window_s=self.config.incident_window_s,
        )
        assigned.update((m.node.id, key) for m in joiners)
        if update is not None:
            self._emit(self._sort_name(update.node_ids), update)

    def _update_node(self, analysis: NodeAnalysis, repair: RepairFact) -> None:
        """Rule 3: a worse action escalates the pending proposal in place; new findings
        behind the same action join it."""
        old = repair.action
        finding_ids = tuple(sorted(set(repair.finding_ids) | set(analysis.finding_ids)))
        added = set(analysis.finding_ids) - set(repair.finding_ids)
        behind = [self.findings[f] for f in finding_ids if f in self.findings]
        if rank(analysis.action) > rank(old):
            action, signature_id, escalated_from = analysis.action, analysis.signature.id, old
            rule = f"{analysis.rule}; escalates pending {old.value} → {action.value}"
            reason = (
                f"{analysis.node.name}: {_what(analysis)} → {action.value} "
                f"(escalated from {old.value})"
            )
        elif added:
            action, signature_id, escalated_from = old, repair.signature_id, None
            rule = f"{analysis.rule}; pending {old.value} kept, {len(added)} new finding(s)"
            signature = self.catalog.get(signature_id)
            what = f"{signature.title} ({signature_id})" if signature else _what(analysis)
            reason = f"{analysis.node.name}: {what} → {old.value} ({len(added)} new finding(s))"
        else:
            return
        update = Update(
            repair_id=repair.id,
            action=action,
            signature_id=signature_id,
            finding_ids=finding_ids,
            reason=reason,
            rule=rule,
            evidence=self._node_evidence(analysis, behind, rule),
            escalated_from=escalated_from,
            auto_approve=self._auto_approve(signature_id, action),
        )
        self._emit(analysis.node.name, update)

    def _propose_node(self, analysis: NodeAnalysis) -> None:
        propose = Propose(
            node_id=analysis.node.id,
            action=analysis.action,
            signature_id=analysis.signature.id,
            finding_ids=analysis.finding_ids,
            reason=f"{analysis.node.name}: {_what(analysis)} → {analysis.action.value}",
            rule=analysis.rule,
            evidence=self._node_evidence(analysis, analysis.findings, analysis.rule),
            auto_approve=self._auto_approve(analysis.signature.id, analysis.action),
        )
        self._emit(analysis.node.name, propose)

    # -- helpers ---------------------------------------------------------------------

    def _auto_approve(self, signature_id: str, action: RepairAction) -> bool:
        """Rule 7: only what an admin opted in to, and never while the breaker is open."""
        return self.config.auto_approves(signature_id, action) and not self.facts.breaker_tripped

    def _node_evidence(
        self, analysis: NodeAnalysis, findings: Iterable[FindingFact], rule: str
    ) -> dict[str, Any]:
        history = node_history(analysis.node, self.facts.repairs)
        return node_evidence(node=analysis.node, findings=findings, history=history, rule=rule)

    def _nodes_of(self, repair: RepairFact) -> tuple[str, ...]:
        if repair.kind is RepairKind.INCIDENT:
            return repair.node_ids
        return (repair.node_id,) if repair.node_id is not None else ()

    def _name(self, node_id: str) -> str:
        return self.names.get(node_id, node_id)

    def _sort_name(self, node_ids: tuple[str, ...]) -> str:
        return min((self._name(n) for n in node_ids), default="")

    def _emit(self, name: str, decision: Decision) -> None:
        tiebreak = getattr(decision, "repair_id", None) or getattr(decision, "incident_key", "")
        self.out.append(((name, _TYPE_ORDER[type(decision)], str(tiebreak)), decision))


def _what(analysis: NodeAnalysis) -> str:
    return f"{analysis.signature.title} ({analysis.signature.id})"


def _finished(repair: RepairFact) -> tuple[dt.datetime, str]:
    assert repair.finished_at is not None
    return (repair.finished_at, repair.id)
