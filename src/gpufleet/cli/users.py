"""``gpufleet users``: the platform owner's list of users and their Unix names."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fmt_time,
    plain,
    print_json,
    print_table,
    table,
)
from gpufleet.core.models import User

app = typer.Typer(help="Users (the platform owner).", no_args_is_help=True)


def _render(users: list[User]) -> None:
    t = table("NAME", "ID", "UNIX NAME", "EMAIL", "OWNER", "CREATED")
    for u in users:
        t.add_row(
            plain(u.name),
            plain(u.id),
            plain(u.unix_name or "-"),
            plain(u.email or "-"),
            "yes" if u.is_owner else "",
            fmt_time(u.created_at),
        )
    print_table(t, empty="no users")


def _render_one(user: User) -> None:
    _render([user])


@app.command("list")
def list_users(ctx: typer.Context, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Every user: those who logged in through the IdP and those made by hand."""
    with config.client_for(ctx) as client:
        users = client.list_users()
    if output is OutputFormat.JSON:
        print_json(users)
    else:
        _render(users)


@app.command("create")
def create_user(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="User name, unique on this server.")],
    email: Annotated[str | None, typer.Option(help="E-mail address.")] = None,
    unix_name: Annotated[
        str | None, typer.Option(help="Account on cluster nodes (sudoers, Slurm admins).")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create a user without the IdP (a server without OIDC, a service account); give
    them a token with `gpufleet tokens create --user NAME --project P`."""
    with config.client_for(ctx) as client:
        user = client.create_user(name, email=email, unix_name=unix_name)
    emit(output, user, _render_one)


@app.command("set-unix-name")
def set_unix_name(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(help="User id or name.")],
    unix_name: Annotated[
        str | None, typer.Argument(help="The name; leave out with --clear.")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the Unix name.")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Set the account a user has on cluster nodes (lower case, at most 32 characters)."""
    if (unix_name is None) != clear:
        raise typer.BadParameter("give a Unix name, or --clear", param_hint="UNIX_NAME")
    with config.client_for(ctx) as client:
        updated = client.set_unix_name(user, None if clear else unix_name)
    emit(output, updated, _render_one)
