"""``gpufleet tokens``: create personal API tokens."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    fields,
    fmt_time,
    print_json,
    print_table,
    stdout,
)
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import Role

app = typer.Typer(help="Personal API tokens.", no_args_is_help=True)


@app.command("create")
def create_token(
    ctx: typer.Context,
    project: Annotated[
        str | None,
        typer.Option(help="Project id or name the token is limited to (default: all yours)."),
    ] = None,
    role: Annotated[
        Role | None,
        typer.Option(case_sensitive=False, help="Most the token may do in that project."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="A label to recognise it by.")] = None,
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, help="Days until it stops working (default: never).")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create an API token. The secret is printed once and cannot be shown again."""
    label = name or f"cli {utcnow():%Y-%m-%d %H:%M}"
    with config.client_for(ctx) as client:
        created = client.create_token(
            name=label, project=project, role=role, expires_in_days=expires_in_days
        )
    if output is OutputFormat.JSON:
        print_json(created)
        return
    info = created.info
    rows: list[tuple[str, Text | str]] = [
        ("name", info.name),
        ("id", info.id),
        ("project", info.project_id or "all your projects"),
        ("role", info.role.value if info.role else "your role in each project"),
        ("expires", fmt_time(info.expires_at) if info.expires_at else "never"),
    ]
    print_table(fields(rows))
    console = stdout()
    console.print(Text("\nToken (shown once; store it now):", style="bold yellow"))
    # soft_wrap: a long secret must stay on one line so it can be copied whole.
    console.print(Text(created.token), soft_wrap=True)
