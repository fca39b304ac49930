"""gpu-burn parser, on the recorded outputs in tests/fixtures/checks (see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.checks.gpuburn import parse_gpu_burn
from gpufleet.checks.models import ParseError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"


def read(name: str) -> str:
    # newline="" keeps the \r of progress lines rewritten in place
    with (FIXTURES / name).open(newline="") as f:
        return f.read()


def test_faulty_t4() -> None:
    result = parse_gpu_burn(read("gpu-burn-t4-faulty.txt"))
    assert result.finished and not result.passed
    assert (result.duration_s, result.tested, result.progress_pct) == (500, 1, 100.0)
    (gpu,) = result.gpus
    assert (gpu.index, gpu.model, gpu.status) == (0, "Tesla T4", "FAULTY")
    assert gpu.uuid == "GPU-899fdfea-f386-7371-8495-9a98620768fb"
    assert gpu.errors_max == 30539726  # the highest interval count, not the last
    assert (gpu.gflops_max, gpu.gflops_last, gpu.temp_max_c) == (3392.0, 3064.0, 70)
    assert result.faulty == (0,)


@pytest.mark.parametrize(
    ("name", "model", "gflops"),
    [
        ("gpu-burn-rtx-a400-ok.txt", "NVIDIA RTX A400", 1784.0),
        ("gpu-burn-v100s-ok-older-version.txt", "Tesla V100S-PCIE-32GB", 12462.0),
    ],
)
def test_ok_runs(name: str, model: str, gflops: float) -> None:
    result = parse_gpu_burn(read(name))
    assert result.passed
    (gpu,) = result.gpus
    assert (gpu.status, gpu.model, gpu.gflops_max, gpu.errors_max) == ("OK", model, gflops, 0)
    assert gpu.precision == "FLOATS" and not gpu.tensor_cores


def test_seven_gpus_reported_ok_though_six_did_nothing() -> None:
    result = parse_gpu_burn(read("gpu-burn-b300-7gpu-idle-reported-ok.txt"))
    assert result.tested == 7 and len(result.gpus) == 7
    assert [g.status for g in result.gpus] == ["OK"] * 7
    assert [g.gflops_max for g in result.gpus] == [0.0, 1038.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert result.passed  # gpu-burn's own verdict; the evaluator fails the idle GPUs
    assert [g.temp_max_c for g in result.gpus] == [33, 48, 43, 34, 50, 34, 46]


def test_eight_gpus_with_carriage_return_progress() -> None:
    result = parse_gpu_burn(read("gpu-burn-8gpu-one-faulty-one-slow-variant.txt"))
    assert result.finished and not result.passed
    assert len(result.gpus) == 8 and result.faulty == (5,)
    assert result.gpus[5].errors_max == 6144
    assert all(g.errors_max == 0 for g in result.gpus if g.index != 5)
    assert result.gpus[3].gflops_max == 38200.0
    assert all(g.tensor_cores for g in result.gpus)


def test_killed_midway_did_not_finish() -> None:
    result = parse_gpu_burn(read("gpu-burn-killed-midway-variant.txt"))
    assert not result.finished and result.tested is None
    assert result.progress_pct == 84.0


def test_init_failure() -> None:
    result = parse_gpu_burn(read("gpu-burn-init-failure-variant.txt"))
    assert not result.passed and not result.finished
    assert [e.line_number for e in result.errors] == [4, 5]
    assert "No clients are alive" in result.errors[1].line


def test_died_worker_in_either_column() -> None:
    # Old gpu-burn: processed -1 and "(DIED!)" in the errors column; new: after the Gflop/s.
    old = "50.0%  proc'd: -1 (0 Gflop/s) - 900 (51000 Gflop/s)   errors: 0  (DIED!)- 0   temps: -- - 61 C"  # noqa: E501
    new = "50.0%  proc'd: 7 (0 Gflop/s) (DIED!) - 900 (51000 Gflop/s)   errors: 0 - 0   temps: 61 C - 61 C"  # noqa: E501
    for line in (old, new):
        result = parse_gpu_burn(line + "\nTested 2 GPUs:\n\tGPU 0: OK\n\tGPU 1: OK\n")
        assert [g.died for g in result.gpus] == [True, False]
        assert not result.passed


def test_fewer_statuses_than_gpus_is_not_a_pass() -> None:
    text = read("gpu-burn-8gpu-one-faulty-one-slow-variant.txt").replace("\tGPU 7: OK\n", "")
    result = parse_gpu_burn(text.replace("GPU 5: FAULTY", "GPU 5: OK").replace("(WARNING!)", ""))
    assert result.gpus[7].status is None
    assert not result.passed


@pytest.mark.parametrize("text", ["", "GPU 0: OK\n", "Tested\n", "done\n"])
def test_not_gpu_burn_output_raises(text: str) -> None:
    with pytest.raises(ParseError, match="no gpu-burn output"):
        parse_gpu_burn(text)
