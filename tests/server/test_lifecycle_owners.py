"""One owner per lifecycle (DESIGN.md): a scan of ``src/`` for writes outside the owner.

Each rule is its own test function. The scan is syntactic (``ast``), so it is precise about
where a write is and blunt about what is written to: an assignment to ``x.cleared_at``
counts whatever ``x`` is. The allow-lists name owner modules, never a line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import gpufleet

SRC = Path(gpufleet.__file__).parent
ROOT = SRC.parent  # paths below read "gpufleet/server/…"

FINDINGS_OWNER = "gpufleet/server/services/findings.py"
HEALTH_OWNER = "gpufleet/server/services/node_health.py"
# A FindingRow's state: only the findings service opens, folds and clears. (``evidence``
# is left out: a RepairRow has one too, which the planner writes.)
FINDING_STATE_FIELDS = frozenset({"cleared_at", "count", "first_seen", "last_seen", "severity"})
# Cluster health has its own owner, the cluster health refresh; the scan lets that module
# assign ``cluster.health`` and nothing else.
CLUSTER_HEALTH_OWNER = "gpufleet/server/services/health.py"


@dataclass(frozen=True)
class Write:
    module: str  # path relative to src/, e.g. gpufleet/server/services/findings.py
    line: int
    target: str  # e.g. "row.cleared_at"

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.target}"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=rel)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        out: list[ast.expr] = []
        for target in node.targets:
            out.extend(target.elts if isinstance(target, ast.Tuple | ast.List) else [target])
        return out
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def writes_in(module: str, tree: ast.AST, attrs: frozenset[str]) -> list[Write]:
    """Every ``x.<attr> = …`` / ``x.<attr> += …`` in ``tree`` for ``attr`` in ``attrs``."""
    return [
        Write(module, target.lineno, ast.unparse(target))
        for node in ast.walk(tree)
        for target in _targets(node)
        if isinstance(target, ast.Attribute) and target.attr in attrs
    ]


def attribute_writes(attrs: frozenset[str]) -> list[Write]:
    return [w for module, tree in _modules() for w in writes_in(module, tree, attrs)]


def constructions(class_name: str) -> list[Write]:
    """Every call of ``class_name(…)`` (or ``something.class_name(…)``) in src/."""
    found: list[Write] = []
    for module, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if name == class_name:
                found.append(Write(module, node.lineno, f"{class_name}(…)"))
    return found


def test_only_the_findings_service_changes_a_findings_state() -> None:
    stray = [str(w) for w in attribute_writes(FINDING_STATE_FIELDS) if w.module != FINDINGS_OWNER]
    assert stray == [], (
        "a finding's state is written only by gpufleet.server.services.findings "
        "(open_or_fold_finding / clear_finding / close_findings_for_repair):\n" + "\n".join(stray)
    )


def test_only_the_findings_service_creates_a_finding() -> None:
    stray = [str(w) for w in constructions("FindingRow") if w.module != FINDINGS_OWNER]
    assert stray == [], "FindingRow is built only by services/findings.py:\n" + "\n".join(stray)


def test_only_the_node_health_service_changes_health() -> None:
    stray = [
        str(w)
        for w in attribute_writes(frozenset({"health"}))
        if w.module != HEALTH_OWNER
        and not (w.module == CLUSTER_HEALTH_OWNER and w.target == "cluster.health")
    ]
    assert stray == [], (
        "node and GPU health are written only by gpufleet.server.services.node_health "
        "(refresh_node_health / set_node_health), which writes the event:\n" + "\n".join(stray)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("row.cleared_at = now", ["m.py:1: row.cleared_at"]),
        ("row.count += 1", ["m.py:1: row.count"]),
        ("a.b.last_seen: int = 3", ["m.py:1: a.b.last_seen"]),
        ("x, row.severity = 1, 2", ["m.py:1: row.severity"]),
        ("row.cleared_at == now\nf(cleared_at=now)", []),  # a read and a keyword: no write
    ],
)
def test_the_scan_sees_every_form_of_assignment(source: str, expected: list[str]) -> None:
    seen = writes_in("m.py", ast.parse(source), FINDING_STATE_FIELDS)
    assert [str(w) for w in seen] == expected
