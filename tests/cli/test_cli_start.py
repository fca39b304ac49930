"""The CLI starts at once: commands load when they run, ``gpufleet --help`` lists them
from ``COMMANDS`` without importing any (bench/cli_start.py prints the times), and the
one-line help there is what each command says of itself."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.main import COMMANDS, app, load_command

HEAVY = ("httpx", "pydantic", "gpufleet.client", "gpufleet.cli.config", "rich.markdown")


def _short_help(command: Any) -> str:
    """What click lists for the command in its parent's help."""
    return str(command.get_short_help_str(limit=300))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_listed_help_is_the_command_s_own(name: str) -> None:
    command = load_command(name)
    assert command.name == name
    assert COMMANDS[name].help == _short_help(command), (
        f"{name}: COMMANDS says {COMMANDS[name].help!r}; the command says "
        f"{_short_help(command)!r}: update gpufleet/cli/main.py"
    )


def test_help_lists_every_command_and_loads_none() -> None:
    probe = (
        "import sys\n"
        "sys.argv = ['gpufleet', '--help']\n"
        "from gpufleet.cli.main import run\n"
        "try:\n"
        "    run()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout[-500:]
    for name in COMMANDS:
        assert f"  {name} " in done.stdout, name


def test_a_command_loads_when_it_runs_and_unknown_ones_are_refused() -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["nodes", "--help"])
    assert shown.exit_code == 0 and "list" in shown.output
    slurm = runner.invoke(app, ["slurm", "--help"])
    assert slurm.exit_code == 0
    assert all(word in slurm.output for word in ("resume", "suspend", "epilog", "healthcheck"))
    wrong = runner.invoke(app, ["nodez"])
    assert wrong.exit_code == 2 and "No such command" in wrong.output


def test_typer_builds_the_root_group_with_the_lazy_commands() -> None:
    group = typer.main.get_command(app)
    assert list(COMMANDS) == [n for n in group.list_commands(None) if n in COMMANDS]  # type: ignore[attr-defined,arg-type]


# What ``gpufleet nodes list`` has no use for: the domain models of other calls load
# inside the client calls that return them (issue 19: ``nodes list`` in ≤ 400 ms).
UNUSED_BY_NODES_LIST = (
    "gpufleet.core.access",
    "gpufleet.core.autoscaling",
    "gpufleet.core.check_runs",
    "gpufleet.core.faults",
    "gpufleet.core.inventory",
    "gpufleet.core.providers",
    "gpufleet.core.reliability",
    "gpufleet.core.repair.models",
    "gpufleet.core.rollouts",
    "gpufleet.core.windows",
)


def test_nodes_list_loads_only_the_models_it_shows() -> None:
    probe = (
        "import sys\n"
        "sys.argv = ['gpufleet', 'nodes', 'list']\n"
        "from gpufleet.cli.main import run\n"
        "try:\n"
        "    run()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', [m for m in {UNUSED_BY_NODES_LIST!r} if m in sys.modules])\n"
        "print('CLIENT', 'gpufleet.client.api' in sys.modules)\n"
    )
    # Port 9 (discard) on loopback: nothing listens, the command fails after loading.
    env = {"PATH": "/usr/bin:/bin", "GPUFLEET_URL": "http://127.0.0.1:9", "GPUFLEET_TOKEN": "x"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert "CLIENT True" in done.stdout, done.stdout[-500:] + done.stderr[-2000:]
    assert "LOADED []" in done.stdout, done.stdout[-500:]
