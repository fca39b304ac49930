"""Verdicts: parsed output + thresholds → pass/warn/fail with reasons, per node and GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.checks.evaluate import check_output, reasons_for
from gpufleet.checks.models import (
    CheckContext,
    CheckKind,
    Outcome,
    ReasonCode,
    Verdict,
)
from gpufleet.checks.report import result_dict
from gpufleet.checks.result import CheckResult
from gpufleet.checks.thresholds import UnknownName

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"
KINDS = {"nccl": CheckKind.NCCL, "ib-write-bw": CheckKind.IB_WRITE_BW,
         "gpu-burn": CheckKind.GPU_BURN, "dcgm": CheckKind.DCGM_DIAG}  # fmt: skip
# Real excerpts the parsers must refuse (see the fixtures README).
REFUSED = {"dcgm-text-output-excerpt.txt", "dcgm4-r3-diagnostic-test-excerpt.txt"}


def read(name: str) -> str:
    with (FIXTURES / name).open(newline="") as f:
        return f.read()


def kind_of(name: str) -> CheckKind:
    return next(kind for prefix, kind in KINDS.items() if name.startswith(prefix))


def check(name: str, text: str | None = None, **context: object) -> CheckResult:
    ctx = CheckContext(**context)  # type: ignore[arg-type]
    return check_output(kind_of(name), read(name) if text is None else text, context=ctx)


def codes(verdict: Verdict, outcome: Outcome = Outcome.FAIL) -> list[ReasonCode]:
    return [r.code for r in reasons_for(verdict, outcome=outcome)]


ALL_FIXTURES = sorted(p.name for p in FIXTURES.iterdir() if p.name != "README.md")


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_fixture_gets_a_verdict_and_keeps_its_raw_output(name: str) -> None:
    result = check(name)
    assert result.raw == read(name)
    json.dumps(result_dict(result))  # everything is JSON data
    if name in REFUSED:
        assert result.parsed is None
        assert codes(result.verdict) == [ReasonCode.NOT_RECOGNIZED]
    else:
        assert result.parsed is not None, name
    if "variant" in name and "assembled" not in name:
        assert not result.passed, name  # every hand-made variant is a failure case
    if name == "nccl-allreduce-b200-2node-no-device-list.txt":
        assert not result.passed  # the published snippet lacks nccl-tests' last line


# --- nccl ---------------------------------------------------------------------------


def test_h100_reference_passes_its_limits() -> None:
    result = check("nccl-allreduce-h100-8gpu-reference.txt", gpu_model="H100")
    v = result.verdict
    assert v.outcome is Outcome.PASS and v.reasons == ()
    assert v.figures["busbw_large"] == pytest.approx(470.73)
    assert v.figures["scope"] == "single-node"
    assert v.thresholds == {"busbw_fail_below": 380.0, "busbw_warn_below": 430.0}
    (node,) = v.nodes
    assert node.node == "host" and [g.index for g in node.gpus] == [0, 7]


def _lower_busbw(text: str, factor: float) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        tokens = line.split()
        if len(tokens) == 13 and tokens[0].isdigit():
            for i in (7, 11):
                line = line.replace(tokens[i], f"{float(tokens[i]) * factor:.2f}")
        out.append(line)
    return "".join(out)


def test_busbw_below_the_fail_limit_names_figure_and_limit() -> None:
    text = _lower_busbw(read("nccl-allreduce-h100-8gpu-reference.txt"), 0.7)
    v = check("nccl-allreduce-h100-8gpu-reference.txt", text, gpu_model="H100").verdict
    assert v.outcome is Outcome.FAIL
    (reason,) = reasons_for(v, outcome=Outcome.FAIL)
    assert reason.code is ReasonCode.BELOW_THRESHOLD
    assert reason.figure == pytest.approx(470.73 * 0.7, abs=0.01)
    assert (reason.threshold, reason.unit) == (380.0, "GB/s")
    assert "329.51 GB/s is below the fail limit 380 GB/s" in reason.message
    assert "NVIDIA H100 80GB HBM3" in reason.message and "expected ~470" in reason.message
    assert v.nodes[0].outcome is Outcome.FAIL
    assert all(g.outcome is Outcome.PASS for g in v.nodes[0].gpus)  # not a GPU's fault


def test_busbw_near_the_limit_warns_but_passes() -> None:
    text = _lower_busbw(read("nccl-allreduce-h100-8gpu-reference.txt"), 0.88)
    result = check("nccl-allreduce-h100-8gpu-reference.txt", text, gpu_model="H100")
    assert result.passed and result.verdict.outcome is Outcome.WARN
    assert codes(result.verdict, Outcome.WARN) == [ReasonCode.NEAR_THRESHOLD]


def test_a100_against_its_own_and_the_wrong_model() -> None:
    assert (
        check("nccl-allreduce-a100-8gpu-single-process.txt", gpu_model="A100").verdict.reasons == ()
    )
    v = check("nccl-allreduce-a100-8gpu-mpirun.txt", gpu_model="H100").verdict
    assert codes(v) == [ReasonCode.BELOW_THRESHOLD]
    assert codes(v, Outcome.WARN) == [ReasonCode.MODEL_MISMATCH]


def test_without_limits_only_correctness_is_judged() -> None:
    v = check("nccl-allreduce-a100-8gpu-mpirun.txt").verdict
    assert v.outcome is Outcome.PASS and v.thresholds == {}
    assert codes(v, Outcome.PASS) == [ReasonCode.NOTE]
    assert "not judged" in v.reasons[0].message


def test_two_node_run_verdict_per_node_and_gpu() -> None:
    name = "nccl-h100-2node-alltoall-sendrecv.txt"
    v = check(name, fabric="NDR", expected_gpus=8, expected_nodes=2).verdict
    assert v.outcome is Outcome.PASS
    assert [n.node for n in v.nodes] == ["cnode4-006", "cnode4-007"]
    assert all([g.index for g in n.gpus] == list(range(8)) for n in v.nodes)
    assert v.nodes[1].gpus[3].figures == {"rank": 11, "bus_id": "0000:61:00",
                                          "model": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    assert v.figures["scope"] == "multi-node" and v.figures["nodes"] == 2
    missing = check(name, expected_gpus=9, expected_nodes=3).verdict
    assert codes(missing).count(ReasonCode.GPU_MISSING) == 2
    assert ReasonCode.MISSING_NODES in codes(missing)
    assert {n.node for n in missing.nodes if n.outcome is Outcome.FAIL} == {
        "cnode4-006",
        "cnode4-007",
    }


def test_scope_comes_from_the_caller_when_the_output_has_no_rank_lines() -> None:
    name = "nccl-allreduce-b200-2node-no-device-list.txt"
    as_published = check(name, fabric="NDR", expected_nodes=2).verdict
    assert codes(as_published) == [ReasonCode.DID_NOT_FINISH]
    assert "no 'Collective test concluded' line" in as_published.reasons[0].message
    text = read(name) + "#\n# Collective test concluded: all_reduce_perf\n"  # as nccl-tests ends
    multi = check(name, text, fabric="NDR", expected_nodes=2).verdict
    assert multi.outcome is Outcome.PASS and multi.figures["scope"] == "multi-node"
    assert multi.thresholds["busbw_fail_below"] == 300.0
    single = check(name, text, gpu_model="B200").verdict  # as one 8-GPU node: 702.9 < 760
    assert single.figures["scope"] == "single-node"
    assert codes(single, Outcome.WARN) == [ReasonCode.NEAR_THRESHOLD]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nccl-allreduce-truncated-variant.txt", [ReasonCode.DID_NOT_FINISH]),
        ("nccl-allreduce-hung-header-only-variant.txt", [ReasonCode.DID_NOT_FINISH]),
        ("nccl-allreduce-segfault-variant.txt",
         [ReasonCode.CRASHED, ReasonCode.CRASHED, ReasonCode.DID_NOT_FINISH]),
        ("nccl-allreduce-h200-4gpu-cuda-failure.txt",
         [ReasonCode.CRASHED, ReasonCode.DID_NOT_FINISH]),
        ("nccl-allreduce-wrong-results-variant.txt", [ReasonCode.WRONG_RESULTS]),
        ("nccl-allreduce-nccl-error-variant.txt", [ReasonCode.CRASHED, ReasonCode.DID_NOT_FINISH]),
    ],
)  # fmt: skip
def test_unfinished_crashed_and_wrong_runs_fail(name: str, expected: list[ReasonCode]) -> None:
    v = check(name, gpu_model="H100").verdict
    assert v.outcome is Outcome.FAIL
    assert codes(v) == expected


def test_messages_say_what_happened() -> None:
    truncated = check("nccl-allreduce-truncated-variant.txt").verdict.reasons[0].message
    assert "did not finish: table cut off after 2 sizes (last 512 MiB)" in truncated
    hung = check("nccl-allreduce-hung-header-only-variant.txt").verdict.reasons[0].message
    assert "hung or killed before the first size" in hung
    wrong = reasons_for(
        check("nccl-allreduce-wrong-results-variant.txt").verdict, outcome=Outcome.FAIL
    )
    assert "3 wrong elements (#wrong) at 1 GiB" in wrong[0].message and wrong[0].figure == 3.0


def test_crash_attributed_to_host_and_warn_to_gpu() -> None:
    v = check("nccl-allreduce-nccl-error-variant.txt").verdict
    crash = reasons_for(v, outcome=Outcome.FAIL)[0]
    assert crash.node == "host" and "unhandled system error" in crash.message
    (node,) = v.nodes
    gpu3 = next(g for g in node.gpus if g.index == 3)
    assert gpu3.outcome is Outcome.WARN and "error 12" in gpu3.reasons[0].message
    cuda = check("nccl-allreduce-h200-4gpu-cuda-failure.txt").verdict
    crashes = [r for r in cuda.reasons if r.code is ReasonCode.CRASHED]
    assert len(crashes) == 1  # the traceback lines fold into the failure they follow
    assert crashes[0].node == "nccltest08192" and "line 14" in crashes[0].message


# --- ib_write_bw ----------------------------------------------------------------------


def test_ib_write_bw_against_fabrics() -> None:
    good = check("ib-write-bw-mbsec-all-sizes-numa-bound.txt", fabric="HDR", node="gpu-a17")
    assert good.passed and good.verdict.reasons == ()
    assert good.verdict.nodes[0].node == "gpu-a17"
    bad = check("ib-write-bw-mbsec-all-sizes-wrong-numa.txt", fabric="hdr").verdict
    (reason,) = bad.reasons
    assert reason.code is ReasonCode.BELOW_THRESHOLD
    assert reason.figure == pytest.approx(90.495, abs=0.01)
    assert (reason.threshold, reason.unit) == (160.0, "Gb/s")
    assert "mlx5_0" in reason.message and "about half the line rate" in reason.message
    ndr = check("ib-write-bw-ndr-reference.txt", fabric="NDR").verdict
    assert ndr.outcome is Outcome.PASS and ndr.figures["bw_avg_gbits"] == 388.77
    roce = check("ib-write-bw-roce100g-gbits-dc-client.txt", fabric="EDR").verdict
    assert roce.outcome is Outcome.PASS
    assert (
        check("ib-write-bw-roce100g-gbits-dc-client.txt", fabric="HDR").verdict.outcome
        is Outcome.FAIL
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ib-write-bw-server-waiting-variant.txt", [ReasonCode.DID_NOT_FINISH]),
        ("ib-write-bw-connect-failure-variant.txt",
         [ReasonCode.CRASHED, ReasonCode.CRASHED, ReasonCode.DID_NOT_FINISH]),
        ("ib-write-bw-truncated-variant.txt", [ReasonCode.DID_NOT_FINISH]),
    ],
)  # fmt: skip
def test_ib_write_bw_failures(name: str, expected: list[ReasonCode]) -> None:
    assert codes(check(name, fabric="NDR").verdict) == expected


# --- gpu-burn -------------------------------------------------------------------------


def test_gpu_burn_faulty_gpu_fails_that_gpu() -> None:
    v = check("gpu-burn-t4-faulty.txt", node="n1").verdict
    (node,) = v.nodes
    assert node.node == "n1" and node.outcome is Outcome.FAIL
    (gpu,) = node.gpus
    assert gpu.outcome is Outcome.FAIL and gpu.reasons[0].code is ReasonCode.GPU_FAULTY
    assert gpu.figures["errors"] == 30539726


def test_gpu_burn_ok_that_did_no_work_fails() -> None:
    v = check("gpu-burn-b300-7gpu-idle-reported-ok.txt").verdict
    outcomes = {g.index: g.outcome for g in v.nodes[0].gpus}
    assert outcomes == {0: Outcome.FAIL, 1: Outcome.PASS, 2: Outcome.FAIL, 3: Outcome.FAIL,
                        4: Outcome.FAIL, 5: Outcome.FAIL, 6: Outcome.FAIL}  # fmt: skip
    assert set(codes(v)) == {ReasonCode.NO_WORK}


def test_gpu_burn_faulty_and_slow_gpus_among_eight() -> None:
    v = check("gpu-burn-8gpu-one-faulty-one-slow-variant.txt", expected_gpus=8).verdict
    gpus = {g.index: g for g in v.nodes[0].gpus}
    assert gpus[5].outcome is Outcome.FAIL and gpus[3].outcome is Outcome.WARN
    assert gpus[3].reasons[0].code is ReasonCode.SLOW_GPU
    assert all(gpus[i].outcome is Outcome.PASS for i in (0, 1, 2, 4, 6, 7))
    assert v.figures["faulty"] == "5"


def test_gpu_burn_missing_gpus_and_unfinished_runs() -> None:
    assert codes(check("gpu-burn-rtx-a400-ok.txt", expected_gpus=8).verdict) == [
        ReasonCode.GPU_MISSING
    ]
    assert check("gpu-burn-rtx-a400-ok.txt", expected_gpus=1).passed
    killed = check("gpu-burn-killed-midway-variant.txt").verdict
    assert codes(killed) == [ReasonCode.DID_NOT_FINISH]
    assert "last progress 84%" in killed.reasons[0].message
    init = check("gpu-burn-init-failure-variant.txt").verdict
    assert codes(init) == [ReasonCode.CRASHED, ReasonCode.CRASHED, ReasonCode.DID_NOT_FINISH]


def test_gpu_burn_model_mismatch_warns() -> None:
    v = check("gpu-burn-rtx-a400-ok.txt", gpu_model="H100").verdict
    assert v.outcome is Outcome.WARN and codes(v, Outcome.WARN) == [ReasonCode.MODEL_MISMATCH]


# --- dcgm -------------------------------------------------------------------------------


def test_dcgm_config_failure_says_it_is_not_the_hardware() -> None:
    v = check("dcgm4-r1-gb10-persistence-mode-fail.json").verdict
    (reason,) = v.reasons
    assert reason.code is ReasonCode.TEST_FAILED and reason.gpu_index == 0
    assert "a node setting (PERSISTENCE_MODE), not the hardware" in reason.message
    assert v.nodes[0].gpus[0].outcome is Outcome.FAIL


def test_dcgm_failure_on_one_gpu_of_eight() -> None:
    excerpt = json.loads(read("dcgm4-r3-diagnostic-test-excerpt.txt").rstrip(",\n "))
    results = [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": i,
                "status": "Fail" if i == 3 else "Pass"} for i in range(8)]  # fmt: skip
    results[3]["warnings"] = [{"warning": "GPU 3 has uncorrectable memory errors and row "
                               "remappings are pending", "error_id": 85, "error_category": 10,
                               "error_severity": 6}]  # fmt: skip
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        excerpt, {"name": "memory", "results": results, "test_summary": {"status": "Fail"}}]}]},
        "metadata": {"version": "4.1.1"}}  # fmt: skip
    v = check("dcgm-x", json.dumps(doc), node="gpu-b04", expected_gpus=8).verdict
    (node,) = v.nodes
    assert node.node == "gpu-b04" and node.outcome is Outcome.FAIL
    outcome = {g.index: g.outcome for g in node.gpus}
    assert outcome == {i: Outcome.FAIL if i == 3 else Outcome.PASS for i in range(8)}
    (reason,) = node.gpus[3].reasons
    assert reason.message.startswith("memory: GPU 3 has uncorrectable memory errors")
    assert "PENDING_ROW_REMAP" in reason.message
    assert v.figures["failed_tests"] == "memory"


def test_dcgm_unfinished_and_errors() -> None:
    assert codes(check("dcgm4-r1-truncated-variant.json").verdict) == [ReasonCode.DID_NOT_FINISH]
    cut = check("dcgm4-r1-truncated-variant.json").verdict.reasons[0].message
    assert "JSON document is cut off" in cut
    error = check("dcgm-hostengine-error-variant.txt").verdict
    assert codes(error) == [ReasonCode.DID_NOT_FINISH, ReasonCode.CRASHED]
    assert error.reasons[0].message == "dcgmi diag printed no result document"
    assert error.reasons[1].message.startswith("dcgmi: Error: unable to establish a connection")
    skipped = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0,
                                        "status": "Skip"}]}]}]}}  # fmt: skip
    v = check("dcgm-x", json.dumps(skipped)).verdict
    assert (
        codes(v) == [ReasonCode.DID_NOT_FINISH] and "nothing was verified" in v.reasons[-1].message
    )
    assert codes(check("dcgm3-r3-1gpu-virtualclient.json", expected_gpus=8).verdict) == [
        ReasonCode.GPU_MISSING
    ]


def test_dcgm_warn_and_not_run_pass_with_warnings() -> None:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "pcie", "results": [
            {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
            {"entity_group": "GPU", "entity_id": 1, "status": "Warn",
             "warnings": [{"warning": "GPU 1 Thermal violations totaling 13.3 seconds",
                           "error_id": 40, "error_category": 9, "error_severity": 1}]}]},
        {"name": "targeted_power", "results": [
            {"entity_group": "GPU", "entity_id": 0, "status": "Not Run"}]}]}]}}  # fmt: skip
    result = check("dcgm-x", json.dumps(doc))
    assert result.passed and result.verdict.outcome is Outcome.WARN
    assert codes(result.verdict, Outcome.WARN) == [ReasonCode.TEST_WARNING, ReasonCode.TEST_WARNING]


# --- not the tool's output, bad context ------------------------------------------------


@pytest.mark.parametrize("kind", list(CheckKind))
@pytest.mark.parametrize("text", ["", "\n\n", "garbage\x00\xff text", "{}", "Avg bus"])
def test_garbage_fails_with_a_reason(kind: CheckKind, text: str) -> None:
    result = check_output(kind, text)
    assert not result.passed and result.raw == text
    assert result.verdict.reasons[0].outcome is Outcome.FAIL
    assert result.verdict.reasons[0].code is ReasonCode.NOT_RECOGNIZED
    assert result.verdict.reasons[0].message.startswith(f"not {kind.value} output: ")


def test_unknown_model_or_fabric_is_the_callers_error() -> None:
    with pytest.raises(UnknownName):
        check_output(CheckKind.NCCL, "", context=CheckContext(gpu_model="V100"))
    with pytest.raises(UnknownName):
        check_output(CheckKind.IB_WRITE_BW, "", context=CheckContext(fabric="XDR"))


def test_result_dict_has_the_summary_keys() -> None:
    nccl = result_dict(check("nccl-allreduce-h100-8gpu-reference.txt"))
    assert (nccl["avg_busbw"], nccl["gpus"], nccl["wrong"], nccl["passed"]) == (448.212, 8, 0, True)
    ib = result_dict(check("ib-write-bw-mbsec-server-side.txt"))
    assert ib["msg_bytes"] == 8388608 and ib["bw_avg_gbits"] == pytest.approx(90.495, abs=0.01)
    dcgm = result_dict(check("dcgm4-r1-gb10-persistence-mode-fail.json"))
    assert (dcgm["passed"], dcgm["failed_tests"]) == (False, ["software"])
    garbage = result_dict(check_output(CheckKind.DCGM_DIAG, "nope"))
    assert (garbage["passed"], garbage["failed_tests"], garbage["parsed"]) == (False, [], None)
    assert "raw" not in garbage
    assert result_dict(check("gpu-burn-t4-faulty.txt"), include_raw=True)["raw"].startswith("Using")
