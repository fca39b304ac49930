"""``gpufleet scan``: a saved kernel log in, findings out; no server involved."""

from __future__ import annotations

import gc
import gzip
import io
import json
import multiprocessing
import os
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import scan as scan_module
from gpufleet.cli.main import app
from gpufleet.cli.scan import (
    Found,
    _auto_jobs,
    finding_json,
    findings_json,
    scan_file_parallel,
    scan_stream,
)
from gpufleet.core.signatures.matcher import Match

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernel-logs"
REFERENCE = FIXTURES / "reference-1.10.log"


def test_json_has_one_object_per_finding() -> None:
    result = CliRunner().invoke(app, ["scan", str(REFERENCE), "--output", "json"])
    assert result.exit_code == 0, result.output
    findings = json.loads(result.stdout)
    assert len(findings) == 21
    for f in findings:
        assert {"signature", "title", "xid", "pci", "severity", "action", "line",
                "line_number"} <= f.keys()  # fmt: skip
    first = findings[0]
    assert first["signature"] == "xid-79"
    assert first["xid"] == 79
    assert first["pci"] == "0000:91:00.0"
    assert first["severity"] == "fatal"
    assert first["action"] == "reboot"
    assert first["line_number"] == 3
    assert first["gpu_uuid"] == "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"
    assert "GPU has fallen off the bus" in first["line"]
    assert findings[1]["xid"] is None
    probe = next(f for f in findings if f["signature"] == "gpu-fallen-off-bus-probe")
    assert probe["line"].count("\n") == 2


def test_table_names_gpu_severity_and_action() -> None:
    result = CliRunner().invoke(app, ["scan", str(REFERENCE)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "0000:91:00.0" in result.stdout
    assert "xid-79" in result.stdout
    assert "reboot" in result.stdout
    assert "21 finding(s)" in result.stdout


def test_stdin_and_gzip(tmp_path: Path) -> None:
    data = REFERENCE.read_bytes()
    from_stdin = CliRunner().invoke(app, ["scan", "-", "-o", "json"], input=data)
    assert from_stdin.exit_code == 0, from_stdin.output
    packed = tmp_path / "kern.log.gz"
    packed.write_bytes(gzip.compress(data))
    from_gzip = CliRunner().invoke(app, ["scan", str(packed), "-o", "json"])
    assert from_gzip.exit_code == 0, from_gzip.output
    assert json.loads(from_stdin.stdout) == json.loads(from_gzip.stdout)
    assert len(json.loads(from_gzip.stdout)) == 21


def test_healthy_log_prints_no_findings() -> None:
    healthy = str(FIXTURES / "healthy-boot.log")
    assert json.loads(CliRunner().invoke(app, ["scan", healthy, "-o", "json"]).stdout) == []
    result = CliRunner().invoke(app, ["scan", healthy])
    assert result.exit_code == 0
    assert "no failure signatures found" in result.stdout


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["scan", str(tmp_path / "nope.log")], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "does not exist" in result.output
    result = CliRunner().invoke(app, ["scan", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "is a directory" in result.output


def test_parallel_scan_of_a_large_log_matches_the_serial_one(tmp_path: Path) -> None:
    # Large enough for the chunked candidate finder (> 64 KiB chunks) and the job split.
    sick = (FIXTURES / "reference-1.10.log").read_text().splitlines()
    healthy = (FIXTURES / "healthy-boot.log").read_text().splitlines()
    lines = [healthy[i % len(healthy)] for i in range(40_000)]
    for i, line in enumerate(sick):
        lines.insert(1_000 + i * 997, line)
    log = tmp_path / "big.log"
    log.write_text("\n".join(lines))  # no newline at the end, on purpose
    runner = CliRunner()
    serial = runner.invoke(app, ["scan", str(log), "-o", "json", "--jobs", "1"])
    parallel = runner.invoke(app, ["scan", str(log), "-o", "json", "--jobs", "3"])
    assert serial.exit_code == 0 and parallel.exit_code == 0, parallel.output
    assert json.loads(serial.stdout) == json.loads(parallel.stdout)
    assert len(json.loads(serial.stdout)) >= len(sick) // 2


def _straddling_log(seed: int) -> bytes:
    """Multi-line probe messages every few lines (so ranges split them), the GPU's UUID
    printed once near the start, Xids for that GPU all along."""
    rng = random.Random(seed)
    out = ["NVRM: GPU at PCI:0000:3b:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"]
    probe = [
        "NVRM: The NVIDIA GPU 0000:3b:00.0",
        "NVRM: (PCI ID: 10de:2330) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    for k in range(400):
        out.append(f"[{k}.5] usb 1-1: new high-speed USB device number {k}")
        if k % 3 == 0:
            out.append("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off")
        if k % 5 == 0:
            for line in probe:
                out.append(line)
                if rng.random() < 0.5:
                    out.append("NVRM: nvAssertOkFailedNoLog: noise between the lines")
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("chunk", [50, 4096, 4 << 20])  # 50: lines longer than a read
@pytest.mark.parametrize("jobs", [2, 3, 7, 16, 40])
def test_parallel_ranges_put_back_windows_uuids_and_line_numbers(
    tmp_path: Path, jobs: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan_module, "_CHUNK", chunk)  # workers are forked: they see it
    log = tmp_path / "straddle.log"
    log.write_bytes(_straddling_log(jobs))
    serial = [(m, m.line_number, m.gpu_uuid) for m in scan_stream(io.BytesIO(log.read_bytes()))]
    assert any(m.signature == "gpu-fallen-off-bus-probe" for m, _, _ in serial)
    parallel = scan_file_parallel(str(log), jobs)
    assert _resolved(parallel) == _resolved(serial)
    assert findings_json(parallel) == findings_json(serial)
    # JSON: the ranges before the first window followed past a range's end send text.
    assert scan_module.scan_file_json(str(log), jobs) == findings_json(serial)


def _resolved(found: list[Found]) -> list[Match]:
    return [replace(m, line_number=number, gpu_uuid=uuid) for m, number, uuid in found]


def test_findings_json_is_what_json_dumps_writes() -> None:
    found = [(m, m.line_number, m.gpu_uuid) for m in scan_stream(REFERENCE.open("rb"))]
    odd = replace(
        found[0][0], line='quote " backslash \\ tab \t bell \x07 ü 𝄞', uptime_s=float("nan")
    )
    found += [(odd, None, None), (replace(odd, uptime_s=float("inf")), 7, "GPU-x")]
    want = [
        {**finding_json(m), "line_number": number, "gpu_uuid": uuid} for m, number, uuid in found
    ]
    assert findings_json(found) == json.dumps(want, indent=2, ensure_ascii=False)
    assert findings_json([]) == json.dumps([], indent=2)


def test_a_big_file_is_split_over_the_cpus_by_default(tmp_path: Path) -> None:
    assert _auto_jobs(1 << 20) == 1
    assert _auto_jobs(1 << 40) == max(1, min(os.cpu_count() or 1, 8))


@pytest.mark.parametrize("jobs", [2, 3, 5])
def test_ranges_cover_the_file_in_whole_lines_the_first_a_little_bigger(
    tmp_path: Path, jobs: int
) -> None:
    log = tmp_path / "kern.log"
    data = b"".join(f"[{k}.5] line {k} {'x' * (k % 90)}\n".encode() for k in range(30_000))
    log.write_bytes(data)
    ranges = scan_module._split(str(log), len(data), jobs)
    assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]]
    assert (ranges[0][0], ranges[-1][1]) == (0, len(data))
    assert all(data[b - 1 : b] == b"\n" for _, b in ranges)
    sizes = [b - a for a, b in ranges]
    # The caller's range is a little bigger: a worker also sends its findings over.
    assert sizes[0] > max(sizes[1:])
    assert sizes[0] < 1.1 * len(data) / jobs


def test_a_scan_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(REFERENCE.read_bytes() * 3)
    assert gc.isenabled()
    for jobs in ("1", "2"):
        assert CliRunner().invoke(app, ["scan", str(log), "-o", "json", "-j", jobs]).exit_code == 0
        assert gc.isenabled()
    gc.disable()
    try:
        scan_module._scan_range(str(log), 0, log.stat().st_size, last=True)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _big_log(tmp_path: Path) -> Path:
    log = tmp_path / "kern.log"
    log.write_bytes(REFERENCE.read_bytes() * 20)
    return log


def _in_workers(monkeypatch: pytest.MonkeyPatch, what: Callable[[str], object]) -> None:
    """The workers' ranges (all but the first) run ``what(path)`` instead of a scan."""
    scan_range = scan_module._scan_range

    def patched(path: str, begin: int, end: int, **kw: bool) -> object:
        return what(path) if begin else scan_range(path, begin, end, **kw)

    monkeypatch.setattr(scan_module, "_scan_range", patched)


def test_a_worker_s_exception_is_raised_by_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _big_log(tmp_path)

    def failing(path: str) -> object:
        raise PermissionError(13, "Permission denied", path)

    _in_workers(monkeypatch, failing)
    with pytest.raises(PermissionError, match="Permission denied"):
        scan_module.scan_file_json(str(log), 3)
    result = CliRunner().invoke(app, ["scan", str(log), "-o", "json", "-j", "2"])
    assert result.exit_code == 2
    assert "cannot read" in result.output and "Permission denied" in result.output
    assert "Traceback" not in result.output


def test_a_worker_that_dies_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _big_log(tmp_path)
    _in_workers(monkeypatch, lambda _path: os._exit(9))  # as the OOM killer would
    with pytest.raises(OSError, match="exited before it sent its summary"):
        scan_file_parallel(str(log), 2)


def test_the_workers_are_reaped_once_the_output_is_written(tmp_path: Path) -> None:
    log = _big_log(tmp_path)
    result = CliRunner().invoke(app, ["scan", str(log), "-o", "json", "-j", "3"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == json.loads(
        CliRunner().invoke(app, ["scan", str(log), "-o", "json", "-j", "1"]).stdout
    )
    assert scan_module._exiting == []
    assert multiprocessing.active_children() == []
    # A library caller's workers wait to be reaped (they exit on their own meanwhile).
    scan_module.scan_file_json(str(log), 2)
    assert len(scan_module._exiting) == 1
    scan_module.reap_workers()
    assert scan_module._exiting == [] and multiprocessing.active_children() == []


def test_a_file_emptied_after_it_was_split_has_no_findings(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"")
    r = scan_module._scan_range(str(log), 0, 4096, last=True)
    assert (r.matches, r.newlines) == ([], 0)
