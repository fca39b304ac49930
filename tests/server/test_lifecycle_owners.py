"""One owner per lifecycle (DESIGN.md): a scan of ``src/`` for writes outside the owner,
and for the shape the owners keep: no import cycle, no mixin step classes, small modules.

Each rule is its own test function. The write scan is syntactic (``ast``), so it is
precise about where a write is and blunt about what is written to: an assignment to
``x.cleared_at`` counts whatever ``x`` is. The allow-lists name owner modules, never a
line; an allow-list of known offenders fails once an entry no longer offends, so the
pass that fixes one also removes it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grimp
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

WORKERS = "gpufleet/server/workers/"
# Step classes that still inherit from two classes. The repair executor is one class spread
# over three files (repair_executor.py, repair_acting.py, repair_verifying.py); the pass that
# moves repairs onto workers/base.py's step shape (steps in a table, given a context)
# removes this entry.
KNOWN_MIXINS = frozenset({"gpufleet/server/workers/repair_executor.py: RepairExecutor"})
# Bases that mark a class's kind rather than give it behaviour from elsewhere.
MARKER_BASES = frozenset({"Protocol", "Generic"})

SERVER = "gpufleet/server/"
MAX_SERVER_LINES = 600
# The table schema: one module on purpose (the store in one place).
LONG_BY_DESIGN = frozenset({"gpufleet/server/db/tables.py"})
# Known offenders, to be split by the passes that move their lifecycles onto the shared
# shapes (acceptance onto workers/base.py, node commands' service); shrinks to empty.
KNOWN_LONG = frozenset(
    {
        "gpufleet/server/workers/acceptance_steps.py",
        "gpufleet/server/services/node_commands.py",
    }
)


@dataclass(frozen=True)
class Write:
    module: str  # path relative to src/, e.g. gpufleet/server/services/findings.py
    line: int
    target: str  # e.g. "row.cleared_at"

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.target}"


def _sources(under: str = "gpufleet/") -> Iterator[tuple[str, str]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(under):
            yield rel, path.read_text(encoding="utf-8")


def _modules(under: str = "gpufleet/") -> Iterator[tuple[str, ast.Module]]:
    for rel, text in _sources(under):
        yield rel, ast.parse(text, filename=rel)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        out: list[ast.expr] = []
        for target in node.targets:
            out.extend(target.elts if isinstance(target, ast.Tuple | ast.List) else [target])
        return out
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def writes_in(
    module: str, tree: ast.AST, attrs: frozenset[str], *, keys: frozenset[str] = frozenset()
) -> list[Write]:
    """Every ``x.<attr> = …`` / ``x.<attr> += …`` in ``tree`` for ``attr`` in ``attrs``,
    and every ``x["<key>"] = …`` for ``key`` in ``keys`` (column values for a set-wise
    UPDATE)."""
    return [
        Write(module, target.lineno, ast.unparse(target))
        for node in ast.walk(tree)
        for target in _targets(node)
        if (isinstance(target, ast.Attribute) and target.attr in attrs)
        or (
            isinstance(target, ast.Subscript)
            and isinstance(target.slice, ast.Constant)
            and target.slice.value in keys
        )
    ]


def attribute_writes(attrs: frozenset[str], *, keys: frozenset[str] = frozenset()) -> list[Write]:
    return [w for module, tree in _modules() for w in writes_in(module, tree, attrs, keys=keys)]


def constructions_in(module: str, tree: ast.AST, class_name: str) -> list[Write]:
    """Every call of ``class_name(…)`` (or ``something.class_name(…)``) in ``tree``."""
    found: list[Write] = []
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


def constructions(class_name: str) -> list[Write]:
    return [w for module, tree in _modules() for w in constructions_in(module, tree, class_name)]


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
        for w in attribute_writes(frozenset({"health"}), keys=frozenset({"health"}))
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
        ('values["cleared_at"] = now', ["m.py:1: values['cleared_at']"]),
        ("row.cleared_at == now\nf(cleared_at=now)", []),  # a read and a keyword: no write
    ],
)
def test_the_scan_sees_every_form_of_assignment(source: str, expected: list[str]) -> None:
    fields = FINDING_STATE_FIELDS
    seen = writes_in("m.py", ast.parse(source), fields, keys=fields)
    assert [str(w) for w in seen] == expected


def test_the_scan_sees_a_finding_built_under_any_name() -> None:
    source = "FindingRow(id=1)\ntables.FindingRow(id=2)\nFindingRowish(id=3)\nFindingRow"
    seen = constructions_in("m.py", ast.parse(source), "FindingRow")
    assert [str(w) for w in seen] == ["m.py:1: FindingRow(…)", "m.py:2: FindingRow(…)"]


# -- the shape the owners keep ---------------------------------------------------------


def import_cycles(imports: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles in a module graph: each strongly connected set of modules (or a
    module importing itself), sorted. Tarjan's algorithm, iterative (deep graphs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in imports:
                    continue
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(imports[step]))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1 or module in imports[module]:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_src_has_no_import_cycle() -> None:
    # grimp reads every import, those under ``if TYPE_CHECKING:`` and inside functions too:
    # a cycle that only annotations close is still a cycle (STYLE §1: move the shared
    # code down a layer).
    graph = grimp.build_graph("gpufleet", cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    cycles = import_cycles(imports)
    assert cycles == [], "sets of modules that import each other round a loop:\n" + (
        "\n".join(", ".join(c) for c in cycles)
    )


def bases_of(tree: ast.AST) -> dict[str, list[str]]:
    """Each class in ``tree``: its bases other than markers (``Protocol``, ``Generic``)."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        named = []
        for base in node.bases:
            head = base.value if isinstance(base, ast.Subscript) else base
            name = head.attr if isinstance(head, ast.Attribute) else ast.unparse(head)
            if name not in MARKER_BASES:
                named.append(ast.unparse(base))
        found[node.name] = named
    return found


def test_no_mixin_step_classes() -> None:
    """A step machine is steps in a ``{status: step}`` table given a context object
    (``workers/base.py``), never one class assembled from several."""
    mixed = {
        f"{module}: {name}": bases
        for module, tree in _modules(WORKERS)
        for name, bases in bases_of(tree).items()
        if len(bases) > 1
    }
    stray = sorted(f"{where} ({', '.join(b)})" for where, b in mixed.items())
    stray = [s for s in stray if s.split(" (")[0] not in KNOWN_MIXINS]
    assert stray == [], "worker classes inheriting from more than one class:\n" + "\n".join(stray)
    fixed = sorted(KNOWN_MIXINS - set(mixed))
    assert fixed == [], f"no longer a mixin, remove it from KNOWN_MIXINS: {fixed}"


def test_no_server_module_over_600_lines() -> None:
    lines = {module: len(text.splitlines()) for module, text in _sources(SERVER)}
    long = {m: n for m, n in lines.items() if n > MAX_SERVER_LINES and m not in LONG_BY_DESIGN}
    stray = sorted(f"{m}: {n} lines" for m, n in long.items() if m not in KNOWN_LONG)
    assert stray == [], f"server modules over {MAX_SERVER_LINES} lines (split them):\n" + (
        "\n".join(stray)
    )
    fixed = sorted(KNOWN_LONG - set(long))
    assert fixed == [], f"now {MAX_SERVER_LINES} lines or under, remove from KNOWN_LONG: {fixed}"


@pytest.mark.parametrize(
    ("imports", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"a"}}, [["a"]]),
        ({"a": {"b", "x"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_the_cycle_scan_finds_every_loop(
    imports: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert import_cycles(imports) == expected


def test_the_mixin_scan_counts_only_bases_that_give_behaviour() -> None:
    source = (
        "class A(B, C): ...\n"
        "class P(Protocol[T]): ...\n"
        "class G(Base, Generic[T]): ...\n"
        "class S(StepContext[Row]): ...\n"
        "class M(mod.One, mod.Two): ...\n"
        "class Q(typing.Protocol, Other): ...\n"
    )
    assert bases_of(ast.parse(source)) == {
        "A": ["B", "C"],
        "P": [],
        "G": ["Base"],
        "S": ["StepContext[Row]"],
        "M": ["mod.One", "mod.Two"],
        "Q": ["Other"],
    }
