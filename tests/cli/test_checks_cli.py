"""``gpufleet checks parse``: the real CLI in a child process, on the recorded outputs.

Exit codes: 0 a pass (warnings included), 1 a failed verdict, 2 bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.processes import RUN_CLI

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    # Every GPUFLEET_ variable dropped: parse needs no server, login or config.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    done = subprocess.run(
        [sys.executable, "-c", RUN_CLI, "checks", "parse", *args],
        env={**env, "COLUMNS": "250"},
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def parsed(*args: str, code: int) -> dict[str, Any]:
    done = cli(*args, "--output", "json")
    assert done.returncode == code, (done.stdout, done.stderr)
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def test_nccl_json_summary() -> None:
    data = parsed("nccl", fixture("nccl-allreduce-h100-8gpu-reference.txt"), code=0)
    assert (data["kind"], data["passed"], data["outcome"]) == ("nccl", True, "pass")
    assert (data["avg_busbw"], data["gpus"], data["wrong"]) == (448.212, 8, 0)
    assert data["busbw_large"] == 470.73
    assert data["parsed"]["runs"][0]["rows"][3]["out_busbw"] == 470.73
    assert data["verdict"]["nodes"][0]["node"] == "host"


def test_nccl_thresholds_from_flags() -> None:
    good = parsed("nccl", fixture("nccl-allreduce-a100-8gpu-single-process.txt"),
                  "--gpu-model", "A100", code=0)  # fmt: skip
    assert good["verdict"]["thresholds"] == {"busbw_fail_below": 190.0, "busbw_warn_below": 210.0}
    bad = parsed("nccl", fixture("nccl-allreduce-a100-8gpu-single-process.txt"),
                 "--gpu-model", "h100", code=1)  # fmt: skip
    (fail,) = [r for r in bad["verdict"]["reasons"] if r["outcome"] == "fail"]
    assert (fail["code"], fail["figure"], fail["threshold"]) == ("below-threshold", 232.44, 380.0)
    assert bad["passed"] is False


def test_nccl_table_names_the_figure_and_the_limit() -> None:
    done = cli("nccl", fixture("nccl-allreduce-a100-8gpu-mpirun.txt"), "--gpu-model", "H100")
    assert done.returncode == 1
    assert "232.93 GB/s is below the fail limit 380 GB/s" in done.stdout
    assert "nccl: FAIL (1 node(s), 1 failed)" in done.stdout


@pytest.mark.parametrize(
    ("kind", "name", "code"),
    [
        ("nccl", "nccl-allreduce-truncated-variant.txt", "did-not-finish"),
        ("nccl", "nccl-allreduce-hung-header-only-variant.txt", "did-not-finish"),
        ("nccl", "nccl-allreduce-segfault-variant.txt", "crashed"),
        ("nccl", "nccl-allreduce-wrong-results-variant.txt", "wrong-results"),
        ("ib-write-bw", "ib-write-bw-server-waiting-variant.txt", "did-not-finish"),
        ("gpu-burn", "gpu-burn-killed-midway-variant.txt", "did-not-finish"),
        ("dcgm-diag", "dcgm4-r1-truncated-variant.json", "did-not-finish"),
        ("dcgm-diag", "dcgm-hostengine-error-variant.txt", "crashed"),
    ],
)
def test_unfinished_or_broken_runs_exit_1_with_a_reason(kind: str, name: str, code: str) -> None:
    data = parsed(kind, fixture(name), code=1)
    assert data["passed"] is False
    assert code in [r["code"] for r in data["verdict"]["reasons"]]


def test_ib_write_bw_mb_per_sec_converted() -> None:
    data = parsed("ib-write-bw", fixture("ib-write-bw-mbsec-all-sizes-numa-bound.txt"),
                  "--fabric", "HDR", code=0)  # fmt: skip
    assert data["msg_bytes"] == 8388608
    assert abs(data["bw_avg_gbits"] - 187.005) < 0.01  # 22292.76 MiB/s
    low = parsed("ib-write-bw", fixture("ib-write-bw-mbsec-all-sizes-wrong-numa.txt"),
                 "--fabric", "HDR", code=1)  # fmt: skip
    assert abs(low["bw_avg_gbits"] - 90.495) < 0.01


def test_dcgm_and_gpu_burn_summaries() -> None:
    dcgm = parsed("dcgm-diag", fixture("dcgm4-r1-gb10-persistence-mode-fail.json"), code=1)
    assert (dcgm["passed"], dcgm["failed_tests"]) == (False, ["software"])
    gpu0 = dcgm["verdict"]["nodes"][0]["gpus"][0]
    assert (gpu0["index"], gpu0["outcome"]) == (0, "fail")
    ok = parsed("dcgm-diag", fixture("dcgm3-r1-8gpu-from-dcgm-test.txt"), code=0)
    assert (ok["passed"], ok["failed_tests"], ok["gpus"]) == (True, [], 8)
    burn = parsed("gpu-burn", fixture("gpu-burn-8gpu-one-faulty-one-slow-variant.txt"),
                  "--node", "gpu-a03", code=1)  # fmt: skip
    assert burn["faulty"] == [5]
    node = burn["verdict"]["nodes"][0]
    assert node["node"] == "gpu-a03"
    assert {g["index"]: g["outcome"] for g in node["gpus"]}[3] == "warn"


def test_stdin_and_crlf() -> None:
    raw = (FIXTURES / "nccl-allreduce-h100-8gpu-reference.txt").read_bytes()
    done = cli("NCCL", "-", "-o", "json", stdin=raw.replace(b"\n", b"\r\n"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["avg_busbw"] == 448.212


@pytest.mark.parametrize(
    ("kind", "content"),
    [("nccl", b""), ("ib-write-bw", b"random garbage\n\x00\xff\xfe"), ("gpu-burn", b"\n\n"),
     ("dcgm-diag", b'{"a": 1}')],
)  # fmt: skip
def test_garbage_is_a_failed_verdict_not_a_pass(kind: str, content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_bytes(content)
    data = parsed(kind, str(path), code=1)
    assert data["passed"] is False and data["parsed"] is None
    assert data["verdict"]["reasons"][0]["code"] == "not-recognized"


def test_bad_input_exits_2(tmp_path: Path) -> None:
    done = cli("iperf", fixture("nccl-allreduce-h100-8gpu-reference.txt"))
    assert done.returncode == 2
    assert "'iperf' is no check this parses" in done.stderr
    missing = cli("nccl", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    folder = cli("nccl", str(tmp_path))
    assert folder.returncode == 2 and "is a directory" in folder.stderr
    model = cli("nccl", fixture("nccl-allreduce-h100-8gpu-reference.txt"), "--gpu-model", "V100")
    assert model.returncode == 2 and "unknown GPU model 'V100'" in model.stderr
    fabric = cli("ib-write-bw", fixture("ib-write-bw-ndr-reference.txt"), "--fabric", "XDR")
    assert fabric.returncode == 2 and "unknown fabric 'XDR'" in fabric.stderr
