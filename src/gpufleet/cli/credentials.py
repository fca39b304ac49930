"""``gpufleet credentials``: BMC passwords, SSH keys and cloud keys the server keeps
encrypted. The secret is read from a file or stdin, never from the command line (argv is
visible to every user of the machine), and is never shown again."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fmt_time,
    note,
    plain,
    print_json,
    print_table,
    table,
)
from gpufleet.core.inventory import CredentialKind, StoredCredential

app = typer.Typer(help="Credentials for BMCs, SSH and clouds (write-only).", no_args_is_help=True)

ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="Project id or name.")]
NameArg = Annotated[str, typer.Argument(help="Credential name, unique in the project.")]


def _render(items: list[StoredCredential]) -> None:
    t = table("NAME", "KIND", "USERNAME", "KEY ID", "HOSTS", "CREATED", "ROTATED", right=("HOSTS",))
    for c in items:
        t.add_row(
            plain(c.name),
            plain(c.kind.value),
            plain(c.username or "-"),
            plain(c.key_id),
            plain(c.hosts),
            fmt_time(c.created_at),
            fmt_time(c.rotated_at) if c.rotated_at else plain("-"),
        )
    print_table(t, empty="no credentials")


def _render_one(item: StoredCredential) -> None:
    _render([item])


def _read_secret(secret_file: Path | None) -> str:
    if secret_file is None or str(secret_file) == "-":
        if sys.stdin.isatty():
            raise CliError("give the secret with --secret-file FILE, or pipe it on stdin")
        secret = sys.stdin.read()
    else:
        try:
            secret = secret_file.read_text()
        except OSError as exc:
            raise CliError(f"{secret_file}: cannot read it ({exc.strerror})") from None
    # A password file usually ends with a newline that is not part of the password; a PEM
    # key keeps its own.
    secret = secret if "PRIVATE KEY" in secret else secret.rstrip("\r\n")
    if not secret.strip():
        raise CliError("the secret is empty")
    return secret


@app.command("set")
def set_credential(
    ctx: typer.Context,
    name: NameArg,
    project: ProjectOpt,
    kind: Annotated[CredentialKind, typer.Option(help="What the secret is.")],
    username: Annotated[str | None, typer.Option(help="User it logs in as.")] = None,
    secret_file: Annotated[
        Path | None,
        typer.Option(help="File holding the secret; '-' or absent: read stdin."),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Store a credential, or replace the one of that name (project admins)."""
    secret = _read_secret(secret_file)
    with config.client_for(ctx) as client:
        stored = client.put_credential(project, name, kind=kind, username=username, secret=secret)
    emit(output, stored, _render_one)


@app.command("list")
def list_credentials(
    ctx: typer.Context, project: ProjectOpt, output: OutputOpt = OutputFormat.TABLE
) -> None:
    with config.client_for(ctx) as client:
        items = client.list_credentials(project)
    if output is OutputFormat.JSON:
        print_json(items)
    else:
        _render(items)


@app.command("delete")
def delete_credential(
    ctx: typer.Context, name: NameArg, project: ProjectOpt, output: OutputOpt = OutputFormat.TABLE
) -> None:
    """Delete a credential no host uses."""
    with config.client_for(ctx) as client:
        deleted = client.delete_credential(project, name)
    if output is OutputFormat.JSON:
        print_json(deleted)
    else:
        note(f"deleted credential {deleted.name}")
