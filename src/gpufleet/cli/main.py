"""The ``gpufleet`` command: server, demo and the API commands.

Commands load lazily: ``gpufleet --help`` imports typer and nothing of the client (its
HTTP stack and models take most of a second), and ``gpufleet nodes list`` imports only
what ``nodes`` needs. ``COMMANDS`` names each command's module, object and one-line help
(the help is what the module's own says; tests/cli/test_cli_start.py keeps the two the
same), in the order ``--help`` lists them.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from gpufleet.cli.coercion import lighten
from gpufleet.cli.env import ENV_TOKEN, ENV_URL, GlobalOptions


@dataclass(frozen=True, slots=True)
class Entry:
    module: str  # under gpufleet.cli
    attr: str  # a typer.Typer (a group of commands) or a function (one command)
    help: str


COMMANDS: dict[str, Entry] = {
    "login": Entry(
        "auth", "login",
        "Verify the token by asking the server who it belongs to, then save it (mode 0600).",
    ),
    "events": Entry(
        "events", "list_events",
        "Show events (newest first): status and health changes, findings, provider errors.",
    ),
    "findings": Entry(
        "findings", "list_findings",
        "List findings (newest first): signature, severity, GPU, evidence.",
    ),
    "inject": Entry(
        "inject", "inject",
        "Inject a fault into a sim node (or, with --log, into a real node's followed log).",
    ),
    "scan": Entry(
        "scan", "scan",
        "Find failure signatures (Xid, SXid, fallen off the bus, ...) in a saved kernel log.",
    ),
    # Running the server needs the [server] extra; see cli/server.py.
    "server": Entry("server", "server", "Run the gpufleet server."),
    "demo": Entry("server", "demo", "Run a server with a simulated fleet, ready to click through."),
    "rotate-secret-key": Entry(
        "server", "rotate_secret_key",
        "Re-encrypt every stored credential under the current secret key, in one transaction.",
    ),
    "agent": Entry(
        "agent", "agent", "Run the gpufleet node agent (collectors, detectors, spool, /metrics)."
    ),
    "projects": Entry("projects", "app", "Projects: who owns which clusters."),
    "tokens": Entry("tokens", "app", "Personal API tokens."),
    "users": Entry("users", "app", "Users (the platform owner)."),
    "volumes": Entry("volumes", "app", "Storage volumes of a project."),
    "audit": Entry("audit", "app", "The audit log: who did what, when, from where."),
    "clusters": Entry("clusters", "app", "GPU clusters."),
    "hosts": Entry("hosts", "app", "The host inventory: machines, BMCs, racks, spares."),
    "credentials": Entry(
        "credentials", "app", "Credentials for BMCs, SSH and clouds (write-only)."
    ),
    "providers": Entry("providers", "app", "The drivers that reach a cluster's machines."),
    "nodes": Entry("nodes", "app", "Nodes and their GPUs."),
    "repairs": Entry("repairs", "app", "The repair queue: recommendations, approvals, progress."),
    "usage": Entry("usage", "app", "GPU-hours by project, user, account and day."),
    "stacks": Entry(
        "stacks", "app", "Software stacks: what nodes run (driver, CUDA, Slurm...); the latest."
    ),
    "rollouts": Entry(
        "rollouts", "app",
        "Stack rollouts: clusters migrating to another stack in maintenance windows.",
    ),
    "reliability": Entry(
        "reliability", "app", "Where GPU-hours went: outages by cause, MTTR and MTBF."
    ),
    "slurm": Entry(
        "slurm_commands", "app",
        "Slurm's programs: node hooks (slurmd, on each node) and power saving (slurmctld).",
    ),
    "checks": Entry(
        "checks", "app", "Active checks: DCGM diag, nccl-tests, ib_write_bw, gpu-burn."
    ),
    "acceptance": Entry(
        "acceptance", "app",
        "Acceptance tests: the suite a cluster passes before it is ready, and its reports.",
    ),
    "dashboards": Entry(
        "dashboards", "app",
        "Grafana dashboards as code: fleet, GPUs, InfiniBand/NICs, storage, scheduling.",
    ),
    "grafana": Entry("grafana", "app", "Provision Grafana: one organisation per project."),
}  # fmt: skip


def load_command(name: str) -> Any:
    """The real command ``name``: its module imported, made a click command by typer."""
    entry = COMMANDS[name]
    target = getattr(importlib.import_module(f"gpufleet.cli.{entry.module}"), entry.attr)
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name = name
        return lighten(group)
    single = typer.Typer()
    single.command(name)(target)
    command = typer.main.get_command(single)
    command.name = name
    return lighten(command)


class _Placeholder(TyperCommand):
    """What ``--help`` lists for a command not loaded: its name and one line."""

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help=help_text, short_help=help_text)


class _Group(TyperGroup):
    """Root group: loads a command only when it runs, and maps every command's failures
    to a message and an exit code in one place."""

    # ``ctx`` is typer's vendored click Context, which typer does not export by name.
    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in COMMANDS:
            return found
        return _Placeholder(cmd_name, COMMANDS[cmd_name].help)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        lighten(self)  # the global options
        rest: list[str] = super().parse_args(ctx, args)
        return rest

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(command, _Placeholder) and name is not None:
            command = load_command(name)
            self.commands[name] = command
        return name, command, rest

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise  # a command's own exit: nothing to describe, nothing to import
        except Exception as exc:
            # Imported only on an error: cli.errors imports httpx (a twentieth of a
            # second), which a command that needs no server (``scan``) never loads.
            from rich.text import Text

            from gpufleet.cli.errors import CliError, describe
            from gpufleet.cli.output import stderr
            from gpufleet.client.errors import ApiError, ServerUnreachable

            if not isinstance(exc, ApiError | ServerUnreachable | CliError):
                raise
            message, code = describe(exc)
            stderr().print(Text(f"error: {message}", style="red"))
            raise typer.Exit(code) from exc


app = typer.Typer(
    cls=_Group,
    name="gpufleet",
    help="gpufleet: a control plane for GPU clusters.",
    no_args_is_help=True,
    # Plain help at the top: rich's help formatting (with markdown) costs more imports
    # than everything else ``gpufleet --help`` needs. Each command's own help is rich.
    rich_markup_mode=None,
    # Never print local variables on a crash: they include API tokens.
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _global(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar=ENV_URL, help="Server URL; overrides the saved login."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar=ENV_TOKEN, help="API token; overrides the saved login."),
    ] = None,
) -> None:
    ctx.obj = GlobalOptions(url=url, token=token)


def run() -> None:
    # httpx loads its own command line (click, rich, pygments: 20-50 ms) unless that
    # import fails, which it then shrugs off; gpufleet never runs it. Only here, in the
    # program's entry point, so an importer of this module keeps httpx whole.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "cannot import"
    app()
