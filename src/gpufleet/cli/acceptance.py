"""``gpufleet acceptance``: a cluster's acceptance runs (list, show), running the suite now
(run, admins), and downloading a run's report (report --format json|html -o FILE)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import EXIT_FAILURE, CliError
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_age,
    fmt_time,
    note,
    plain,
    print_table,
    stdout,
    styled,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.client.api import ApiClient
from gpufleet.core.acceptance import (
    OPEN_STATUSES,
    AcceptanceRun,
    AcceptanceStatus,
    AcceptanceTrigger,
    canonical_json,
)
from gpufleet.core.enums import AcceptanceStage
from gpufleet.core.ids import is_id
from gpufleet.core.models import Page

app = typer.Typer(
    help="Acceptance tests: the suite a cluster passes before it is ready, and its reports.",
    no_args_is_help=True,
)

STATUS_STYLES = {
    "pending": "cyan",
    "running": "cyan",
    "passed": "green",
    "failed": "bold red",
    "error": "bold red",
    "cancelled": "dim",
}
OUTCOME_STYLES = {"pass": "green", "warn": "yellow", "skipped": "yellow", "fail": "bold red"}

ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster id or name.")]
ProjectOpt = Annotated[
    str | None, typer.Option("--project", "-p", help="Project to find the cluster in.")
]
RunRef = Annotated[str, typer.Argument(help="Acceptance run id.")]


def _run_id(ref: str) -> str:
    if not is_id(ref):
        raise CliError(
            f"{ref!r} is not an acceptance run id; `gpufleet acceptance list` shows them"
        )
    return ref


def _render_list(page: Page[AcceptanceRun]) -> None:
    t = table("ID", "TRIGGER", "STATUS", "NODES", "FAILED", "AGE", "DETAIL", right=("NODES",))
    for r in page.items:
        t.add_row(
            plain(r.id),
            plain(r.trigger.value),
            styled(r.status.value, STATUS_STYLES),
            plain(len(r.node_ids)),
            plain(", ".join(r.failed_nodes) or "-"),
            fmt_age(r.created_at),
            plain(r.detail),
        )
    print_table(t, empty="no acceptance runs")


def _render_one(r: AcceptanceRun) -> None:
    rows: list[tuple[str, Text | str]] = [
        ("id", r.id),
        ("status", styled(r.status.value, STATUS_STYLES)),
        ("stage", r.stage.value),
        ("detail", r.detail or "-"),
        ("trigger", r.trigger.value),
        ("scope", r.scope.value),
        ("cluster", r.cluster_id),
        ("repair", r.repair_id or "-"),
        ("suite", ", ".join(c.label for c in r.suite.checks)),
        ("check runs", ", ".join(r.check_run_ids) or "-"),
        ("requested by", r.created_by),
        ("created", fmt_time(r.created_at)),
        ("started", fmt_time(r.started_at)),
        ("finished", fmt_time(r.finished_at)),
        ("report sha256", r.report_sha256 or "- (written when the run ends)"),
    ]
    print_table(fields(rows))
    if r.nodes:
        note("")
        t = table("NODE", "OUTCOME", "WHY", title="Nodes")
        for n in r.nodes:
            t.add_row(
                plain(n.name),
                styled(n.outcome, OUTCOME_STYLES),
                plain("; ".join(n.reasons[:3]) or "-"),
            )
        print_table(t)


@app.command("list")
def list_runs(
    ctx: typer.Context,
    cluster: ClusterOpt,
    project: ProjectOpt = None,
    trigger: Annotated[
        AcceptanceTrigger | None,
        typer.Option(case_sensitive=False, help="Only provisioning, repair or manual runs."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N runs.")] = 20,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """A cluster's acceptance runs, newest first."""
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(cluster, project=project).id
        page = collect(
            lambda cursor, n: client.list_acceptance_runs(
                cluster_id, trigger=trigger, cursor=cursor, limit=n
            ),
            limit=limit,
        )
    emit(output, page, _render_list)


@app.command("show")
def show_run(ctx: typer.Context, ref: RunRef, output: OutputOpt = OutputFormat.TABLE) -> None:
    """One run: status, checks, and each node's outcome with the reasons."""
    with config.client_for(ctx) as client:
        run = client.get_acceptance_run(_run_id(ref))
    emit(output, run, _render_one)


@app.command("run")
def run_suite(
    ctx: typer.Context,
    cluster: ClusterOpt,
    project: ProjectOpt = None,
    nodes: Annotated[
        list[str] | None,
        typer.Option(
            "--node", "-n", help="Only this node (name or id; repeatable): node-level checks only."
        ),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why; kept in the audit log.")] = "",
    force: Annotated[
        bool, typer.Option("--force", help="Also check nodes that run jobs (default: skip them).")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the run to end; exit 1 unless it passed.")
    ] = False,
    timeout_s: Annotated[float, typer.Option(help="With --wait: give up after this long.")] = 7200,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Run the cluster's acceptance suite now (project admins)."""
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(cluster, project=project).id
        run = client.run_acceptance(cluster_id, nodes=nodes, reason=reason, force=force)
        if wait:
            run = _wait(client, run, timeout_s=timeout_s)
    emit(output, run, _render_one)
    if wait and run.status is not AcceptanceStatus.PASSED:
        raise typer.Exit(EXIT_FAILURE)


def _wait(client: ApiClient, run: AcceptanceRun, *, timeout_s: float) -> AcceptanceRun:
    deadline = time.monotonic() + timeout_s
    while run.status in OPEN_STATUSES or (
        run.stage not in (AcceptanceStage.DONE, AcceptanceStage.GATING)
    ):
        if time.monotonic() > deadline:
            raise CliError(
                f"acceptance run {run.id} still {run.status.value} after {timeout_s:.0f} s "
                f"({run.detail})",
                exit_code=EXIT_FAILURE,
            )
        time.sleep(2.0)
        run = client.get_acceptance_run(run.id)
    return run


@app.command("report")
def download_report(
    ctx: typer.Context,
    ref: RunRef,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="json (hashed, canonical) or html (one page).")
    ] = "json",
    out: Annotated[
        Path | None, typer.Option("--output-file", "-o", help="Write here (default: stdout).")
    ] = None,
) -> None:
    """Download a finished run's report. The JSON's SHA-256 is checked against the run's."""
    if fmt not in ("json", "html"):
        raise typer.BadParameter("json or html", param_hint="--format")
    with config.client_for(ctx) as client:
        run = client.get_acceptance_run(_run_id(ref))
        body, etag = client.acceptance_report(run.id, fmt=fmt)
    if fmt == "json":
        digest = hashlib.sha256(body).hexdigest()
        # The bytes are the canonical form; reading and re-writing them must not change it.
        same = canonical_json(json.loads(body)) == body
        if digest != etag or digest != run.report_sha256 or not same:
            raise CliError(
                f"report of {run.id}: SHA-256 {digest} does not match the run's "
                f"{run.report_sha256} (ETag {etag}); not written",
                exit_code=EXIT_FAILURE,
            )
    if out is None:
        stdout().file.write(body.decode("utf-8"))
        return
    out.write_bytes(body)
    note(f"wrote {out} ({len(body)} bytes; report sha256 {etag})")
