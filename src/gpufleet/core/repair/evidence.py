"""The evidence a recommendation carries, as JSON-ready dicts (the server stores it as
JSON): the findings behind it, the host's repair history, the node's place in the
topology, and the rule that chose the action."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from gpufleet.core.repair.models import (
    ENDED_STATUSES,
    TOPOLOGY_LABELS,
    FindingFact,
    NodeFact,
    RepairFact,
    RepairKind,
)


def iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def sort_findings(findings: Iterable[FindingFact]) -> list[FindingFact]:
    return sorted(findings, key=lambda f: (f.first_seen, f.id))


def finding_json(finding: FindingFact) -> dict[str, Any]:
    return {
        "id": finding.id,
        "signature_id": finding.signature_id,
        "title": finding.title,
        "severity": finding.severity.value,
        "evidence": finding.evidence,
        "gpu_index": finding.gpu_index,
        "first_seen": iso(finding.first_seen),
        "last_seen": iso(finding.last_seen),
        "count": finding.count,
    }


def node_history(node: NodeFact, repairs: Iterable[RepairFact]) -> list[RepairFact]:
    """Ended node repairs of this node or of its host, oldest first."""
    return sorted(
        (
            r
            for r in repairs
            if r.kind is RepairKind.NODE
            and r.status in ENDED_STATUSES
            and r.finished_at is not None
            and (r.node_id == node.id or r.host == node.host)
        ),
        key=lambda r: (r.finished_at, r.id),
    )


def history_json(history: Iterable[RepairFact]) -> list[dict[str, Any]]:
    return [
        {
            "repair_id": r.id,
            "action": r.action.value,
            "status": r.status.value,
            "finished_at": iso(r.finished_at),
        }
        for r in history
    ]


def topology_json(node: NodeFact) -> dict[str, str | None]:
    return {label: node.label(label) for label in TOPOLOGY_LABELS}


def node_evidence(
    *,
    node: NodeFact,
    findings: Iterable[FindingFact],
    history: Iterable[RepairFact],
    rule: str,
) -> dict[str, Any]:
    return {
        "findings": [finding_json(f) for f in sort_findings(findings)],
        "history": history_json(history),
        "topology": topology_json(node),
        "rule": rule,
    }


def incident_evidence(
    *,
    label: str,
    value: str,
    members: Sequence[tuple[NodeFact, Sequence[FindingFact]]],
    rule: str,
) -> dict[str, Any]:
    """The label, the member nodes with their findings, and the topology they share (a
    label is ``None`` where the members differ)."""
    nodes = [m[0] for m in members]
    shared: dict[str, str | None] = {}
    for name in TOPOLOGY_LABELS:
        values = {n.label(name) for n in nodes}
        shared[name] = values.pop() if len(values) == 1 else None
    all_findings = [f for _, fs in members for f in fs]
    return {
        "label": label,
        "value": value,
        "nodes": [
            {
                "node_id": node.id,
                "name": node.name,
                "findings": [finding_json(f) for f in sort_findings(fs)],
            }
            for node, fs in members
        ],
        "findings": [finding_json(f) for f in sort_findings(all_findings)],
        "history": [],
        "topology": shared,
        "rule": rule,
    }
