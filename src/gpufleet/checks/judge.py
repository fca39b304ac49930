"""The rules, one function per tool: parsed output → reasons (and figures).

``evaluate.assemble`` turns a ``Judgement`` into the per-node / per-GPU ``Verdict``. Every
rule here is written so that missing evidence fails: a run that did not finish, a GPU
that is not in the output, a status word nobody knows.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.checks.dcgm import DcgmDiagResult, DcgmStatus
from gpufleet.checks.dcgm_codes import FR_NAMES
from gpufleet.checks.gpuburn import GpuBurnResult
from gpufleet.checks.models import CheckContext, Outcome, Reason, ReasonCode
from gpufleet.checks.nccl import GIB, NcclError, NcclResult, NcclRun
from gpufleet.checks.perftest import IbWriteBwResult
from gpufleet.checks.thresholds import Limit, ThresholdTable

Figure = float | int | str | None
FAIL, WARN, PASS = Outcome.FAIL, Outcome.WARN, Outcome.PASS
MAX_LISTED = 8  # error lines turned into reasons, per kind, before "... and N more"

# DCGM codes that mean "the test could not run / was told not to", not a hardware fault
# (§3.2: "Fail can also mean the plugin could not complete"; §3.1 ABORTED, TEST_SKIPPED).
_NOT_HARDWARE = {47, 48, 117}
_SEVERITY_CONFIG = 5


@dataclass(slots=True)
class Judgement:
    reasons: list[Reason] = field(default_factory=list)
    nodes: list[str | None] = field(default_factory=list)
    gpus: dict[str | None, list[int]] = field(default_factory=dict)
    gpu_figures: dict[tuple[str | None, int], dict[str, Figure]] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)

    def add(self, outcome: Outcome, code: ReasonCode, message: str, **where: object) -> None:
        self.reasons.append(Reason(outcome, code, message, **where))  # type: ignore[arg-type]


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, factor in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


def _against(
    j: Judgement,
    *,
    figure: float | None,
    limit: Limit,
    what: str,
    unit: str,
    key: str,
    node: str | None = None,
    hint: str = "",
) -> None:
    """Compare one figure with its limit; a missing figure fails (no evidence)."""
    j.thresholds[f"{key}_fail_below"] = limit.fail_below
    j.thresholds[f"{key}_warn_below"] = limit.warn_below
    expected = f"; expected ~{limit.expected:g} {unit}" if limit.expected else ""
    if figure is None:
        j.add(FAIL, ReasonCode.DID_NOT_FINISH, f"{what}: no figure to judge", node=node)
    elif figure < limit.fail_below:
        j.add(
            FAIL,
            ReasonCode.BELOW_THRESHOLD,
            f"{what} {figure:.2f} {unit} is below the fail limit {limit.fail_below:g} {unit}"
            f"{expected}{hint}",
            node=node,
            figure=figure,
            threshold=limit.fail_below,
            unit=unit,
        )
    elif figure < limit.warn_below:
        j.add(
            WARN,
            ReasonCode.NEAR_THRESHOLD,
            f"{what} {figure:.2f} {unit} is below the warn limit {limit.warn_below:g} {unit}"
            f"{expected}{hint}",
            node=node,
            figure=figure,
            threshold=limit.warn_below,
            unit=unit,
        )


def _model_matches(wanted: str, seen: Iterable[str]) -> bool:
    norm = " ".join(wanted.lower().split())
    return all(" ".join(s.lower().split()) == norm for s in seen)


# --- nccl-tests -------------------------------------------------------------------


def _nccl_errors(j: Judgement, errors: tuple[NcclError, ...], *, run_failed: bool) -> None:
    fatal = [e for e in errors if e.fatal]
    primary = [e for e in fatal if e.kind != "test-failure"] or fatal  # skip the traceback
    seen: set[tuple[str | None, str]] = set()
    listed = 0
    for e in primary:
        if (e.host, e.kind) in seen:
            continue
        seen.add((e.host, e.kind))
        listed += 1
        if listed > MAX_LISTED:
            break
        where = f" on {e.host}" if e.host else ""
        j.add(
            FAIL,
            ReasonCode.CRASHED,
            f"{e.kind}{where}: {e.message} (line {e.line_number})",
            node=e.host,
        )
    if not run_failed:
        return
    warned: set[tuple[str | None, int | None]] = set()
    for e in errors:
        if e.fatal or (e.host, e.device) in warned or len(warned) >= MAX_LISTED:
            continue
        warned.add((e.host, e.device))
        j.add(
            WARN,
            ReasonCode.CRASHED,
            f"NCCL WARN on {e.host} GPU {e.device}: {e.message}",
            node=e.host,
            gpu_index=e.device,
        )


def _nccl_run_checks(j: Judgement, run: NcclRun, label: str) -> None:
    if run.avg_busbw is not None and not run.rows:
        j.add(FAIL, ReasonCode.DID_NOT_FINISH, f"{label}: a footer but no result row")
    elif run.avg_busbw is not None and not run.finished:
        j.add(
            FAIL,
            ReasonCode.DID_NOT_FINISH,
            f"{label} did not finish: footer printed but no 'Collective test concluded' line "
            "(nccl-tests prints it right after): the output was cut off",
        )
    elif not run.finished:
        if run.rows:
            msg = (
                f"{label} did not finish: table cut off after {len(run.rows)} sizes (last "
                f"{_size(run.largest_size)}), no 'Avg bus bandwidth' line: truncated or killed"
            )
        else:
            msg = (
                f"{label} did not finish: header printed but no result row: hung or killed "
                "before the first size"
            )
        j.add(FAIL, ReasonCode.DID_NOT_FINISH, msg)
    if run.wrong:
        sizes = ", ".join(_size(r.size) for r in run.rows if r.wrong)
        j.add(
            FAIL,
            ReasonCode.WRONG_RESULTS,
            f"{label}: {run.wrong} wrong elements (#wrong) at {sizes}: data corruption; "
            "bisect by GPU and node",
            figure=float(run.wrong),
        )
    if run.out_of_bounds_ok is False:
        j.add(
            FAIL,
            ReasonCode.WRONG_RESULTS,
            f"{label}: 'Out of bounds values : {run.out_of_bounds} FAILED'",
        )
    if run.bitwise_mismatches:
        j.add(
            FAIL,
            ReasonCode.WRONG_RESULTS,
            f"{label}: 'Bitwise mismatches : {run.bitwise_mismatches} FAILED'",
            figure=float(run.bitwise_mismatches),
        )
    if run.min_bw_check == "FAILED":
        j.add(
            FAIL,
            ReasonCode.BELOW_THRESHOLD,
            f"{label}: nccl-tests' own NCCL_TESTS_MIN_BW check failed "
            f"(Avg bus bandwidth {run.avg_busbw})",
        )
    if any(r.max_error for r in run.rows):
        j.add(
            PASS,
            ReasonCode.NOTE,
            f"{label}: old nccl-tests print a max deviation ('error'), not a count of wrong "
            "elements; it is not judged",
        )


def judge_nccl(result: NcclResult, *, ctx: CheckContext, table: ThresholdTable) -> Judgement:
    j = Judgement()
    hosts = list(result.hosts)
    j.nodes = [*hosts] if hosts else [ctx.node]
    for run in result.runs:
        for rank in run.ranks:
            node_gpus = j.gpus.setdefault(rank.host, [])
            if rank.device not in node_gpus:
                node_gpus.append(rank.device)
            j.gpu_figures[(rank.host, rank.device)] = {
                "rank": rank.rank,
                "bus_id": rank.bus_id,
                "model": rank.model,
            }
    if not hosts and ctx.node is not None:  # single-node run whose rank lines are missing
        j.gpus[ctx.node] = []
    failed = not result.passed
    _nccl_errors(j, result.errors, run_failed=failed)
    if not result.runs:
        j.add(FAIL, ReasonCode.DID_NOT_FINISH, "nccl-tests printed no test header or result table")
    multi = len(hosts) > 1 or (not hosts and (ctx.expected_nodes or 1) > 1)
    for n, run in enumerate(result.runs):
        label = (run.collective or "test") + (f" (run {n + 1})" if len(result.runs) > 1 else "")
        _nccl_run_checks(j, run, label)
        if run.finished and run.collective == "all_reduce":
            _nccl_busbw(j, run, label, ctx=ctx, table=table, multi=multi)
        elif run.finished and run.busbw_large is not None:
            j.add(
                PASS,
                ReasonCode.NOTE,
                f"{label}: busbw {run.busbw_large:.2f} GB/s at >= "
                f"{_size(min(GIB, run.largest_size or 0))} (limits apply to all_reduce only)",
            )
    if ctx.expected_nodes is not None and hosts and len(hosts) < ctx.expected_nodes:
        j.add(
            FAIL,
            ReasonCode.MISSING_NODES,
            f"ranks ran on {len(hosts)} node(s) ({', '.join(hosts)}), "
            f"expected {ctx.expected_nodes}",
            figure=float(len(hosts)),
            threshold=float(ctx.expected_nodes),
        )
    if ctx.expected_gpus is not None:
        for host in hosts:
            count = len(j.gpus.get(host, []))
            if count < ctx.expected_gpus:
                j.add(
                    FAIL,
                    ReasonCode.GPU_MISSING,
                    f"{host}: {count} GPU(s) in the run, expected {ctx.expected_gpus}",
                    node=host,
                    figure=float(count),
                    threshold=float(ctx.expected_gpus),
                )
    all_reduce = [
        r.busbw_large for r in result.runs if r.collective == "all_reduce" and r.busbw_large
    ]
    j.figures.update(
        avg_busbw=result.avg_busbw,
        busbw_large=min(all_reduce) if all_reduce else None,
        gpus=result.gpus,
        nodes=len(hosts) or None,
        wrong=result.wrong,
        runs=len(result.runs),
        collectives=",".join(r.collective or "?" for r in result.runs) or None,
        scope="multi-node" if multi else "single-node",
    )
    return j


def _nccl_busbw(
    j: Judgement, run: NcclRun, label: str, *, ctx: CheckContext, table: ThresholdTable, multi: bool
) -> None:
    small = (run.largest_size or 0) < GIB
    hint = (
        (
            f" (largest message {_size(run.largest_size)}: run to >= 1 GiB, e.g. -e 8G, "
            "small messages do not reach peak)"
        )
        if small
        else ""
    )
    at = f"at >= {_size(min(GIB, run.largest_size or 0))} messages"
    if multi:
        if ctx.fabric is None:
            j.add(PASS, ReasonCode.NOTE, f"{label}: multi-node busbw not judged (no fabric given)")
            return
        fabric = table.resolve_fabric(ctx.fabric)
        limit = table.nccl_multi_node(fabric, nics_per_node=ctx.nics_per_node)
        nics = ctx.nics_per_node or table.fabrics[fabric].nics_per_node
        what = f"{label} busbw {at} across {len(run.hosts) or ctx.expected_nodes} nodes"
        _against(
            j,
            figure=run.busbw_large,
            limit=limit,
            unit="GB/s",
            key="busbw",
            what=f"{what} ({fabric}, {nics} NICs/node)",
            hint=hint,
        )
        return
    if ctx.gpu_model is None:
        j.add(PASS, ReasonCode.NOTE, f"{label}: single-node busbw not judged (no GPU model given)")
        return
    model = table.resolve_gpu_model(ctx.gpu_model)
    if run.models and not _model_matches(model, run.models):
        j.add(
            WARN,
            ReasonCode.MODEL_MISMATCH,
            f"the output shows {', '.join(run.models)}; judged against the limits for {model}",
        )
    if run.gpus is not None and run.gpus != 8:
        j.add(
            PASS,
            ReasonCode.NOTE,
            f"{label}: single-node limits are for 8 GPUs; this run had {run.gpus}",
        )
    _against(
        j,
        figure=run.busbw_large,
        limit=table.nccl_single_node(model),
        unit="GB/s",
        key="busbw",
        what=f"{label} busbw {at} ({model}, single node)",
        hint=hint,
    )


# --- dcgmi diag -------------------------------------------------------------------


def judge_dcgm(result: DcgmDiagResult, *, ctx: CheckContext) -> Judgement:
    j = Judgement(nodes=[ctx.node])
    j.gpus[ctx.node] = list(result.gpu_indices)
    for i, serial in result.gpu_serials.items():
        j.gpu_figures[(ctx.node, i)] = {"serial": serial or None}
    if result.truncated:
        j.add(
            FAIL,
            ReasonCode.DID_NOT_FINISH,
            "dcgmi diag did not finish: its JSON document is cut off (killed or timed out)",
        )
    elif not result.complete:
        j.add(FAIL, ReasonCode.DID_NOT_FINISH, "dcgmi diag printed no result document")
    for line in result.errors[:MAX_LISTED]:
        j.add(FAIL, ReasonCode.CRASHED, f"dcgmi: {line}")
    if result.runtime_error:
        j.add(
            FAIL, ReasonCode.CRASHED, f"DCGM could not run the diagnostic: {result.runtime_error}"
        )
    if result.complete and not result.tests and not result.runtime_error:
        j.add(FAIL, ReasonCode.DID_NOT_FINISH, "the dcgmi diag document holds no test results")
    ran = False
    for test in result.tests:
        name = test.name + (
            f" (iteration {test.iteration + 1})" if test.iteration is not None else ""
        )
        judged_results = False
        for r in test.results:
            ran = ran or r.status is DcgmStatus.PASS
            if r.status in (DcgmStatus.PASS, DcgmStatus.SKIP):
                continue
            judged_results = True
            outcome = FAIL if r.status in (DcgmStatus.FAIL, DcgmStatus.UNKNOWN) else WARN
            code = ReasonCode.TEST_FAILED if outcome is FAIL else ReasonCode.TEST_WARNING
            if r.status is DcgmStatus.UNKNOWN:
                details = [f"status {r.status_raw!r} is not a DCGM status (not counted as a pass)"]
            elif r.warnings:
                details = [
                    _dcgm_warning(w.describe(), w.error_id, w.error_severity) for w in r.warnings
                ]
            else:
                details = [
                    "did not run" if r.status is DcgmStatus.NOT_RUN else f"status {r.status_raw}"
                ]
            gpus = r.gpu_indices if len(r.gpu_indices) == 1 else ()
            where = (
                f" on GPUs {', '.join(map(str, r.gpu_indices))}" if len(r.gpu_indices) > 1 else ""
            )
            for detail in details:
                j.add(
                    outcome, code, f"{name}{where}: {detail}", gpu_index=gpus[0] if gpus else None
                )
        if test.summary_status in (DcgmStatus.FAIL, DcgmStatus.UNKNOWN) and not judged_results:
            j.add(FAIL, ReasonCode.TEST_FAILED, f"{name}: test summary {test.summary_status.value}")
        if test.status is DcgmStatus.SKIP:
            j.add(PASS, ReasonCode.NOTE, f"{name}: skipped")
    if result.tests and not ran and not result.failed_tests:
        j.add(
            FAIL,
            ReasonCode.DID_NOT_FINISH,
            "no DCGM test passed on any GPU (all skipped or not run): nothing was verified",
        )
    if ctx.expected_gpus is not None and len(result.gpu_indices) < ctx.expected_gpus:
        j.add(
            FAIL,
            ReasonCode.GPU_MISSING,
            f"DCGM reported {len(result.gpu_indices)} GPU(s), expected {ctx.expected_gpus}",
            figure=float(len(result.gpu_indices)),
            threshold=float(ctx.expected_gpus),
        )
    j.figures.update(
        version=result.version,
        driver_version=result.driver_version,
        tests=len(result.tests),
        failed_tests=",".join(result.failed_tests) or None,
        gpus=len(result.gpu_indices) or None,
    )
    return j


def _dcgm_warning(text: str, error_id: int | None, severity: int | None) -> str:
    if error_id in _NOT_HARDWARE:
        return f"{text} — the test did not complete; not a hardware verdict"
    if severity == _SEVERITY_CONFIG or error_id == 29:  # 29: PERSISTENCE_MODE
        return (
            f"{text} — a node setting ({FR_NAMES.get(error_id or 0, 'config')}), not the hardware"
        )
    return text


# --- ib_write_bw ------------------------------------------------------------------


def judge_ib_write_bw(
    result: IbWriteBwResult, *, ctx: CheckContext, table: ThresholdTable
) -> Judgement:
    j = Judgement(nodes=[ctx.node])
    hca = result.device or "the HCA"
    for e in result.errors[:MAX_LISTED]:
        j.add(FAIL, ReasonCode.CRASHED, f"ib_write_bw on {hca}: {e.line} (line {e.line_number})")
    if not result.rows:
        what = "no result table" if not result.tables else "a result header but no row"
        j.add(
            FAIL,
            ReasonCode.DID_NOT_FINISH,
            f"ib_write_bw on {hca} did not finish: {what} (a server still waiting for its "
            "client, or killed before the first size)",
        )
    elif not result.closed:
        j.add(
            FAIL,
            ReasonCode.DID_NOT_FINISH,
            f"ib_write_bw on {hca} did not finish: the table is cut off after {len(result.rows)} "
            f"sizes (last {result.rows[-1].msg_bytes} bytes)",
        )
    if result.finished:
        if ctx.fabric is None:
            j.add(PASS, ReasonCode.NOTE, "bandwidth not judged (no fabric given)")
        else:
            fabric = table.resolve_fabric(ctx.fabric)
            line_rate = table.fabrics[fabric].line_rate_gbits
            bw = result.bw_avg_gbits
            hint = ""
            if bw is not None and 0.4 * line_rate <= bw <= 0.6 * line_rate:
                hint = (
                    " — about half the line rate: a PCIe link trained at half width, or a "
                    "lost GPUDirect path with --use_cuda (§4.2)"
                )
            _against(
                j,
                figure=bw,
                limit=table.ib_write_bw(fabric),
                unit="Gb/s",
                key="bw_avg",
                what=f"ib_write_bw average on {hca} at {result.msg_bytes}-byte messages "
                f"({fabric}, line rate {line_rate:g} Gb/s)",
                hint=hint,
            )
    j.figures.update(
        bw_avg_gbits=result.bw_avg_gbits,
        msg_bytes=result.msg_bytes,
        device=result.device,
        link_type=result.link_type,
        unit=result.unit,
        sizes=len(result.rows),
    )
    return j


# --- gpu-burn ---------------------------------------------------------------------


def judge_gpu_burn(result: GpuBurnResult, *, ctx: CheckContext, table: ThresholdTable) -> Judgement:
    node = ctx.node
    j = Judgement(nodes=[node])
    j.gpus[node] = [g.index for g in result.gpus]
    for e in result.errors[:MAX_LISTED]:
        j.add(FAIL, ReasonCode.CRASHED, f"gpu-burn: {e.line} (line {e.line_number})")
    if not result.finished:
        last = (
            f" (last progress {result.progress_pct:g}%)" if result.progress_pct is not None else ""
        )
        j.add(
            FAIL,
            ReasonCode.DID_NOT_FINISH,
            f"gpu-burn did not finish: no 'Tested N GPUs' block{last}",
        )
    elif not result.gpus:
        j.add(FAIL, ReasonCode.GPU_MISSING, "gpu-burn's final block lists no GPU")
    speeds = [g.gflops_max for g in result.gpus if g.gflops_max]
    median = statistics.median(speeds) if len(speeds) > 1 else None
    slow_pct = table.gpu_burn.slow_gpu_below_median_pct
    for g in result.gpus:
        j.gpu_figures[(node, g.index)] = {
            "status": g.status,
            "gflops": g.gflops_max,
            "errors": g.errors_max,
            "temp_max_c": g.temp_max_c,
            "model": g.model,
            "uuid": g.uuid,
        }
        at = {"gpu_index": g.index}
        if g.status == "FAULTY" or g.errors_max:
            j.add(
                FAIL,
                ReasonCode.GPU_FAULTY,
                f"GPU {g.index}: {g.status or 'errors'} — wrong GEMM results under load (up to "
                f"{g.errors_max} per interval): silent data corruption, RMA candidate after a "
                "confirming run",
                figure=float(g.errors_max),
                **at,
            )
        if g.died:
            j.add(FAIL, ReasonCode.GPU_DIED, f"GPU {g.index}: its gpu-burn worker died", **at)
        if result.finished and g.status is None:
            j.add(
                FAIL, ReasonCode.GPU_MISSING, f"GPU {g.index}: not in gpu-burn's final list", **at
            )
        if result.finished and not g.gflops_max:
            j.add(
                FAIL,
                ReasonCode.NO_WORK,
                f"GPU {g.index}: reported {g.status or 'nothing'} but did no work (0 Gflop/s on "
                "every progress line)",
                figure=0.0,
                **at,
            )
        elif median and g.gflops_max and g.gflops_max < median * (1 - slow_pct / 100):
            j.add(
                WARN,
                ReasonCode.SLOW_GPU,
                f"GPU {g.index}: {g.gflops_max:.0f} Gflop/s, more than {slow_pct:g}% below the "
                f"node median {median:.0f}: throttling? check clock-event reasons",
                figure=g.gflops_max,
                threshold=median * (1 - slow_pct / 100),
                unit="Gflop/s",
                **at,
            )
    count = len(result.gpus)
    if ctx.expected_gpus is not None and count < ctx.expected_gpus:
        j.add(
            FAIL,
            ReasonCode.GPU_MISSING,
            f"gpu-burn ran on {count} GPU(s), expected {ctx.expected_gpus}",
            figure=float(count),
            threshold=float(ctx.expected_gpus),
        )
    if result.tested is not None and result.tested < count:
        j.add(
            FAIL,
            ReasonCode.GPU_MISSING,
            f"gpu-burn says it tested {result.tested} GPU(s) but {count} took part",
        )
    models = [g.model for g in result.gpus if g.model]
    if ctx.gpu_model is not None and models:
        model = table.resolve_gpu_model(ctx.gpu_model)
        if not _model_matches(model, models):
            j.add(
                WARN,
                ReasonCode.MODEL_MISMATCH,
                f"the output shows {', '.join(dict.fromkeys(models))}, expected {model}",
            )
    j.thresholds["slow_gpu_below_median_pct"] = slow_pct
    j.figures.update(
        gpus=count or None,
        tested=result.tested,
        faulty=",".join(map(str, result.faulty)) or None,
        gflops_median=median,
        duration_s=result.duration_s,
    )
    return j
