"""``gpufleet tokens``: create, list and revoke personal API tokens."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    fields,
    fmt_age,
    fmt_time,
    note,
    plain,
    print_json,
    print_table,
    stdout,
    table,
)
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import Role
from gpufleet.core.models import ApiToken

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
    user: Annotated[
        str | None,
        typer.Option(help="The owner only: make it for this member of --project (id or name)."),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create an API token. The secret is printed once and cannot be shown again."""
    label = name or f"cli {utcnow():%Y-%m-%d %H:%M}"
    with config.client_for(ctx) as client:
        created = client.create_token(
            name=label, project=project, role=role, expires_in_days=expires_in_days, user=user
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


def _render_tokens(tokens: list[ApiToken]) -> None:
    t = table("ID", "NAME", "USER", "PREFIX", "PROJECT", "ROLE", "EXPIRES", "LAST USED", "STATE")
    now = utcnow()
    for tok in tokens:
        state = (
            Text("revoked", style="dim")
            if tok.revoked_at
            else Text("expired", style="dim")
            if tok.expires_at and tok.expires_at <= now
            else Text("active", style="green")
        )
        t.add_row(
            plain(tok.id),
            plain(tok.name),
            plain(tok.user_name or tok.user_id),
            plain(tok.prefix + "…"),
            plain(tok.project_id or "all"),
            plain(tok.role.value if tok.role else "-"),
            fmt_time(tok.expires_at) if tok.expires_at else "never",
            fmt_age(tok.last_used_at),
            state,
        )
    print_table(t, empty="no tokens")


@app.command("list")
def list_tokens(
    ctx: typer.Context,
    project: Annotated[
        str | None,
        typer.Option(help="Every user's tokens of this project (its admins); default: yours."),
    ] = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked tokens.")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List tokens (never their secrets: only the first characters)."""
    with config.client_for(ctx) as client:
        tokens = client.list_tokens(project=project, revoked=revoked)
    if output is OutputFormat.JSON:
        print_json(tokens)
    else:
        _render_tokens(tokens)


@app.command("revoke")
def revoke_token(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(help="The token's id (from `tokens list`).")],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Revoke a token: yours, one of a project you administer, or (the owner) any. Every
    request with it fails from now on."""
    with config.client_for(ctx) as client:
        token = client.revoke_token(token_id)
    if output is OutputFormat.JSON:
        print_json(token)
        return
    note(f"revoked token {token.name} ({token.prefix}…) at {fmt_time(token.revoked_at)}")
