"""``gpufleet projects``: list, create, show; members and their roles."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_time,
    note,
    plain,
    print_json,
    print_table,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.core.access import Member
from gpufleet.core.enums import Role
from gpufleet.core.models import Page, Project

app = typer.Typer(help="Projects: who owns which clusters.", no_args_is_help=True)


def _render_list(page: Page[Project]) -> None:
    t = table("NAME", "ID", "CREATED", "DESCRIPTION")
    for p in page.items:
        t.add_row(plain(p.name), plain(p.id), fmt_time(p.created_at), plain(p.description))
    print_table(t, empty="no projects")


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
    first_admin: Annotated[
        str | None, typer.Option(help="Its first admin (user id or name); default: you.")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create a project (the platform owner only) and name its first admin."""
    with config.client_for(ctx) as client:
        project = client.create_project(name, description=description, first_admin=first_admin)
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


ProjectArg = Annotated[str, typer.Argument(help="Project id or name.")]
UserArg = Annotated[str, typer.Argument(help="User id or name.")]


def _render_members(members: list[Member]) -> None:
    t = table("USER", "ROLE", "UNIX NAME", "EMAIL", "SOURCE", "SINCE")
    for m in members:
        role = Text(m.role.value, style="bold" if m.role is Role.ADMIN else "")
        t.add_row(
            plain(m.user_name),
            role,
            plain(m.unix_name or "-"),
            plain(m.email or "-"),
            plain(m.source),
            fmt_time(m.created_at),
        )
    print_table(t, empty="no members")


def _render_member(m: Member) -> None:
    _render_members([m])


@app.command("members")
def list_members(
    ctx: typer.Context, project: ProjectArg, output: OutputOpt = OutputFormat.TABLE
) -> None:
    """Who is in the project, with which role."""
    with config.client_for(ctx) as client:
        members = client.list_members(project)
    if output is OutputFormat.JSON:
        print_json(members)
    else:
        _render_members(members)


@app.command("add-member")
def add_member(
    ctx: typer.Context,
    project: ProjectArg,
    user: UserArg,
    role: Annotated[Role, typer.Option(case_sensitive=False)] = Role.MEMBER,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Add a user to the project (its admins)."""
    with config.client_for(ctx) as client:
        member = client.add_member(project, user=user, role=role)
    emit(output, member, _render_member)


@app.command("set-role")
def set_role(
    ctx: typer.Context,
    project: ProjectArg,
    user: UserArg,
    role: Annotated[Role, typer.Argument(case_sensitive=False)],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Change a member's role. The last admin stays an admin."""
    with config.client_for(ctx) as client:
        member = client.set_member_role(project, user, role=role)
    emit(output, member, _render_member)


@app.command("remove-member")
def remove_member(
    ctx: typer.Context, project: ProjectArg, user: UserArg, output: OutputOpt = OutputFormat.TABLE
) -> None:
    """Take a user out of the project. The last admin cannot be removed."""
    with config.client_for(ctx) as client:
        member = client.remove_member(project, user)
    if output is OutputFormat.JSON:
        print_json(member)
    else:
        note(f"removed {member.user_name} ({member.role.value}) from the project")
