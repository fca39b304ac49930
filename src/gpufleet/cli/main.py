"""The ``gpufleet`` command: server, demo and the API commands."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text
from typer.core import TyperGroup

from gpufleet.cli import (
    acceptance,
    agent,
    audit,
    auth,
    checks,
    clusters,
    credentials,
    events,
    findings,
    hosts,
    inject,
    nodes,
    projects,
    providers,
    repairs,
    scan,
    server,
    slurm_node,
    slurm_power,
    tokens,
    usage,
    users,
    volumes,
)
from gpufleet.cli.config import ENV_TOKEN, ENV_URL, GlobalOptions
from gpufleet.cli.errors import CliError, describe
from gpufleet.cli.output import stderr
from gpufleet.client.errors import ApiError, ServerUnreachable


class _Group(TyperGroup):
    """Root group: every command runs inside it, so failures are mapped in one place."""

    # ``ctx`` is typer's vendored click Context, which typer does not export by name.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (ApiError, ServerUnreachable, CliError) as exc:
            message, code = describe(exc)
            stderr().print(Text(f"error: {message}", style="red"))
            raise typer.Exit(code) from exc


app = typer.Typer(
    cls=_Group,
    name="gpufleet",
    help="gpufleet: a control plane for GPU clusters.",
    no_args_is_help=True,
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


app.command("login")(auth.login)
app.add_typer(projects.app, name="projects")
app.add_typer(tokens.app, name="tokens")
app.add_typer(users.app, name="users")
app.add_typer(volumes.app, name="volumes")
app.add_typer(audit.app, name="audit")
app.add_typer(clusters.app, name="clusters")
app.add_typer(hosts.app, name="hosts")
app.add_typer(credentials.app, name="credentials")
app.add_typer(providers.app, name="providers")
app.add_typer(nodes.app, name="nodes")
app.add_typer(repairs.app, name="repairs")
app.add_typer(usage.app, name="usage")
app.add_typer(
    slurm_node.app,
    name="slurm",
    help="Slurm's programs: node hooks (slurmd, on each node) and power saving (slurmctld).",
)
slurm_node.app.command("resume")(slurm_power.resume)
slurm_node.app.command("suspend")(slurm_power.suspend)
app.add_typer(checks.app, name="checks")
app.add_typer(acceptance.app, name="acceptance")
app.command("events")(events.list_events)
app.command("findings")(findings.list_findings)
app.command("inject")(inject.inject)
app.command("scan")(scan.scan)
# Running the server needs the [server] extra; see cli/server.py.
app.command("server")(server.server)
app.command("demo")(server.demo)
app.command("rotate-secret-key")(server.rotate_secret_key)
app.command("agent")(agent.agent)


def run() -> None:
    app()
