"""``gpufleet usage``: GPU-hours from the schedulers' job accounting."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.output import OutputFormat, OutputOpt, plain, print_data, print_table, table
from gpufleet.core.models import GpuHours, UsageGroup

app = typer.Typer(no_args_is_help=True, help="GPU-hours by project, user, account and day.")


@app.command("gpu-hours")
def gpu_hours(
    ctx: typer.Context,
    by: Annotated[
        list[UsageGroup] | None,
        typer.Option("--by", help="Group by this (repeatable; default: project)."),
    ] = None,
    days: Annotated[
        float, typer.Option(min=0.001, max=366, help="The last N days (default 30).")
    ] = 30.0,
    project: Annotated[str | None, typer.Option("--project", "-p", help="One project.")] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="One cluster (id or name).")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """GPU-hours of the jobs that ended in the last days (a job counts on its end day)."""
    groups = by or [UsageGroup.PROJECT]
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        until = dt.datetime.now(dt.UTC)
        report = client.gpu_hours(
            group_by=groups,
            since=until - dt.timedelta(days=days),
            until=until,
            project=project,
            cluster=cluster_id,
        )

    def render(r: GpuHours) -> None:
        keys = [g.value for g in r.group_by]
        t = table(*(k.upper() for k in keys), "JOBS", "GPU-HOURS", right=("JOBS", "GPU-HOURS"))
        for row in r.rows:
            t.add_row(
                *(plain(getattr(row, k)) for k in keys),
                str(row.jobs),
                f"{row.gpu_hours:,.2f}",
            )
        t.add_row(*(["total"] + [""] * (len(keys) - 1)), str(r.jobs),
                  f"{r.total_gpu_hours:,.2f}")  # fmt: skip
        print_table(t)

    if output is OutputFormat.JSON:
        # As the server sends it: a row has only the keys grouped by.
        print_data(report.model_dump(mode="json", exclude_none=True))
    else:
        render(report)
