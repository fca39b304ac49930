"""One owner per lifecycle: no module but ``server/services/transitions.py`` writes a
lifecycle's state column (``status``, node ``state``, acceptance ``stage``). Everything
else moves a row through its service's ``switch_*`` function, which calls ``transition``
(checked against the table, one event, one audit row). Creating a row with its first
state (``ClusterRow(status=...)``) is not a change and is allowed.

The scan is of the source, by AST: an attribute assignment (plain, augmented, annotated,
inside a tuple), a ``setattr`` with the column's name, or an ``UPDATE ... .values()``
naming the column. The packages the import-linter keeps away from the server (agent,
client, core, sim and the drivers) cannot hold a row and are not scanned: their own
``status`` fields (an agent's state, a parsed check's GPU status) are not lifecycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpufleet

PACKAGE = Path(gpufleet.__file__).parent
OWNER = "server/services/transitions.py"
COLUMNS = frozenset({"status", "state", "stage"})
# Forbidden from importing gpufleet.server by .importlinter (contract "agent-light").
ROWLESS = ("agent", "client", "core", "sim", "providers", "schedulers", "checks")


def state_writes(source: str) -> list[str]:
    """``"line N: what"`` for each write of a state column in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets.extend(target.elts)
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif isinstance(target, ast.Attribute) and target.attr in COLUMNS:
                found.append(f"line {target.lineno}: .{target.attr} = ...")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in COLUMNS
        ):
            found.append(f"line {node.lineno}: setattr(..., {node.args[1].value!r}, ...)")
        if isinstance(func, ast.Attribute) and func.attr == "values":
            named = {k.arg for k in node.keywords}
            for arg in node.args:
                if isinstance(arg, ast.Dict):
                    named |= {k.value for k in arg.keys if isinstance(k, ast.Constant)}
            for column in sorted(COLUMNS & {n for n in named if isinstance(n, str)}):
                found.append(f"line {node.lineno}: .values({column}=...)")
    return found


def _scanned() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in ROWLESS
        and "migrations" not in path.relative_to(PACKAGE).parts
    )


def test_only_the_transition_function_writes_a_state_column() -> None:
    paths = _scanned()
    assert PACKAGE / OWNER in paths and len(paths) > 100  # the scan sees the server
    offenders = [
        f"{path.relative_to(PACKAGE)} {where}"
        for path in paths
        if path.relative_to(PACKAGE).as_posix() != OWNER
        for where in state_writes(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], (
        "change a lifecycle's state through its service's switch_* function "
        "(services/transitions.py: transition), not by assigning it:\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "source",
    [
        'run.status = "running"',  # acceptance_steps.py before issue 12
        'locked.stage = "done"',
        "node.state = target.value",
        'row.status: str = "x"',
        'row.status += "x"',
        'a.detail, (b.stage, c) = "x", ("y", 1)',
        'setattr(run, "status", "x")',
        'update(NodeRow).where(NodeRow.id == i).values(state="cordoned")',
        'update(RepairRow).values({"status": "failed"})',
    ],
)
def test_the_scan_sees_every_way_of_writing_a_state(source: str) -> None:
    assert len(state_writes(source)) == 1, source


@pytest.mark.parametrize(
    "source",
    [
        'ClusterRow(id=i, status="provisioning")',  # a new row's first state
        "if run.status == 'done': pass",
        "request.state.user = user",
        'update(CheckRunRow).where(CheckRunRow.status == "x").values(lock_owner=None)',
        "setattr(row, name, value)",
    ],
)
def test_the_scan_leaves_reads_and_creation_alone(source: str) -> None:
    assert state_writes(source) == [], source
