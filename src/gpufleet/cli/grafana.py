"""``gpufleet grafana sync``: one Grafana organisation per project (docs/grafana.md).

Run by the platform owner: it reads projects and members from gpufleet's API and mints,
only when a data source is (re)created, a member token scoped to the project for it. The
Grafana admin password comes from a file and is never printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.core.enums import Role
from gpufleet.grafana.client import GrafanaClient
from gpufleet.grafana.sync import Member, ProjectSpec, sync_project

app = typer.Typer(no_args_is_help=True, help="Provision Grafana: one organisation per project.")
DATASOURCE_TOKEN_NAME = "grafana-datasource"  # noqa: S105 - a token's name, not a secret


def _dashboards(directory: Path | None) -> list[dict[str, Any]]:
    if directory is not None:
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]
    try:  # the [server] extra; see cli/dashboards.py
        from gpufleet.dashboards.export import DASHBOARDS, render
    except ImportError as exc:
        raise CliError(f"no --dashboards DIR and gpufleet.dashboards unavailable ({exc})") from exc
    return [render(spec) for spec in DASHBOARDS]


@app.command("sync")
def sync(
    ctx: typer.Context,
    grafana_url: Annotated[
        str, typer.Option(envvar="GPUFLEET_GRAFANA_URL", help="Grafana's base URL.")
    ],
    admin_credential_file: Annotated[
        Path,
        typer.Option(
            envvar="GPUFLEET_GRAFANA_ADMIN_FILE",
            help="File holding the Grafana server admin as user:password (basic auth).",
        ),
    ],
    project: Annotated[str | None, typer.Option(help="Only this project.")] = None,
    server_url: Annotated[
        str | None,
        typer.Option(help="gpufleet's URL as Grafana reaches it (default: the CLI's)."),
    ] = None,
    dashboards: Annotated[
        Path | None, typer.Option(help="Push these JSON files instead of the built-in ones.")
    ] = None,
) -> None:
    """Create or repair each project's organisation, folder, data source, roles and
    dashboards; a second run changes nothing."""
    try:
        user, _, password = admin_credential_file.read_text(encoding="utf-8").strip().partition(":")
    except OSError as exc:
        raise CliError(f"cannot read {admin_credential_file}: {exc.strerror}") from exc
    if not user or not password:
        raise CliError(f"{admin_credential_file} must hold user:password")
    boards = _dashboards(dashboards)
    with config.client_for(ctx) as api:
        base = (server_url or api.base_url).rstrip("/")
        names = [project] if project else [p.name for p in api.list_projects(limit=500).items]

        def new_token(name: str) -> str:
            made = api.create_token(name=DATASOURCE_TOKEN_NAME, project=name, role=Role.MEMBER)
            return made.token

        grafana = GrafanaClient(grafana_url, user=user, password=password)
        try:
            for name in names:
                members = tuple(
                    Member(
                        login=m.user_name,
                        email=m.email or f"{m.user_name}@localhost",
                        name=m.user_name,
                        role=m.role.value,
                    )
                    for m in api.list_members(name)
                )
                spec = ProjectSpec(
                    name=name,
                    members=members,
                    proxy_url=f"{base}/api/v1/projects/{name}/prometheus",
                )
                report = sync_project(grafana, spec, dashboards=boards, new_token=new_token)
                typer.echo(f"{name}: org {report.org_id}, {len(report.changes)} change(s)")
                for change in report.changes:
                    typer.echo(f"  {change}")
        finally:
            grafana.close()
