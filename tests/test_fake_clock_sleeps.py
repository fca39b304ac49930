"""No test sleeps real time next to a fake clock.

A test on a ``FakeClock`` moves time itself; sleeping real time there "to let things
happen" is a race that a busy machine loses, and slow on an idle one. Drive the loops and
the sim agents instead (``gpufleet.testing.fleet``: ``tick()`` awaits what it starts),
or await the specific thing that must happen.

The scan (AST, every module under tests/): a module uses a fake clock if it names
``FakeClock``, imports a module that does (``gpufleet.testing.fleet`` or a test helper),
or asks for a fixture a fake-clock conftest above it defines. Such a module must not call
``asyncio.sleep``/``time.sleep`` with a non-zero number. Where real time is the thing
under test (a free-running agent, a real process), the call carries a
``# real sleep: <why>`` comment on its line, and the scan lists it as allowed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).parent
MARKER = "# real sleep:"
SLEEPERS = {"asyncio", "time"}
FAKE_CLOCK_IMPORTS = {"gpufleet.testing.fleet"}  # the fleet harness runs on a FakeClock


@dataclass
class Module:
    path: Path
    tree: ast.Module
    lines: list[str]
    imports: set[str] = field(default_factory=set)  # dotted names, and bare local names
    names_fake_clock: bool = False
    fixtures: set[str] = field(default_factory=set)  # defined here (@pytest.fixture)
    requested: set[str] = field(default_factory=set)  # arguments of tests and fixtures


def _is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def _parse(path: Path) -> Module:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    module = Module(path=path, tree=tree, lines=text.splitlines())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            module.imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            module.imports.add(node.module)
            module.names_fake_clock |= any(a.name == "FakeClock" for a in node.names)
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            module.names_fake_clock |= name == "FakeClock"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if _is_fixture(node):
                module.fixtures.add(node.name)
            if _is_fixture(node) or node.name.startswith("test_"):
                module.requested.update(a.arg for a in node.args.args)
    return module


def _fake_clock_modules(modules: dict[Path, Module], *, root: Path) -> set[Path]:
    """Modules that use a fake clock, by name, by import, or by fixture."""
    by_name = {p.stem: p for p in modules if p.name != "conftest.py"}
    fake = {p for p, m in modules.items() if m.names_fake_clock}
    changed = True
    while changed:  # imports of imports
        changed = False
        for path, module in modules.items():
            if path in fake:
                continue
            local = {by_name[i] for i in module.imports if i in by_name}
            if module.imports & FAKE_CLOCK_IMPORTS or local & fake:
                fake.add(path)
                changed = True
    for path, module in modules.items():  # fixtures of fake-clock conftests above
        for conftest in (d / "conftest.py" for d in [path.parent, *path.parents]):
            if conftest in fake and module.requested & modules[conftest].fixtures:
                fake.add(path)
            if conftest.parent == root:
                break
    return fake


@dataclass(frozen=True)
class Sleep:
    path: Path
    line: int
    text: str

    @property
    def allowed(self) -> bool:
        _, marker, why = self.text.partition(MARKER)
        return bool(marker) and len(why.strip()) >= 10

    def __str__(self) -> str:
        return f"{self.path.relative_to(TESTS.parent)}:{self.line}: {self.text.strip()}"


def _real_sleeps(module: Module) -> list[Sleep]:
    """Calls of asyncio.sleep/time.sleep (or a bare ``sleep`` imported from them) with a
    non-zero number."""
    bare = {
        alias.asname or alias.name
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ImportFrom) and node.module in SLEEPERS
        for alias in node.names
        if alias.name == "sleep"
    }
    found = []
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        named = (
            isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id in SLEEPERS
        ) or (isinstance(func, ast.Name) and func.id in bare)
        arg = node.args[0]
        literal = isinstance(arg, ast.Constant) and isinstance(arg.value, int | float)
        if named and literal and arg.value != 0:  # type: ignore[union-attr]
            found.append(Sleep(module.path, node.lineno, module.lines[node.lineno - 1]))
    return found


def _scan() -> tuple[list[Sleep], list[Sleep]]:
    modules = {p: _parse(p) for p in sorted(TESTS.rglob("*.py"))}
    fake = _fake_clock_modules(modules, root=TESTS)
    sleeps = [s for p in sorted(fake) for s in _real_sleeps(modules[p])]
    return [s for s in sleeps if not s.allowed], [s for s in sleeps if s.allowed]


def test_no_real_sleep_next_to_a_fake_clock() -> None:
    bad, allowed = _scan()
    assert not bad, (
        "real sleeps in modules on a fake clock (tick the fleet, or await the specific "
        f"thing; if real time is what is tested, say why with '{MARKER} ...'):\n"
        + "\n".join(map(str, bad))
    )
    print(f"\nallowed real sleeps next to a fake clock: {len(allowed)}")
    for sleep in allowed:
        print(f"  {sleep}")


def test_the_harness_is_on_a_fake_clock() -> None:
    import gpufleet.testing.fleet as harness

    assert _parse(Path(harness.__file__)).names_fake_clock


def test_the_scan_sees_what_it_must(tmp_path: Path) -> None:
    """The scan finds a sleep next to a fake clock by name, by import and by fixture,
    ignores zero and non-literal sleeps, and honours the marker only with a reason."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom gpufleet.core.clock import FakeClock\n\n"
        "@pytest.fixture\ndef clock():\n    return FakeClock()\n"
    )
    (tmp_path / "helper.py").write_text("from gpufleet.core.clock import FakeClock\n")
    samples = {
        "test_named.py": "import asyncio\nFakeClock = 1\nasync def f():\n"
        "    await asyncio.sleep(0.05)\n    await asyncio.sleep(0)\n    await asyncio.sleep(d)\n",
        "test_imported.py": "import time\nimport helper\ndef test_x():\n    time.sleep(1)\n",
        "test_fixture.py": "from asyncio import sleep\nasync def test_y(clock):\n"
        "    await sleep(0.1)\n",
        "test_marked.py": "import asyncio\nFakeClock = 1\nasync def f():\n"
        f"    await asyncio.sleep(0.1)  {MARKER} a real process under test\n"
        f"    await asyncio.sleep(0.1)  {MARKER}\n",
        "test_real_clock.py": "import asyncio\nasync def test_z(app):\n"
        "    await asyncio.sleep(1)\n",
    }
    for name, text in samples.items():
        (tmp_path / name).write_text(text)
    modules = {p: _parse(p) for p in sorted(tmp_path.glob("*.py"))}
    fake = _fake_clock_modules(modules, root=tmp_path)
    names = {p.name for p in fake}
    assert names == {"conftest.py", "helper.py", "test_named.py", "test_imported.py",
                     "test_fixture.py", "test_marked.py"}  # fmt: skip
    found = {p.name: _real_sleeps(modules[p]) for p in fake}
    assert [s.line for s in found["test_named.py"]] == [4]
    assert [s.line for s in found["test_imported.py"]] == [4]
    assert [s.line for s in found["test_fixture.py"]] == [3]
    assert [s.allowed for s in found["test_marked.py"]] == [True, False]
