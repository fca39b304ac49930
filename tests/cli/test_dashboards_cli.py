"""``gpufleet dashboards export DIR``: one JSON per dashboard, idempotent, exit 2 on a
folder it cannot write."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.dashboards.export import DASHBOARDS


def test_export_writes_each_dashboard_once(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dashboards"  # parents made
    result = CliRunner().invoke(app, ["dashboards", "export", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(out.iterdir())
    assert [f.name for f in files] == sorted(f"{s.uid}.json" for s in DASHBOARDS)
    assert result.output.split() == [str(out / f"{s.uid}.json") for s in DASHBOARDS]
    models = {f.name: json.loads(f.read_text()) for f in files}
    assert {m["uid"] for m in models.values()} == {s.uid for s in DASHBOARDS}

    before = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in files}
    again = CliRunner().invoke(app, ["dashboards", "export", str(out)])
    assert again.exit_code == 0, again.output
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.iterdir()} == before

    stale = out / "gpufleet-gpu.json"
    stale.write_text("{}")
    assert CliRunner().invoke(app, ["dashboards", "export", str(out)]).exit_code == 0
    assert json.loads(stale.read_text())["uid"] == "gpufleet-gpu"
    assert not list(out.glob(".*.tmp"))


def test_a_bad_directory_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    result = CliRunner().invoke(app, ["dashboards", "export", str(a_file)])
    assert result.exit_code == 2
    assert "itexistsandisnotadirectory" in "".join(result.output.split())
    assert a_file.read_text() == "x"

    below_a_file = a_file / "dashboards"
    result = CliRunner().invoke(app, ["dashboards", "export", str(below_a_file)])
    assert result.exit_code == 2
    said = "".join(result.output.split())  # rich wraps long lines, even inside a path
    assert "".join(f"cannot write dashboards to {below_a_file}: Not a directory".split()) in said
