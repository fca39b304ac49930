"""A check result as plain JSON data: what ``checks parse -o json`` prints and what a check
run stores. Summary figures sit at the top level under stable names per tool; the full
parse and the per-node / per-GPU verdict follow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpufleet.checks.dcgm import DcgmDiagResult
from gpufleet.checks.gpuburn import GpuBurnResult
from gpufleet.checks.models import CheckKind, Reason, Verdict
from gpufleet.checks.nccl import NcclResult
from gpufleet.checks.perftest import IbWriteBwResult
from gpufleet.checks.result import CheckResult

# The top-level keys of each kind, always present (null when the output had no figure).
SUMMARY_KEYS: dict[CheckKind, tuple[str, ...]] = {
    CheckKind.NCCL: ("avg_busbw", "busbw_large", "gpus", "nodes", "wrong"),
    CheckKind.IB_WRITE_BW: ("bw_avg_gbits", "msg_bytes", "device"),
    CheckKind.DCGM_DIAG: ("failed_tests", "gpus", "version"),
    CheckKind.GPU_BURN: ("faulty", "gpus"),
}


def summary(result: CheckResult) -> dict[str, Any]:
    """The headline figures: ``passed`` plus the kind's ``SUMMARY_KEYS``.

    nccl: ``avg_busbw`` (GB/s, the "Avg bus bandwidth" line as printed; the lowest when
    the output holds several runs), ``busbw_large`` (best busbw at >= 1 GiB, what the
    limits judge), ``gpus``, ``nodes``, ``wrong``. ib-write-bw: ``bw_avg_gbits`` (Gb/s,
    converted from MB/sec) and ``msg_bytes`` of the largest message size. dcgm-diag:
    ``failed_tests`` (names). gpu-burn: ``faulty`` (GPU indices).
    """
    out: dict[str, Any] = {key: None for key in SUMMARY_KEYS[result.kind]}
    p = result.parsed
    if isinstance(p, NcclResult):
        out.update(avg_busbw=p.avg_busbw, gpus=p.gpus, nodes=len(p.hosts) or None, wrong=p.wrong)
        out["busbw_large"] = result.verdict.figures.get("busbw_large")
    elif isinstance(p, IbWriteBwResult):
        out.update(bw_avg_gbits=p.bw_avg_gbits, msg_bytes=p.msg_bytes, device=p.device)
    elif isinstance(p, DcgmDiagResult):
        out.update(failed_tests=list(p.failed_tests), gpus=len(p.gpu_indices) or None,
                   version=p.version)  # fmt: skip
    elif isinstance(p, GpuBurnResult):
        out.update(faulty=list(p.faulty), gpus=len(p.gpus) or None)
    elif result.kind in (CheckKind.DCGM_DIAG, CheckKind.GPU_BURN):
        out["failed_tests" if result.kind is CheckKind.DCGM_DIAG else "faulty"] = []
    return {"kind": result.kind.value, "passed": result.passed, **out}


def reason_dict(reason: Reason) -> dict[str, Any]:
    return {
        "outcome": reason.outcome.value,
        "code": reason.code.value,
        "message": reason.message,
        "node": reason.node,
        "gpu": reason.gpu_index,
        "figure": reason.figure,
        "threshold": reason.threshold,
        "unit": reason.unit,
    }


def verdict_dict(verdict: Verdict) -> dict[str, Any]:
    return {
        "outcome": verdict.outcome.value,
        "passed": verdict.passed,
        "reasons": [reason_dict(r) for r in verdict.reasons],
        "figures": dict(verdict.figures),
        "thresholds": dict(verdict.thresholds),
        "nodes": [
            {
                "node": n.node,
                "outcome": n.outcome.value,
                "reasons": [reason_dict(r) for r in n.reasons],
                "gpus": [
                    {
                        "index": g.index,
                        "outcome": g.outcome.value,
                        "reasons": [reason_dict(r) for r in g.reasons],
                        "figures": dict(g.figures),
                    }
                    for g in n.gpus
                ],
            }
            for n in verdict.nodes
        ],
    }


def result_dict(result: CheckResult, *, include_raw: bool = False) -> dict[str, Any]:
    """Everything, JSON-ready. ``raw`` (the tool's output) only when asked: it can be large."""
    out = summary(result)
    out["outcome"] = result.verdict.outcome.value
    out["verdict"] = verdict_dict(result.verdict)
    out["parsed"] = dataclasses.asdict(result.parsed) if result.parsed is not None else None
    if include_raw:
        out["raw"] = result.raw
    return out
