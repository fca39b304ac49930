"""``gpufleet scan``: a saved kernel log in, findings out; no server involved."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app

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
