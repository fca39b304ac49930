"""The CLI's light value coercion (cli/coercion.py) answers as typer's own would.

For every parameter of every command, each sample value the light path answers must be
what typer's pydantic-backed coercion returns, of the same type; every value it does
not answer goes to typer's. And the commands that need no pydantic start without it.
"""

from __future__ import annotations

import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
from typer._click.exceptions import ClickException
from typer._coercion import build_runtime_param

from gpufleet.cli import coercion
from gpufleet.cli.coercion import MISS, LightParam, fast_value
from gpufleet.cli.main import COMMANDS, app, load_command

SAMPLES: list[Any] = [
    *("0", "1", "7", "12", "-1", "+5", " 5", "5 ", "1_000", "1.5", "007", "", "abc"),
    "9" * 19,
    "9" * 5000,
    *("json", "JSON", "table", "Table", "yes", "true"),
    *(0, 1, 5, -3, 10**6, True, False, 0.5, 2.0, -1.0),
    ["a", "b"],
    ("x",),
    [],
]


def _commands() -> list[tuple[str, Any]]:
    root = typer.main.get_command(app)
    return [("gpufleet", coercion.lighten(root))] + [
        (name, load_command(name)) for name in COMMANDS
    ]


def _samples(param: Any) -> list[Any]:
    out = list(SAMPLES)
    if param.default is not None and not callable(param.default):
        out.append(param.default)
    choice = coercion.choice_coercion_annotation(
        param.type_descriptor.annotation, param.type_descriptor.parameter_info
    )
    item = getattr(param.type_descriptor.annotation, "__args__", (None,))[0]
    if choice is None and isinstance(item, type) and issubclass(item, Enum):
        choice = (tuple(item), True)
    if choice is not None:
        for c in choice[0]:
            out += [c, str(c.value), c.name, str(c.value).upper(), [str(c.value)], [c]]
    return out


def _typer(real: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        return "ok", real._coerce_value(value, param=param, ctx=ctx)
    except ClickException as exc:  # a usage error: the light path must not have answered
        return "error", exc


@pytest.mark.parametrize(("name", "command"), _commands(), ids=lambda v: str(v)[:20])
def test_every_light_answer_is_typers(name: str, command: Any) -> None:
    ctx = command.context_class(command)
    lightened = 0
    for param in coercion._params(command):
        light = param._runtime_param
        if param.type_descriptor.file_annotation is not None:
            continue
        assert isinstance(light, LightParam), (name, param.name)
        lightened += 1
        real = build_runtime_param(param.type_descriptor)
        for value in _samples(param):
            fast = fast_value(light.annotation, light.parameter_info, value, ctx)
            if fast is MISS:
                continue
            kind, want = _typer(real, value, param, ctx)
            assert kind == "ok", (name, param.name, value, want)
            assert fast == want and type(fast) is type(want), (name, param.name, value)
            if isinstance(want, list):
                assert [type(v) for v in fast] == [type(v) for v in want]
            # And through the parameter itself: the same value.
            assert light._coerce_value(value, param, ctx) == want
    assert lightened, name


def test_the_light_path_answers_the_common_values() -> None:
    """Not a vacuous pass: defaults, strings, bounded ints and enum words are answered."""
    scan = load_command("scan")
    by_name = {p.name: p for p in coercion._params(scan)}
    ctx = scan.context_class(scan)

    def fast(param: str, value: Any) -> Any:
        p = by_name[param]
        return fast_value(
            p.type_descriptor.annotation, p.type_descriptor.parameter_info, value, ctx
        )

    assert fast("path", "/var/log/kern.log") == "/var/log/kern.log"
    assert fast("jobs", 0) == 0
    assert fast("jobs", "4") == 4
    assert fast("jobs", -1) is MISS  # below min: typer words the error
    assert fast("jobs", "x") is MISS
    assert fast("output", "json").value == "json"
    assert fast("output", "xml") is MISS


def test_a_value_the_light_path_leaves_gets_typers_error() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["scan", "-", "--jobs", "-1"])
    assert result.exit_code == 2
    assert "Invalid value for '--jobs' / '-j'" in result.output
    assert "greater than or equal to 0" in result.output
    result = CliRunner().invoke(app, ["scan", "-", "-o", "xml"])
    assert result.exit_code == 2
    assert "'xml' is not one of 'table', 'json'" in result.output


def test_scan_starts_without_pydantic(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    probe = (
        "import sys\n"
        f"sys.argv = ['gpufleet', 'scan', {str(log)!r}, '-o', 'json']\n"
        "from gpufleet.cli.main import run\n"
        "try:\n    run()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(sorted(m for m in ('pydantic', 'typer._adapters', 'httpx') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert '"xid": 79' in out
    assert out.rstrip().endswith("[]"), out[-300:]
