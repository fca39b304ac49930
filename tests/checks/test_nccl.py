"""nccl-tests parser, on the recorded outputs in tests/fixtures/checks (see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.checks.models import ParseError
from gpufleet.checks.nccl import parse_nccl

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_reference_h100_single_node() -> None:
    result = parse_nccl(read("nccl-allreduce-h100-8gpu-reference.txt"))
    assert result.passed and result.finished
    (run,) = result.runs
    assert run.collective == "all_reduce"  # inferred: no "Collective test starting" line
    assert (run.n_threads, run.n_gpus) == (1, 8)
    assert run.avg_busbw == pytest.approx(448.212)
    assert result.avg_busbw == pytest.approx(448.212)
    # Ranks 1-6 are elided as "#  …" in the source; the highest rank still counts them.
    assert result.gpus == 8
    assert [r.size for r in run.rows] == [268435456, 536870912, 1073741824, 2147483648]
    last = run.rows[-1]
    assert (last.out_time_us, last.out_algbw, last.out_busbw) == (7983.5, 268.99, 470.73)
    assert (last.in_busbw, last.in_wrong, last.out_wrong) == (470.63, 0, 0)
    assert run.busbw_large == pytest.approx(470.73)  # best of the >= 1 GiB rows
    assert run.out_of_bounds == 0 and run.out_of_bounds_ok is True
    assert run.min_bw_check is None
    assert run.models == ("NVIDIA H100 80GB HBM3",)
    assert result.hosts == ("host",)


def test_a100_single_process_and_mpirun_noise() -> None:
    single = parse_nccl(read("nccl-allreduce-a100-8gpu-single-process.txt"))
    mpi = parse_nccl(read("nccl-allreduce-a100-8gpu-mpirun.txt"))
    for result in (single, mpi):
        assert result.passed
        (run,) = result.runs
        assert len(run.rows) == 30  # 8 B ... 4 GiB; mpirun's "help message" lines skipped
        assert run.rows[0].size == 8 and run.rows[-1].size == 4294967296
        assert result.gpus == 8
        assert [r.device for r in run.ranks] == list(range(8))
        assert run.ranks[2].bus_id == "0x45"
    assert single.avg_busbw == pytest.approx(66.2058)
    assert mpi.avg_busbw == pytest.approx(72.7724)
    assert single.runs[0].busbw_large == pytest.approx(232.44)
    assert mpi.runs[0].busbw_large == pytest.approx(232.93)  # in-place beat out-of-place
    # The avg averages tiny sizes too: far below what the fabric does at large sizes.
    assert single.avg_busbw is not None and single.avg_busbw < single.runs[0].busbw_large / 3


def test_two_node_file_with_two_collectives() -> None:
    result = parse_nccl(read("nccl-h100-2node-alltoall-sendrecv.txt"))
    assert result.passed
    assert [r.collective for r in result.runs] == ["alltoall", "sendrecv"]
    assert all(r.concluded for r in result.runs)
    assert result.hosts == ("cnode4-006", "cnode4-007")
    assert result.gpus == 16
    alltoall, sendrecv = result.runs
    assert alltoall.avg_busbw == pytest.approx(72.4265)
    assert sendrecv.avg_busbw == pytest.approx(28.6299)
    assert result.avg_busbw == pytest.approx(28.6299)  # the lowest of the runs
    # "N/A" in the in-place #wrong column: no count, not a wrong value.
    assert all(r.in_wrong is None and r.out_wrong == 0 for r in alltoall.rows)
    assert alltoall.rows[0].dtype == "double" and alltoall.rows[0].redop == "none"
    assert sendrecv.busbw_large == pytest.approx(28.84)


def test_crashed_run_keeps_the_header_and_names_the_host() -> None:
    result = parse_nccl(read("nccl-allreduce-h200-4gpu-cuda-failure.txt"))
    assert not result.passed and not result.finished
    assert result.version == "2.19.7"
    (run,) = result.runs
    assert run.collective == "all_reduce" and run.rows == () and result.gpus == 4
    fatal = result.fatal_errors
    assert fatal[0].kind == "cuda-failure"
    assert fatal[0].host == "nccltest08192"
    assert "illegal memory access" in fatal[0].message
    assert {e.kind for e in fatal[1:]} == {"test-failure"}  # the traceback lines


def test_no_device_list_still_parses() -> None:
    text = read("nccl-allreduce-b200-2node-no-device-list.txt")
    result = parse_nccl(text)
    (run,) = result.runs
    assert result.gpus is None and result.hosts == ()
    assert run.collective == "all_reduce"  # named by "# Collective test starting"
    assert run.busbw_large == pytest.approx(702.91)
    assert result.version == "2.17.6"
    # The published snippet stops after the footer; nccl-tests prints "# Collective test
    # concluded" next, so as saved the output reads as cut off.
    assert run.named and not run.concluded and not run.finished and not result.passed
    restored = parse_nccl(text + "#\n# Collective test concluded: all_reduce_perf\n")
    assert restored.passed and restored.runs[0].concluded


def test_bitwise_mismatches_line() -> None:
    text = read("nccl-allreduce-h100-8gpu-reference.txt").replace(
        "# Avg bus bandwidth", "# Bitwise mismatches   : 4 FAILED\n# Avg bus bandwidth"
    )
    run = parse_nccl(text).runs[0]
    assert run.bitwise_mismatches == 4 and not run.clean


def test_truncated_run_did_not_finish() -> None:
    result = parse_nccl(read("nccl-allreduce-truncated-variant.txt"))
    (run,) = result.runs
    assert not run.finished and not result.passed
    assert len(run.rows) == 2  # the half-printed third row is not a row
    assert run.avg_busbw is None


def test_hung_run_has_header_only() -> None:
    result = parse_nccl(read("nccl-allreduce-hung-header-only-variant.txt"))
    (run,) = result.runs
    assert run.rows == () and not run.finished and run.gpus == 8


def test_segfault_is_fatal_even_with_rows() -> None:
    result = parse_nccl(read("nccl-allreduce-segfault-variant.txt"))
    assert not result.passed
    kinds = [e.kind for e in result.fatal_errors]
    assert "signal" in kinds and "mpi-abort" in kinds
    abort = next(e for e in result.fatal_errors if e.kind == "mpi-abort")
    assert abort.host == "host"


def test_wrong_values_fail_the_parse_level_pass() -> None:
    result = parse_nccl(read("nccl-allreduce-wrong-results-variant.txt"))
    assert result.finished and not result.passed
    assert result.wrong == 3
    assert [r.wrong for r in result.runs[0].rows] == [0, 0, 3, 0]


def test_nccl_failure_and_warn_lines() -> None:
    result = parse_nccl(read("nccl-allreduce-nccl-error-variant.txt"))
    assert not result.passed
    failure = next(e for e in result.errors if e.kind == "nccl-failure")
    assert failure.host == "host" and "unhandled system error" in failure.message
    warn = next(e for e in result.errors if e.kind == "nccl-warn")
    assert (warn.fatal, warn.host, warn.device) == (False, "host", 3)
    assert "error 12" in warn.message


def test_crash_line_alone_is_recognized() -> None:
    text = "nid006352: Test NCCL failure common.cu:958 'invalid usage (run with NCCL_DEBUG=WARN)'\n"
    result = parse_nccl(text)
    assert result.runs == () and not result.passed
    assert result.fatal_errors[0].host == "nid006352"


def test_footer_flags() -> None:
    text = read("nccl-allreduce-h100-8gpu-reference.txt")
    failed_bounds = text.replace("Out of bounds values : 0 OK", "Out of bounds values : 50 FAILED")
    assert not parse_nccl(failed_bounds).passed
    assert parse_nccl(failed_bounds).runs[0].out_of_bounds == 50
    min_bw = text.replace(
        "# Avg bus bandwidth    : 448.212", "# Avg bus bandwidth    : 448.212 FAILED"
    )
    run = parse_nccl(min_bw).runs[0]
    assert run.min_bw_check == "FAILED" and not run.clean
    ok = text.replace("# Avg bus bandwidth    : 448.212", "# Avg bus bandwidth    : 448.212 OK")
    assert parse_nccl(ok).passed


def test_a_footer_without_rows_is_not_a_finished_run() -> None:
    result = parse_nccl("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 448.212\n")
    assert not result.runs[0].finished and not result.passed


def test_old_error_column_is_a_deviation_not_a_count() -> None:
    # nccl-tests < 2.10: "error" column with a max deviation (real shape: NVIDIA/nccl#1244).
    text = (
        "#       size         count      type   redop     time   algbw   busbw  error     time"
        "   algbw   busbw  error\n"
        "   268435456      67108864     float     sum   1119.8  239.71  419.49  4e-07"
        "   1117.4  240.24  420.42  2e-07\n"
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 419.9\n"
    )
    result = parse_nccl(text)
    (row,) = result.runs[0].rows
    assert row.out_wrong is None and row.max_error == pytest.approx(4e-07)
    assert row.out_busbw == pytest.approx(419.49) and row.root is None
    assert result.passed


@pytest.mark.parametrize(
    "text",
    ["", "   \n\n", "hello world\n", "# just a comment\n", "12 34 56\n", '{"json": true}\n'],
)
def test_not_nccl_output_raises(text: str) -> None:
    with pytest.raises(ParseError, match="no nccl-tests output"):
        parse_nccl(text)
