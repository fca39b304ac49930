"""Parsed check output + thresholds → a verdict with reasons, per node and per GPU.

Pure: no I/O, no clock. The runner (or ``gpufleet checks parse``) calls ``check_output``
with the raw text and what it knows that the output does not say (``CheckContext``: the
node, GPU model, fabric, expected GPU and node counts); it gets back a ``CheckResult``
that keeps the raw text, the parsed figures and the verdict.

Rules shared by every tool: output that is not the tool's fails (``not-recognized``); a
run that did not finish fails (``did-not-finish``); a fatal error line fails
(``crashed``); a figure under a ``fail_below`` limit fails, under ``warn_below`` warns.
Limits apply only when the context names a GPU model / fabric; without them a verdict
judges correctness and completion only, and a ``note`` says what was not judged.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.checks import judge
from gpufleet.checks.dcgm import DcgmDiagResult, parse_dcgm_diag
from gpufleet.checks.gpuburn import parse_gpu_burn
from gpufleet.checks.models import (
    CheckContext,
    CheckKind,
    GpuVerdict,
    NodeVerdict,
    Outcome,
    ParseError,
    Reason,
    ReasonCode,
    Verdict,
    worst,
)
from gpufleet.checks.nccl import NcclResult, parse_nccl
from gpufleet.checks.perftest import IbWriteBwResult, parse_ib_write_bw
from gpufleet.checks.result import CheckResult, ParsedOutput
from gpufleet.checks.thresholds import ThresholdTable, get_thresholds


def parse_output(kind: CheckKind, text: str) -> ParsedOutput:
    """The parser for ``kind``. Raises :class:`ParseError` for output it does not know."""
    parsers: dict[CheckKind, Callable[[str], ParsedOutput]] = {
        CheckKind.DCGM_DIAG: parse_dcgm_diag,
        CheckKind.NCCL: parse_nccl,
        CheckKind.IB_WRITE_BW: parse_ib_write_bw,
        CheckKind.GPU_BURN: parse_gpu_burn,
    }
    return parsers[kind](text)


def evaluate(
    parsed: ParsedOutput,
    *,
    context: CheckContext | None = None,
    thresholds: ThresholdTable | None = None,
) -> Verdict:
    """Judge one parsed output. Raises ``UnknownName`` for a GPU model/fabric not in the table."""
    ctx = context or CheckContext()
    table = thresholds or get_thresholds()
    if isinstance(parsed, NcclResult):
        return assemble(CheckKind.NCCL, judge.judge_nccl(parsed, ctx=ctx, table=table))
    if isinstance(parsed, DcgmDiagResult):
        return assemble(CheckKind.DCGM_DIAG, judge.judge_dcgm(parsed, ctx=ctx))
    if isinstance(parsed, IbWriteBwResult):
        return assemble(
            CheckKind.IB_WRITE_BW, judge.judge_ib_write_bw(parsed, ctx=ctx, table=table)
        )
    return assemble(CheckKind.GPU_BURN, judge.judge_gpu_burn(parsed, ctx=ctx, table=table))


def check_output(
    kind: CheckKind,
    text: str,
    *,
    context: CheckContext | None = None,
    thresholds: ThresholdTable | None = None,
) -> CheckResult:
    """Parse and judge one saved output; never passes output it could not read.

    Raises:
        UnknownName: ``context`` names a GPU model or fabric the table does not know
            (a caller's mistake, reported before the output is read).
    """
    ctx = context or CheckContext()
    table = thresholds or get_thresholds()
    if ctx.gpu_model is not None:
        table.resolve_gpu_model(ctx.gpu_model)
    if ctx.fabric is not None:
        table.resolve_fabric(ctx.fabric)
    try:
        parsed = parse_output(kind, text)
    except ParseError as exc:
        reason = Reason(
            Outcome.FAIL,
            ReasonCode.NOT_RECOGNIZED,
            f"not {kind.value} output: {exc}",
            node=ctx.node,
        )
        verdict = assemble(kind, judge.Judgement(reasons=[reason], nodes=[ctx.node]))
        return CheckResult(kind=kind, raw=text, parsed=None, verdict=verdict)
    verdict = evaluate(parsed, context=ctx, thresholds=table)
    return CheckResult(kind=kind, raw=text, parsed=parsed, verdict=verdict)


def assemble(kind: CheckKind, j: judge.Judgement) -> Verdict:
    """Sort reasons onto nodes and GPUs: a GPU gets the reasons that name it; a node gets
    its own plus every reason that names no node (those concern the whole run). A reason
    that names a GPU but no node belongs to the first node (single-node checks)."""
    nodes: list[str | None] = list(dict.fromkeys(j.nodes)) or [None]
    for r in j.reasons:
        if r.node is not None and r.node not in nodes:
            nodes.append(r.node)

    def home(r: Reason) -> str | None:
        return r.node if r.node is not None else nodes[0]

    node_verdicts = []
    for n in nodes:
        indices = set(j.gpus.get(n, ()))
        indices.update(r.gpu_index for r in j.reasons if r.gpu_index is not None and home(r) == n)
        gpu_verdicts = []
        for i in sorted(indices):
            mine = tuple(r for r in j.reasons if r.gpu_index == i and home(r) == n)
            gpu_verdicts.append(
                GpuVerdict(
                    index=i,
                    outcome=worst(r.outcome for r in mine),
                    reasons=mine,
                    figures=dict(j.gpu_figures.get((n, i), {})),
                )
            )
        own = tuple(r for r in j.reasons if r.gpu_index is None and r.node in (n, None))
        node_verdicts.append(
            NodeVerdict(
                node=n,
                outcome=worst([*(r.outcome for r in own), *(g.outcome for g in gpu_verdicts)]),
                reasons=own,
                gpus=tuple(gpu_verdicts),
            )
        )
    return Verdict(
        kind=kind,
        outcome=worst(r.outcome for r in j.reasons),
        reasons=tuple(j.reasons),
        nodes=tuple(node_verdicts),
        figures=dict(j.figures),
        thresholds=dict(j.thresholds),
    )


def reasons_for(verdict: Verdict, *, outcome: Outcome) -> list[Reason]:
    """The reasons that gave ``verdict`` a given outcome (e.g. every FAIL)."""
    return [r for r in verdict.reasons if r.outcome is outcome]
