"""``gpufleet reliability``: where GPU-hours went, from the fleet's own history."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_num,
    fmt_time,
    plain,
    print_table,
    table,
)
from gpufleet.core.reliability import BadputRow, ReliabilityReport, ReliabilityRow

app = typer.Typer(
    no_args_is_help=True, help="Where GPU-hours went: outages by cause, MTTR and MTBF."
)


class ReportPart(StrEnum):
    SIGNATURE = "signature"
    GPU_MODEL = "gpu-model"
    DAY = "day"
    CLUSTER = "cluster"
    HOST = "host"
    OUTAGES = "outages"


@app.command("report")
def report(
    ctx: typer.Context,
    days: Annotated[
        float, typer.Option(min=0.001, max=366, help="The last N days (default 30).")
    ] = 30.0,
    project: Annotated[str | None, typer.Option("--project", "-p", help="One project.")] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="One cluster (id or name).")
    ] = None,
    by: Annotated[
        list[ReportPart] | None,
        typer.Option("--by", help="Tables to show (repeatable; default: signature, cluster)."),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """GPU-hours lost to outages (a node out of service) by the cause behind each, jobs
    that failed as their node broke, MTTR (detection to back in service) and MTBF."""
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        until = dt.datetime.now(dt.UTC)
        got = client.reliability(
            since=until - dt.timedelta(days=days), until=until, project=project, cluster=cluster_id
        )
    parts = list(dict.fromkeys(by or [ReportPart.SIGNATURE, ReportPart.CLUSTER]))
    emit(output, got, lambda r: _render(r, parts))


def _render(r: ReliabilityReport, parts: list[ReportPart]) -> None:
    print_table(
        fields(
            [
                ("window", f"{fmt_time(r.since)} → {fmt_time(r.until)}"),
                ("GPU-hours", fmt_num(r.gpu_hours, digits=1)),
                ("lost to outages", fmt_num(r.gpu_hours_lost, digits=1)),
                ("lost with failed jobs", fmt_num(r.job_gpu_hours_lost, digits=1)),
                (
                    "available",
                    plain(None if r.available_pct is None else f"{r.available_pct:.2f} %"),
                ),
                ("failures", str(r.failures)),
                ("MTTR", plain(_unit(r.mttr_h, "{:.2f} h"))),
                ("MTBF", plain(_unit(r.mtbf_h, "{:,.1f} node-hours"))),
            ]
        )
    )
    for part in parts:
        if part is ReportPart.OUTAGES:
            _outages(r)
        elif part in (ReportPart.CLUSTER, ReportPart.HOST):
            _tallies(part.value, r.by_cluster if part is ReportPart.CLUSTER else r.by_host)
        else:
            rows = {
                ReportPart.SIGNATURE: r.by_signature,
                ReportPart.GPU_MODEL: r.by_gpu_model,
                ReportPart.DAY: r.by_day,
            }[part]
            _badput(part.value, rows)


def _unit(value: float | None, form: str) -> str | None:
    return None if value is None else form.format(value)


def _badput(name: str, rows: list[BadputRow]) -> None:
    right = ("OUTAGES", "GPU-H LOST", "JOB GPU-H LOST")
    t = table(name.upper(), *right, title=f"\nby {name}", right=right)
    for row in rows:
        t.add_row(
            plain(row.key),
            str(row.outages),
            f"{row.gpu_hours_lost:,.1f}",
            f"{row.job_gpu_hours_lost:,.1f}",
        )
    print_table(t)


def _tallies(name: str, rows: list[ReliabilityRow]) -> None:
    right = ("GPUS", "GPU-H LOST", "FAILURES", "RECOVERED", "REMOVED", "MTTR H", "MTBF H")
    columns = (name.upper(), *(("CLUSTER",) if name == "host" else ()), *right)
    t = table(*columns, title=f"\nby {name}", right=right)
    for row in rows:
        t.add_row(
            plain(row.name),
            *((plain(row.cluster),) if name == "host" else ()),
            str(row.gpus),
            f"{row.gpu_hours_lost:,.1f}",
            str(row.failures),
            str(row.recovered),
            str(row.removed),
            fmt_num(row.mttr_h, digits=2),
            fmt_num(row.mtbf_h, digits=1),
        )
    print_table(t)


def _outages(r: ReliabilityReport) -> None:
    t = table("NODE", "CLUSTER", "SIGNATURE", "CAUSE", "OUT", "BACK", "ENDED", "GPU-H LOST",
              title=f"\noutages ({len(r.outages)} of {r.outages_total}, newest first)",
              right=("GPU-H LOST",))  # fmt: skip
    for o in r.outages:
        t.add_row(
            plain(o.node),
            plain(o.cluster),
            plain(o.signature),
            plain(o.cause),
            fmt_time(o.out_at),
            fmt_time(o.back_at),
            plain(o.ended),
            f"{o.gpu_hours_lost:,.1f}",
        )
    print_table(t)
