"""``gpufleet checks``: active checks (DCGM diag, nccl-tests, ib_write_bw, gpu-burn).

``checks parse KIND FILE|-`` reads a saved output, no server involved: what the parser
makes of it, and the verdict with the thresholds for ``--gpu-model`` / ``--fabric``.
Exit 0 for a pass (warnings included), 1 for a failed verdict (output that is not the
tool's fails too), 2 for bad input (unknown kind, GPU model or fabric; missing file).
Commands that run checks on nodes through the server belong in this group as well.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.checks.evaluate import check_output
from gpufleet.checks.models import CheckContext, CheckKind, Outcome
from gpufleet.checks.report import result_dict, summary
from gpufleet.checks.result import CheckResult
from gpufleet.checks.thresholds import UnknownName, get_thresholds
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
from gpufleet.core.check_runs import CheckRun
from gpufleet.core.enums import CheckStatus
from gpufleet.core.ids import is_id
from gpufleet.core.models import Page

app = typer.Typer(help="Active checks: DCGM diag, nccl-tests, ib_write_bw, gpu-burn.")

OUTCOME_STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def read_output(path: str) -> str:
    """The saved output at ``path`` (``-``: stdin), decoded leniently: tools print junk."""
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    file = Path(path)
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise CliError(f"{path} {what}; give a saved check output file, or - for stdin")
    try:
        return file.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc


def _figure(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return "-" if value is None else str(value)


def render(result: CheckResult) -> None:
    """The verdict for a person: headline figures, reasons, then nodes and GPUs."""
    verdict = result.verdict
    head = summary(result)
    t = table("figure", "value")
    for key, value in head.items():
        if key not in ("kind", "passed"):
            t.add_row(plain(key), plain(_figure(value)))
    for key, value in verdict.thresholds.items():
        t.add_row(plain(key), plain(_figure(value)))
    print_table(t)
    if verdict.reasons:
        rt = table("outcome", "reason", "node", "gpu", "message")
        for r in verdict.reasons:
            rt.add_row(
                styled(r.outcome.value, OUTCOME_STYLES),
                plain(r.code.value),
                plain(r.node),
                plain(r.gpu_index),
                plain(r.message),
            )
        print_table(rt)
    gpus = [(n, g) for n in verdict.nodes for g in n.gpus if g.outcome is not Outcome.PASS]
    if gpus:
        gt = table("node", "gpu", "outcome")
        for n, g in gpus:
            gt.add_row(plain(n.node), plain(g.index), styled(g.outcome.value, OUTCOME_STYLES))
        print_table(gt)
    line = Text(f"{result.kind.value}: ")
    line.append(verdict.outcome.value.upper(), style=OUTCOME_STYLES[verdict.outcome.value])
    nodes = [n for n in verdict.nodes if n.node is not None]
    if nodes:
        failed = [n.node for n in nodes if n.outcome is Outcome.FAIL]
        line.append(f" ({len(nodes)} node(s), {len(failed)} failed)")
    stdout().print(line)


def _check_kind(value: str) -> CheckKind:
    try:
        return CheckKind.from_name(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command("parse")
def parse_saved_output(
    kind: Annotated[
        CheckKind,
        typer.Argument(
            metavar="KIND",
            parser=_check_kind,
            help="Which tool wrote the output: dcgm-diag, nccl, ib-write-bw or gpu-burn, "
            "or the tool's own name (dcgmi, all_reduce_perf, ib_write_bw, gpu_burn).",
        ),
    ],
    path: Annotated[str, typer.Argument(metavar="FILE|-", help="Saved output; - reads stdin.")],
    output: OutputOpt = OutputFormat.TABLE,
    gpu_model: Annotated[
        str | None,
        typer.Option(help="Judge single-node NCCL busbw for this GPU model (e.g. H100)."),
    ] = None,
    fabric: Annotated[
        str | None,
        typer.Option(help="Judge ib_write_bw and multi-node NCCL for this fabric (NDR, HDR)."),
    ] = None,
    node: Annotated[
        str | None, typer.Option(help="The node the output came from (for the verdict).")
    ] = None,
    expect_gpus: Annotated[
        int | None, typer.Option(min=1, help="GPUs each node should have shown.")
    ] = None,
    expect_nodes: Annotated[
        int | None, typer.Option(min=1, help="Nodes an NCCL run should have spanned.")
    ] = None,
) -> None:
    """What a parser makes of a saved check output, and the verdict."""
    context = CheckContext(
        node=node,
        gpu_model=gpu_model,
        fabric=fabric,
        expected_gpus=expect_gpus,
        expected_nodes=expect_nodes,
    )
    text = read_output(path)
    try:
        result = check_output(kind, text, context=context, thresholds=get_thresholds())
    except UnknownName as exc:
        raise CliError(str(exc)) from exc
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(result_dict(result), indent=2, ensure_ascii=False))
    else:
        render(result)
    if not result.passed:
        raise typer.Exit(EXIT_FAILURE)


# -- check runs on a server (gpufleet checks run | list | show | output | cancel) ---------

RUN_STATUS_STYLES = {
    "pending": "cyan",
    "running": "magenta",
    "passed": "green",
    "failed": "bold red",
    "error": "bold red",
    "cancelled": "dim",
}
ENDED_STATUSES = {"passed", "failed", "error", "cancelled"}
RunRef = Annotated[str, typer.Argument(help="Check run id.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster id or name.")]
ProjectOpt = Annotated[
    str | None, typer.Option("--project", "-p", help="Project to find the cluster in.")
]


def _run_id(ref: str) -> str:
    if not is_id(ref):
        raise CliError(f"{ref!r} is not a check run id; `gpufleet checks list` shows them")
    return ref


def _render_runs(page: Page[CheckRun]) -> None:
    t = table("ID", "CHECK", "STATUS", "OUTCOME", "NODES", "PURPOSE", "AGE", "DETAIL")
    for r in page.items:
        names = ", ".join(n.name for n in r.nodes[:4]) + ("…" if len(r.nodes) > 4 else "")
        t.add_row(
            plain(r.id),
            plain(r.kind),
            styled(r.status.value, RUN_STATUS_STYLES),
            styled(r.outcome, OUTCOME_STYLES) if r.outcome else plain(None),
            plain(names),
            plain(r.purpose),
            fmt_age(r.created_at),
            plain(r.detail),
        )
    print_table(t, empty="no check runs")
    if page.next_cursor:
        note(f"showing the first {len(page.items)} runs; raise --limit for more")


def _render_run(r: CheckRun) -> None:
    result = r.result or {}
    rows: list[tuple[str, Text | str]] = [
        ("id", r.id),
        ("check", r.kind + (f" level {r.params['level']}" if "level" in r.params else "")),
        ("status", styled(r.status.value, RUN_STATUS_STYLES)),
        ("outcome", styled(r.outcome, OUTCOME_STYLES) if r.outcome else "-"),
        ("detail", r.detail or "-"),
        ("nodes", ", ".join(n.name for n in r.nodes)),
        ("cluster", r.cluster_id),
        ("purpose", r.purpose + (f" (of {r.parent_id})" if r.parent_id else "")),
        ("backend", r.backend or "-"),
        ("forced", "yes" if r.forced else "no"),
        ("requested by", r.requested_by or "-"),
        ("created", fmt_time(r.created_at)),
        ("started", fmt_time(r.started_at)),
        ("finished", fmt_time(r.finished_at)),
    ]
    if result.get("stand_in"):
        rows.append(("stand-in", Text("yes: a configured stand-in ran, not the tool", "yellow")))
    print_table(fields(rows))
    if r.skipped:
        note("")
        t = table("NODE", "WHY", title="Skipped")
        for s in r.skipped:
            t.add_row(plain(s.node), plain(s.reason))
        print_table(t)
    nodes = result.get("nodes") or {}
    if isinstance(nodes, dict) and nodes:
        note("")
        t = table("NODE", "OUTCOME", "GPUS FAILED", "FIGURES", "WHY", title="Verdict per node")
        for entry in nodes.values():
            gpus = entry.get("gpus") or {}
            bad = [i for i, g in gpus.items() if g.get("outcome") == "fail"]
            figures = entry.get("figures") or {}
            shown = ", ".join(
                f"{k} {_figure(v)}" for k, v in figures.items() if v is not None and k in _SHOWN
            )
            reasons = [x["message"] for x in entry.get("reasons", []) if x["outcome"] != "pass"]
            for g in gpus.values():
                reasons += [x["message"] for x in g.get("reasons", []) if x["outcome"] != "pass"]
            t.add_row(
                plain(entry.get("name")),
                styled(entry.get("outcome"), OUTCOME_STYLES),
                plain(", ".join(bad) or "-"),
                plain(shown or "-"),
                plain("; ".join(reasons[:3]) or "-"),
            )
        print_table(t)
    run_reasons = [x["message"] for x in result.get("reasons", []) if x["outcome"] != "pass"]
    for message in run_reasons[:5]:
        note(f"run: {message}")
    loc = result.get("localisation")
    if isinstance(loc, dict):
        if loc.get("bad_nodes") or loc.get("bad_links") or loc.get("unresolved"):
            links = ", ".join("–".join(link) for link in loc.get("bad_links") or [])
            note(
                f"localisation {loc.get('run_id')}: bad node(s) "
                f"{', '.join(loc.get('bad_nodes') or []) or '-'}; bad link(s) {links or '-'}; "
                f"{loc.get('rounds')} round(s)"
            )
            for line in loc.get("unresolved") or []:
                note(f"  unresolved: {line}")
        else:
            note(f"localisation {loc.get('run_id')}: {loc.get('status', 'running')}")


_SHOWN = ("busbw_large", "bw_avg_gbits", "gpus", "failed_tests", "faulty", "version")


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    cluster: ClusterOpt,
    check: Annotated[
        CheckKind,
        typer.Option(
            "--check", case_sensitive=False, help="dcgm-diag, nccl, ib-write-bw or gpu-burn."
        ),
    ],
    project: ProjectOpt = None,
    nodes: Annotated[
        str | None,
        typer.Option(
            "--nodes",
            "-n",
            help="Comma-separated node names or ids (default: every node in service).",
        ),
    ] = None,
    level: Annotated[
        int | None, typer.Option(min=1, max=4, help="dcgm-diag level, 1..4 (default 3).")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="KEY=VALUE check parameter (JSON values; repeatable), "
            "e.g. scope=multi-node, fabric=NDR, duration_s=120.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Also run on nodes that run jobs (project admins).")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the result; exit 1 unless it passed.")
    ] = False,
    timeout_s: Annotated[float, typer.Option(help="With --wait: give up after this long.")] = 7200,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Run an active check on a cluster's nodes. Members run checks on idle nodes: a node
    running a job is skipped, with the reason shown."""
    params: dict[str, object] = {}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--param")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    node_list = [n.strip() for n in nodes.split(",") if n.strip()] if nodes else None
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(cluster, project=project).id
        run = client.run_check(
            cluster=cluster_id,
            check=check.value,
            nodes=node_list,
            level=level,
            params=params,
            force=force,
        )
        if wait:
            run = _wait(client, run, timeout_s=timeout_s)
    emit(output, run, _render_run if wait else _after_start)
    if wait and run.status.value != "passed":
        raise typer.Exit(EXIT_FAILURE)


def _after_start(r: CheckRun) -> None:
    note(
        f"check run {r.id} ({r.kind} on {', '.join(n.name for n in r.nodes)}): "
        f"{r.status.value}; `gpufleet checks show {r.id}` follows it"
    )


def _wait(client: ApiClient, run: CheckRun, *, timeout_s: float) -> CheckRun:
    deadline = time.monotonic() + timeout_s
    while run.status.value not in ENDED_STATUSES:
        if time.monotonic() > deadline:
            raise CliError(
                f"check run {run.id} still {run.status.value} after {timeout_s:.0f} s "
                f"({run.detail})",
                exit_code=EXIT_FAILURE,
            )
        time.sleep(1.0)
        run = client.get_check(run.id)
    return run


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster id or name.")
    ] = None,
    project: ProjectOpt = None,
    status: Annotated[
        list[CheckStatus] | None,
        typer.Option(case_sensitive=False, help="Only these statuses; repeatable."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N runs.")] = 50,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Check runs, newest first."""
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        page = collect(
            lambda cursor, n: client.list_checks(
                cluster=cluster_id, status=status, cursor=cursor, limit=n
            ),
            limit=limit,
        )
    emit(output, page, _render_runs)


@app.command("show")
def show_cmd(ctx: typer.Context, ref: RunRef, output: OutputOpt = OutputFormat.TABLE) -> None:
    """One check run: status, each node's verdict with figures and reasons, what was
    skipped and why; ``--output json`` for the whole result."""
    with config.client_for(ctx) as client:
        run = client.get_check(_run_id(ref))
    emit(output, run, _render_run)


@app.command("output")
def output_cmd(ctx: typer.Context, ref: RunRef) -> None:
    """The raw output of every command of a run, as the tools printed it."""
    with config.client_for(ctx) as client:
        text = client.check_output(_run_id(ref))
    typer.echo(text, nl=not text.endswith("\n"))


@app.command("cancel")
def cancel_cmd(ctx: typer.Context, ref: RunRef, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Cancel a pending or running check run; its commands are stopped."""
    with config.client_for(ctx) as client:
        run = client.cancel_check(_run_id(ref))
    emit(output, run, _render_run)
