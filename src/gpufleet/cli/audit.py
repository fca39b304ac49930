"""``gpufleet audit list``: the audit log, newest first (project admins and the owner)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.events import parse_since
from gpufleet.cli.output import OutputFormat, OutputOpt, emit, fmt_time, plain, print_table, table
from gpufleet.cli.paging import collect
from gpufleet.core.access import AuditEntry
from gpufleet.core.models import Page

app = typer.Typer(help="The audit log: who did what, when, from where.", no_args_is_help=True)

RESULT_STYLES = {"ok": "green", "denied": "bold red", "invalid": "yellow", "conflict": "yellow"}


def _render(page: Page[AuditEntry]) -> None:
    t = table("TIME", "ACTOR", "ACTION", "OBJECT", "RESULT", "FROM", "DETAIL")
    for e in page.items:
        obj = f"{e.object_type} {e.object_id}" if e.object_id else e.object_type
        t.add_row(
            fmt_time(e.ts),
            plain(e.actor),
            plain(e.action),
            plain(obj),
            Text(e.result, style=RESULT_STYLES.get(e.result, "red")),
            plain(e.source_ip or "-"),
            plain(json.dumps(e.detail, ensure_ascii=False)[:120]),
        )
    print_table(t, empty="no audit entries")


@app.command("list")
def list_audit(
    ctx: typer.Context,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project id or name.")
    ] = None,
    actor: Annotated[str | None, typer.Option(help="e.g. user:alice, system:oidc.")] = None,
    action: Annotated[
        str | None, typer.Option(help="e.g. cluster.delete; a prefix ending in . or *.")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="ISO 8601 time, or a span back from now: 15m, 2h, 7d.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="ISO 8601 time or span, like --since.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N rows.")] = 50,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Audit rows: every mutation, and every refused attempt, with its result."""
    since_at = parse_since(since) if since is not None else None
    until_at = parse_since(until) if until is not None else None
    with config.client_for(ctx) as client:
        page = collect(
            lambda cursor, n: client.list_audit(
                project=project,
                actor=actor,
                action=action,
                since=since_at,
                until=until_at,
                cursor=cursor,
                limit=n,
            ),
            limit=limit,
        )
    emit(output, page, _render)
