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
# Which node an agent request comes from: the one module that looks a node up by its
# token's hash and says which node states refuse the token.
NODE_CALLER_OWNER = "gpufleet/server/services/node_callers.py"
# Other tables keep a token hash too; comparing theirs is their owners' business.
OTHER_TOKEN_TABLES = frozenset({"ApiTokenRow", "WebSessionRow"})

WORKERS = "gpufleet/server/workers/"
# Step classes that still inherit from two classes ("module: Class"); the pass that moves
# one onto workers/base.py's step shape (steps in a table, given a context) removes it.
KNOWN_MIXINS: frozenset[str] = frozenset()
# Bases that mark a class's kind rather than give it behaviour from elsewhere.
MARKER_BASES = frozenset({"Protocol", "Generic"})

SERVER = "gpufleet/server/"
MAX_SERVER_LINES = 600
# The table schema: one module on purpose (the store in one place).
LONG_BY_DESIGN = frozenset({"gpufleet/server/db/tables.py"})
# Known offenders, to be split by the passes that move their lifecycles onto the shared
# shapes; empty now, kept so that a module allowed long for a while fails once split.
KNOWN_LONG: frozenset[str] = frozenset()


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


def node_token_lookups_in(module: str, tree: ast.AST) -> list[Write]:
    """Every ``NodeRow.token_hash`` read (a query by it) and every comparison of some
    ``x.token_hash`` (``node.token_hash == h``) but another table's. Writes (a fresh
    token on provisioning) are neither."""
    found: list[Write] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "token_hash"
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name)
            and node.value.id == "NodeRow"
        ):
            found.append(Write(module, node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if (
                    isinstance(side, ast.Attribute)
                    and side.attr == "token_hash"
                    and not (isinstance(side.value, ast.Name) and side.value.id in _NOT_NODES)
                ):
                    found.append(Write(module, node.lineno, ast.unparse(node)))
    return sorted(set(found), key=lambda w: (w.line, w.target))


_NOT_NODES = OTHER_TOKEN_TABLES | {"NodeRow"}  # NodeRow's own reads are found above


def _is_node_state(expr: ast.expr, state: str) -> bool:
    """``NodeState.REMOVED`` / ``NodeState.REMOVED.value`` (or through an alias ``N``)."""
    if isinstance(expr, ast.Attribute) and expr.attr == "value":
        expr = expr.value
    return isinstance(expr, ast.Attribute) and expr.attr == state


def refused_state_sets_in(module: str, tree: ast.AST) -> list[Write]:
    """Every name bound to a collection of exactly the removing and removed node states
    (``_GONE = frozenset({NodeState.REMOVING.value, NodeState.REMOVED.value})``): a
    private copy of the states whose token is refused. A comparison written inline
    (``state in (REMOVING, REMOVED)``: "is the node gone?") is not a definition."""
    found: list[Write] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        value = node.value
        if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
            value = value.args[0]  # frozenset({...}) / set([...]) / tuple(...)
        if not isinstance(value, ast.Set | ast.Tuple | ast.List) or len(value.elts) != 2:
            continue
        if any(_is_node_state(e, "REMOVING") for e in value.elts) and any(
            _is_node_state(e, "REMOVED") for e in value.elts
        ):
            for target in _targets(node):
                found.append(Write(module, node.lineno, ast.unparse(target)))
    return found


def test_only_the_node_caller_module_looks_a_node_up_by_its_token() -> None:
    stray = [
        str(w)
        for module, tree in _modules()
        if module != NODE_CALLER_OWNER
        for w in node_token_lookups_in(module, tree)
    ]
    assert stray == [], (
        "a node is found by its token only in gpufleet.server.services.node_callers "
        "(agent routes: server.deps.NodeCallerDep; the report ingest: "
        "nodes_by_token_hash):\n" + "\n".join(stray)
    )


def test_only_the_node_caller_module_says_which_node_states_refuse_a_token() -> None:
    stray = [
        str(w)
        for module, tree in _modules()
        if module != NODE_CALLER_OWNER
        for w in refused_state_sets_in(module, tree)
    ]
    assert stray == [], (
        "the node states whose token is refused are node_callers.REFUSED_NODE_STATES; "
        "use it instead of a copy:\n" + "\n".join(stray)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("select(NodeRow).where(NodeRow.token_hash == h)", ["m.py:1: NodeRow.token_hash"]),
        ("NodeRow.token_hash.in_(hashes)", ["m.py:1: NodeRow.token_hash"]),
        ("if node.token_hash != h: pass", ["m.py:1: node.token_hash != h"]),
        ("ok = h == found.token_hash", ["m.py:1: h == found.token_hash"]),
        ("node.token_hash = hash_token(token)\nnode.token_hash = None", []),  # issuing one
        ("select(ApiTokenRow).where(ApiTokenRow.token_hash == h)", []),
        ("WebSessionRow.token_hash == h", []),
    ],
)
def test_the_token_scan_sees_every_lookup(source: str, expected: list[str]) -> None:
    assert [str(w) for w in node_token_lookups_in("m.py", ast.parse(source))] == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("_R = frozenset({NodeState.REMOVING.value, NodeState.REMOVED.value})", ["m.py:1: _R"]),
        ("GONE: frozenset[str] = frozenset([N.REMOVED, N.REMOVING])", ["m.py:1: GONE"]),
        ("gone = (NodeState.REMOVING, NodeState.REMOVED)", ["m.py:1: gone"]),
        ("x = {NodeState.REMOVING, NodeState.REMOVED, NodeState.FAILED}", []),  # another set
        ("if s in (NodeState.REMOVING, NodeState.REMOVED): pass", []),  # inline: "gone?"
    ],
)
def test_the_refused_states_scan_sees_a_copy(source: str, expected: list[str]) -> None:
    assert [str(w) for w in refused_state_sets_in("m.py", ast.parse(source))] == expected


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


# -- node holds -------------------------------------------------------------------------

HOLDS_OWNER = "gpufleet/server/services/node_holds.py"
REASON_GRAMMAR = "gpufleet/core/holds.py"
# The drivers refuse to undo a drain by its prefix; they use the constant, build nothing.
DRIVERS = "gpufleet/schedulers/"
# Per-cluster drivers built by the server: each method hands the call to the cluster's
# driver (they are drivers, called through node_holds like any other).
DRIVER_PROXIES = frozenset({"gpufleet/server/services/kube_schedulers.py"})
REASON_PREFIX = "gpufleet:"
# A scheduler's calls that hold or release a node (``SupportsDrain``, ``SupportsDown``).
HOLD_METHODS = frozenset({"drain", "resume", "down", "undrain"})
# Texts that start like a reason but are messages to a person (a banner, a help line).
NOT_REASONS = ("gpufleet: serving on ", "gpufleet: first start", "gpufleet: a control plane")


def hold_calls_in(module: str, tree: ast.AST) -> list[Write]:
    """Every ``x.drain(…)``, ``x.resume(…)``, ``x.down(…)``, ``x.undrain(…)`` given a
    node: a scheduler holding or releasing one. (asyncio's ``writer.drain()`` and a
    lab's ``down()`` take no argument, and are no scheduler.)"""
    return [
        Write(module, node.lineno, f".{node.func.attr}(…)")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in HOLD_METHODS
        and (node.args or node.keywords)
    ]


def reason_texts_in(module: str, tree: ast.AST) -> list[Write]:
    """Every string that starts with ``gpufleet:`` (a constant or an f-string; not a
    docstring, not a message in ``NOT_REASONS``), and every use of the prefix constant
    ``DRAIN_REASON_PREFIX``: each is a drain reason built by hand."""
    found: list[Write] = []
    skip: set[int] = set()  # docstrings and the parts of an f-string already judged
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and _a_reason(head.value):
                found.append(Write(module, node.lineno, f"f{head.value!r}…"))
        elif isinstance(node, ast.Constant) and id(node) not in skip and _a_reason(node.value):
            found.append(Write(module, node.lineno, repr(node.value)))
        elif (isinstance(node, ast.Name) and node.id == "DRAIN_REASON_PREFIX") or (
            isinstance(node, ast.Attribute) and node.attr == "DRAIN_REASON_PREFIX"
        ):
            found.append(Write(module, node.lineno, "DRAIN_REASON_PREFIX"))
        elif isinstance(node, ast.ImportFrom):
            found.extend(
                Write(module, node.lineno, "import DRAIN_REASON_PREFIX")
                for alias in node.names
                if alias.name == "DRAIN_REASON_PREFIX"
            )
    return found


def _a_reason(value: object) -> bool:
    return (
        isinstance(value, str)
        and value.startswith(REASON_PREFIX)
        and not value.startswith(NOT_REASONS)
    )


def test_only_the_node_hold_service_drains_and_resumes() -> None:
    stray = [
        str(w)
        for module, tree in _modules()
        if module != HOLDS_OWNER and not module.startswith(DRIVERS) and module not in DRIVER_PROXIES
        for w in hold_calls_in(module, tree)
    ]
    assert stray == [], (
        "a node is held or released in its scheduler only by "
        "gpufleet.server.services.node_holds (hold_in_scheduler / release_in_scheduler / "
        "down_in_scheduler):\n" + "\n".join(stray)
    )


def test_only_the_reason_grammar_builds_a_drain_reason() -> None:
    stray = [
        str(w)
        for module, tree in _modules()
        if module != REASON_GRAMMAR
        for w in reason_texts_in(module, tree)
        if not (module.startswith(DRIVERS) and "DRAIN_REASON_PREFIX" in w.target)
    ]
    assert stray == [], (
        "gpufleet's drain reasons (`gpufleet: …`) are built and read only by "
        "gpufleet.core.holds (repair_hold, acceptance_hold, manual_hold, healthcheck_hold, "
        "parse_hold_reason):\n" + "\n".join(stray)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("await scheduler.drain(name, reason=r)", ["m.py:1: .drain(…)"]),
        (
            "await s.resume(name)\nawait s.down(n, reason=r)",
            ["m.py:1: .resume(…)", "m.py:2: .down(…)"],
        ),
        ("await self.drivers.scheduler.undrain(node=n)", ["m.py:1: .undrain(…)"]),
        ("await writer.drain()\nlab.down()\nworld.drain_node(n, reason=r)", []),
    ],
)
def test_the_scan_sees_a_scheduler_hold_call(source: str, expected: list[str]) -> None:
    assert [str(w) for w in hold_calls_in("m.py", ast.parse(source))] == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('r = "gpufleet: acceptance"', ["m.py:1: 'gpufleet: acceptance'"]),
        ('r = f"gpufleet: {rid} {sig}"', ["m.py:1: f'gpufleet: '…"]),
        ('r = "gpufleet:" + " x"', ["m.py:1: 'gpufleet:'"]),
        ('r = f"{DRAIN_REASON_PREFIX} x"', ["m.py:1: DRAIN_REASON_PREFIX"]),
        (
            "from gpufleet.schedulers.base import DRAIN_REASON_PREFIX",
            ["m.py:1: import DRAIN_REASON_PREFIX"],
        ),
        ('r = base.DRAIN_REASON_PREFIX + " x"', ["m.py:1: DRAIN_REASON_PREFIX"]),
        ('def f():\n    """Drains with ``gpufleet: <id>``."""', []),  # a docstring
        ('print(f"gpufleet: serving on {url}")\nr = "operator: gpufleet: x"', []),
    ],
)
def test_the_scan_sees_a_reason_built_by_hand(source: str, expected: list[str]) -> None:
    assert [str(w) for w in reason_texts_in("m.py", ast.parse(source))] == expected


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
