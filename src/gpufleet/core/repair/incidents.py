"""Rule 5 of the policy: nodes behind one leaf switch, PDU or rack that failed together
become one infrastructure incident instead of N node repairs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufleet.core.enums import severity_rank
from gpufleet.core.repair.evidence import incident_evidence
from gpufleet.core.repair.ladder import format_duration, seconds_between
from gpufleet.core.repair.models import (
    TOPOLOGY_LABELS,
    FindingFact,
    NodeFact,
    ProposeIncident,
    RepairFact,
    Update,
)
from gpufleet.core.signatures.models import Catalog


def incident_key(label: str, value: str) -> str:
    return f"{label}={value}"


def parse_incident_key(key: str | None) -> tuple[str, str] | None:
    """``"leaf_switch=leaf-02"`` → ``("leaf_switch", "leaf-02")``; ``None`` if malformed."""
    if key is None:
        return None
    label, sep, value = key.partition("=")
    if not sep or label not in TOPOLOGY_LABELS or not value:
        return None
    return label, value


@dataclass(frozen=True, slots=True)
class Member:
    """A node that may join an incident, with the findings that count for grouping
    (counted findings, less those an operator already dismissed as "not the switch")."""

    node: NodeFact
    findings: tuple[FindingFact, ...]

    @property
    def earliest(self) -> dt.datetime:
        return min(f.first_seen for f in self.findings)


@dataclass(frozen=True, slots=True)
class Group:
    label: str
    value: str
    members: tuple[Member, ...]  # by node name

    @property
    def key(self) -> str:
        return incident_key(self.label, self.value)

    @property
    def span_s(self) -> float:
        times = [m.earliest for m in self.members]
        return seconds_between(min(times), max(times))


def _by_time(member: Member) -> tuple[dt.datetime, str]:
    return (member.earliest, member.node.name)


def best_window(members: Sequence[Member], window_s: float) -> list[Member]:
    """The largest set of ``members`` whose earliest findings all fall within one window
    of ``window_s`` (the earliest such window on a tie)."""
    ordered = sorted(members, key=_by_time)
    best: list[Member] = []
    end = 0
    for start, first in enumerate(ordered):
        end = max(end, start)
        while end < len(ordered) and seconds_between(first.earliest, ordered[end].earliest) <= (
            window_s
        ):
            end += 1
        if end - start > len(best):
            best = ordered[start:end]
    return best


def form_groups(
    candidates: Iterable[Member],
    *,
    blocked_keys: frozenset[str],
    min_nodes: int,
    window_s: float,
) -> list[Group]:
    """New incidents among ``candidates``: the largest group first (ties by
    ``TOPOLOGY_LABELS`` order, then value), each node in at most one. A key in
    ``blocked_keys`` (an incident already open) never forms a second incident."""
    free = {m.node.id: m for m in candidates}
    groups: list[Group] = []
    while True:
        best: tuple[tuple[int, int, str], Group] | None = None
        for index, label in enumerate(TOPOLOGY_LABELS):
            by_value: dict[str, list[Member]] = {}
            for member in free.values():
                value = member.node.label(label)
                if value is not None and incident_key(label, value) not in blocked_keys:
                    by_value.setdefault(value, []).append(member)
            for value, members in by_value.items():
                if len(members) < min_nodes:
                    continue
                chosen = best_window(members, window_s)
                rank = (-len(chosen), index, value)
                if len(chosen) >= min_nodes and (best is None or rank < best[0]):
                    ordered = tuple(sorted(chosen, key=lambda m: m.node.name))
                    best = (rank, Group(label=label, value=value, members=ordered))
        if best is None:
            return groups
        groups.append(best[1])
        for member in best[1].members:
            del free[member.node.id]


def join_existing(
    *,
    label: str,
    value: str,
    anchors: Iterable[dt.datetime],
    candidates: Iterable[Member],
    window_s: float,
) -> list[Member]:
    """Candidates behind ``label=value`` whose earliest finding came within ``window_s``
    of the open incident's findings (or of a node that joined before them), by name."""
    times = list(anchors)
    pool = sorted((c for c in candidates if c.node.label(label) == value), key=_by_time)
    joined: list[Member] = []
    changed = True
    while changed:
        changed = False
        for member in pool:
            if member in joined:
                continue
            if any(abs(seconds_between(t, member.earliest)) <= window_s for t in times):
                joined.append(member)
                times.append(member.earliest)
                changed = True
    return sorted(joined, key=lambda m: m.node.name)


def most_severe(findings: Iterable[FindingFact]) -> FindingFact | None:
    """The finding that names an incident: the highest severity, then the earliest."""
    return min(
        findings,
        key=lambda f: (-severity_rank(f.severity), f.first_seen, f.id),
        default=None,
    )


def grow_incident(
    incident: RepairFact,
    *,
    current: Sequence[Member],
    pool: Sequence[Member],
    anchors: Iterable[dt.datetime],
    window_s: float,
) -> tuple[list[Member], Update | None]:
    """An open incident takes in the ``pool`` nodes behind its label that failed with it,
    and new findings of its ``current`` members: the nodes that joined, and the
    ``Update`` (``None`` when nothing changed). Never a second incident for one key."""
    key = incident.incident_key or incident.id
    parsed = parse_incident_key(incident.incident_key)
    joiners: list[Member] = []
    if parsed is not None:
        joiners = join_existing(
            label=parsed[0],
            value=parsed[1],
            anchors=[*anchors, *(m.earliest for m in current)],
            candidates=pool,
            window_s=window_s,
        )
    node_ids = set(incident.node_ids) | {m.node.id for m in joiners}
    everyone = sorted([*current, *joiners], key=lambda m: m.node.name)
    finding_ids = set(incident.finding_ids) | {f.id for m in everyone for f in m.findings}
    if node_ids == set(incident.node_ids) and finding_ids == set(incident.finding_ids):
        return joiners, None
    top = most_severe(f for m in everyone for f in m.findings)
    names = ", ".join(m.node.name for m in joiners) or "none"
    added = len(finding_ids - set(incident.finding_ids))
    rule = f"topology: incident {key} grows: nodes joined: {names}; new findings: {added}"
    label, value = parsed if parsed is not None else ("", key)
    update = Update(
        repair_id=incident.id,
        action=incident.action,
        signature_id=top.signature_id if top is not None else incident.signature_id,
        finding_ids=tuple(sorted(finding_ids)),
        reason=f"{key}: {len(node_ids)} nodes failing together (joined: {names})",
        rule=rule,
        evidence=incident_evidence(
            label=label, value=value, members=[(m.node, m.findings) for m in everyone], rule=rule
        ),
        node_ids=tuple(sorted(node_ids)),
    )
    return joiners, update


def propose_incident(
    group: Group, *, catalog: Catalog, min_nodes: int, window_s: float
) -> ProposeIncident:
    findings = [f for m in group.members for f in m.findings]
    top = most_severe(findings)
    assert top is not None  # every member has at least one finding
    rule = (
        f"topology: {len(group.members)} nodes behind {group.key} first seen within "
        f"{format_duration(group.span_s)} (≥{min_nodes} within {format_duration(window_s)})"
        " → incident"
    )
    names = ", ".join(m.node.name for m in group.members)
    signature = catalog.get(top.signature_id)
    title = signature.title if signature is not None else top.title
    reason = (
        f"{len(group.members)} nodes behind {group.label} {group.value} failed together "
        f"({names}): {title} ({top.signature_id}); check the {group.label.replace('_', ' ')}"
    )
    return ProposeIncident(
        incident_key=group.key,
        node_ids=tuple(sorted(m.node.id for m in group.members)),
        signature_id=top.signature_id,
        finding_ids=tuple(sorted(f.id for f in findings)),
        reason=reason,
        rule=rule,
        evidence=incident_evidence(
            label=group.label,
            value=group.value,
            members=[(m.node, m.findings) for m in group.members],
            rule=rule,
        ),
    )
