"""``gpufleet projects``: list, create, show."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_time,
    plain,
    print_table,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.core.models import Page, Project

app = typer.Typer(help="Projects: who owns which clusters.", no_args_is_help=True)


def _render_list(page: Page[Project]) -> None:
    t = table("NAME", "ID", "CREATED", "DESCRIPTION")
    for p in page.items:
        t.add_row(plain(p.name), plain(p.id), fmt_time(p.created_at), plain(p.description))
    print_table(t)


def _render_one(p: Project) -> None:
    rows = [
        ("name", p.name),
        ("id", p.id),
        ("created", fmt_time(p.created_at)),
        ("description", p.description or "-"),
    ]
    print_table(fields(rows))


@app.command("list")
def list_projects(ctx: typer.Context, output: OutputOpt = OutputFormat.TABLE) -> None:
    """List the projects you are a member of."""
    with config.client_for(ctx) as client:
        page = collect(lambda cursor, limit: client.list_projects(cursor=cursor, limit=limit))
    emit(output, page, _render_list)


@app.command("create")
def create_project(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Project name, unique on this server.")],
    description: Annotated[str, typer.Option(help="What the project is for.")] = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create a project; you become its admin."""
    with config.client_for(ctx) as client:
        project = client.create_project(name, description=description)
    emit(output, project, _render_one)


@app.command("show")
def show_project(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="Project id or name.")],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show one project."""
    with config.client_for(ctx) as client:
        project = client.get_project(ref)
    emit(output, project, _render_one)
