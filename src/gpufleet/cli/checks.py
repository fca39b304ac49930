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
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.checks.evaluate import check_output
from gpufleet.checks.models import CheckContext, CheckKind, CheckResult, Outcome
from gpufleet.checks.report import result_dict, summary
from gpufleet.checks.thresholds import UnknownName, get_thresholds
from gpufleet.cli.errors import EXIT_FAILURE, CliError
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    plain,
    print_table,
    stdout,
    styled,
    table,
)

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


@app.command("parse")
def parse_saved_output(
    kind: Annotated[
        CheckKind,
        typer.Argument(
            case_sensitive=False,
            metavar="KIND",
            help="Which tool wrote the output: dcgm-diag, nccl, ib-write-bw or gpu-burn.",
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
