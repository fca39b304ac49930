"""The dry run: what a policy would have done over stored findings.

``replay()`` steps through [start, end], builds the cluster as it was at each instant and
calls ``plan()``, applying its decisions to simulated repairs. Pure: an admin can try a
different ``PolicyConfig`` over the same history and compare the reports.

What the simulation assumes, since it cannot know better:
- every node is in service (its state today says nothing about its state then);
- an auto-approved repair is carried out and succeeds at once, and its findings clear
  then (the catalog's clear rule "after its repair is verified");
- a finding's ``count`` is 1 until its ``last_seen``, and its full count from then on;
- repairs in ``history`` count (ladder, cooldown) only if they finished before ``start``;
  what really happened within the range is what the simulation replaces;
- the circuit breaker never trips (the cluster's cordons then are not known).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus
from gpufleet.core.errors import InvalidInput
from gpufleet.core.repair.analysis import IGNORED_NODE_STATES
from gpufleet.core.repair.models import (
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
    Resolve,
    Supersede,
    Update,
)
from gpufleet.core.repair.policy import plan
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.models import Catalog

ReplayKind = Literal["propose", "escalate", "update", "resolve", "supersede", "incident", "hold"]
REPLAY_KINDS: tuple[ReplayKind, ...] = (
    "propose",
    "escalate",
    "update",
    "resolve",
    "supersede",
    "incident",
    "hold",
)


@dataclass(frozen=True, slots=True)
class ReplayEntry:
    """One decision the policy would have made."""

    at: dt.datetime
    subject: str  # the node's name, or the incident's key
    kind: ReplayKind
    action: RepairAction | None  # None for an incident and a hold
    signature_id: str | None
    auto_approved: bool
    reason: str
    rule: str


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """``summary``: entries by kind (every kind, zeros included), ``action:<action>`` for
    the actions proposed or escalated to, and ``auto_approved``. The API sends it as is
    (pydantic writes the dataclass), and the client reads it back into this class."""

    entries: list[ReplayEntry]
    summary: dict[str, int]


def replay(
    *,
    nodes: Sequence[NodeFact],
    findings: Sequence[FindingFact],
    history: Sequence[RepairFact],
    config: PolicyConfig,
    start: dt.datetime,
    end: dt.datetime,
    catalog: Catalog | None = None,
) -> ReplayReport:
    """Replay ``findings`` over [start, end] under ``config``. Evaluation instants: the
    start, each finding's first_seen (and last_seen when it counted more than once),
    each cleared_at and cleared_at + ttl_s, and the end of each cooldown hold."""
    if end < start:
        raise InvalidInput(f"end ({end.isoformat()}) is before start ({start.isoformat()})")
    sim = _Simulation(
        nodes=nodes,
        findings=findings,
        history=history,
        config=config,
        start=start,
        end=end,
        catalog=catalog if catalog is not None else get_catalog(),
    )
    return sim.run()


class _Simulation:
    def __init__(
        self,
        *,
        nodes: Sequence[NodeFact],
        findings: Sequence[FindingFact],
        history: Sequence[RepairFact],
        config: PolicyConfig,
        start: dt.datetime,
        end: dt.datetime,
        catalog: Catalog,
    ) -> None:
        self.nodes = tuple(
            dataclasses.replace(n, state=NodeState.IN_SERVICE)
            if n.state in IGNORED_NODE_STATES
            else n
            for n in nodes
        )
        self.by_id = {n.id: n for n in self.nodes}
        self.findings = tuple(f for f in findings if f.first_seen <= end)
        self.history = tuple(
            r for r in history if r.finished_at is not None and r.finished_at < start
        )
        self.config = config
        self.start, self.end = start, end
        self.catalog = catalog
        self.repairs: dict[str, RepairFact] = {}
        self.cleared: dict[str, dt.datetime] = {}  # findings a simulated repair cleared
        self.entries: list[ReplayEntry] = []
        self.holds: set[tuple[str, dt.datetime | None]] = set()
        self.queue: list[dt.datetime] = []
        self.seen: set[dt.datetime] = set()

    def run(self) -> ReplayReport:
        ttl = dt.timedelta(seconds=self.config.ttl_s)
        self._at(self.start)
        for f in self.findings:
            self._at(f.first_seen)
            if f.count > 1:
                self._at(f.last_seen)
            if f.cleared_at is not None:
                self._at(f.cleared_at)
                self._at(f.cleared_at + ttl)
        while self.queue:
            now = heapq.heappop(self.queue)
            facts = ClusterFacts(
                cluster_id="replay",
                nodes=self.nodes,
                findings=self._findings_at(now),
                repairs=(*self.history, *self.repairs.values()),
            )
            for decision in plan(facts, self.config, now=now, catalog=self.catalog):
                self._apply(decision, now)
        return ReplayReport(entries=self.entries, summary=self._summary())

    def _at(self, instant: dt.datetime) -> None:
        if self.start <= instant <= self.end and instant not in self.seen:
            self.seen.add(instant)
            heapq.heappush(self.queue, instant)

    def _findings_at(self, now: dt.datetime) -> tuple[FindingFact, ...]:
        out: list[FindingFact] = []
        for f in self.findings:
            if f.first_seen > now:
                continue
            cleared = f.cleared_at
            simulated = self.cleared.get(f.id)
            if simulated is not None and (cleared is None or simulated < cleared):
                cleared = simulated
            out.append(
                dataclasses.replace(
                    f,
                    cleared_at=cleared if cleared is not None and cleared <= now else None,
                    last_seen=min(f.last_seen, now),
                    count=f.count if f.last_seen <= now else 1,
                )
            )
        return tuple(out)

    # -- applying decisions ------------------------------------------------------------

    def _apply(self, decision: Decision, now: dt.datetime) -> None:
        if isinstance(decision, Propose):
            repair = RepairFact(
                id=f"replay-{len(self.repairs) + 1}",
                kind=RepairKind.NODE,
                action=decision.action,
                status=RepairStatus.PROPOSED,
                signature_id=decision.signature_id,
                created_at=now,
                updated_at=now,
                node_id=decision.node_id,
                host=self.by_id[decision.node_id].host,
                finding_ids=decision.finding_ids,
            )
            self._store(repair, now, auto=decision.auto_approve)
            self._record(now, self._node_name(decision.node_id), "propose", decision)
        elif isinstance(decision, ProposeIncident):
            repair = RepairFact(
                id=f"replay-{len(self.repairs) + 1}",
                kind=RepairKind.INCIDENT,
                action=RepairAction.NONE,  # an infrastructure fix, done by people
                status=RepairStatus.PROPOSED,
                signature_id=decision.signature_id,
                created_at=now,
                updated_at=now,
                finding_ids=decision.finding_ids,
                incident_key=decision.incident_key,
                node_ids=decision.node_ids,
            )
            self._store(repair, now, auto=False)
            self._record(now, decision.incident_key, "incident", decision)
        elif isinstance(decision, Update):
            old = self.repairs.get(decision.repair_id)
            if old is None:
                return
            repair = dataclasses.replace(
                old,
                action=decision.action,
                signature_id=decision.signature_id,
                finding_ids=decision.finding_ids,
                node_ids=decision.node_ids or old.node_ids,
                updated_at=now,
            )
            self._store(repair, now, auto=decision.auto_approve)
            kind: ReplayKind = "escalate" if decision.escalated_from is not None else "update"
            self._record(now, self._subject(repair), kind, decision)
        elif isinstance(decision, Resolve | Supersede):
            old = self.repairs.get(decision.repair_id)
            if old is None:
                return
            status = (
                RepairStatus.RESOLVED if isinstance(decision, Resolve) else RepairStatus.SUPERSEDED
            )
            repair = dataclasses.replace(old, status=status, updated_at=now, finished_at=now)
            self.repairs[repair.id] = repair
            kind = "resolve" if isinstance(decision, Resolve) else "supersede"
            self._record(now, self._subject(repair), kind, decision, repair=repair)
        else:
            self._hold(decision, now)

    def _store(self, repair: RepairFact, now: dt.datetime, *, auto: bool) -> None:
        if auto:
            repair = dataclasses.replace(repair, status=RepairStatus.SUCCEEDED, finished_at=now)
            for finding_id in repair.finding_ids:
                self.cleared.setdefault(finding_id, now)
            self._at(now + dt.timedelta(seconds=self.config.ttl_s))
        self.repairs[repair.id] = repair

    def _hold(self, hold: Hold, now: dt.datetime) -> None:
        if (hold.node_id, hold.until) in self.holds:
            return  # the same cooldown, seen again at a later instant
        self.holds.add((hold.node_id, hold.until))
        if hold.until is not None:
            self._at(hold.until)
        self._record(now, self._node_name(hold.node_id), "hold", hold)

    def _record(
        self,
        now: dt.datetime,
        subject: str,
        kind: ReplayKind,
        decision: Decision,
        *,
        repair: RepairFact | None = None,
    ) -> None:
        action: RepairAction | None = None
        signature_id: str | None = None
        auto, rule = False, ""
        if isinstance(decision, Propose | Update):
            action, signature_id = decision.action, decision.signature_id
            auto, rule = decision.auto_approve, decision.rule
        elif isinstance(decision, ProposeIncident):
            signature_id, rule = decision.signature_id, decision.rule
        elif repair is not None:
            signature_id = repair.signature_id
            if repair.kind is RepairKind.NODE:
                action = repair.action
        if isinstance(decision, Update) and repair is None:
            stored = self.repairs.get(decision.repair_id)
            if stored is not None and stored.kind is RepairKind.INCIDENT:
                action = None
        self.entries.append(
            ReplayEntry(
                at=now,
                subject=subject,
                kind=kind,
                action=action,
                signature_id=signature_id,
                auto_approved=auto,
                reason=decision.reason,
                rule=rule,
            )
        )

    def _summary(self) -> dict[str, int]:
        summary: dict[str, int] = dict.fromkeys(REPLAY_KINDS, 0)
        for entry in self.entries:
            summary[entry.kind] += 1
            if entry.kind in ("propose", "escalate") and entry.action is not None:
                key = f"action:{entry.action.value}"
                summary[key] = summary.get(key, 0) + 1
        summary["auto_approved"] = sum(1 for e in self.entries if e.auto_approved)
        return summary

    def _subject(self, repair: RepairFact) -> str:
        if repair.kind is RepairKind.INCIDENT:
            return repair.incident_key or repair.id
        return self._node_name(repair.node_id or "")

    def _node_name(self, node_id: str) -> str:
        node = self.by_id.get(node_id)
        return node.name if node is not None else node_id
