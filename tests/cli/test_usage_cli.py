"""`gpufleet usage gpu-hours` against a real server whose sim users keep jobs running."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli

pytestmark = pytest.mark.slow


def test_usage_reports_gpu_hours_of_finished_jobs(tmp_path: Path) -> None:
    port = free_port()
    token_file = tmp_path / "owner-token"
    env = {
        **fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=token_file),
        # Busy nodes and jobs of a few seconds: accounting has rows within seconds.
        "GPUFLEET_SIM_BUSY_SHARE": "[1.0, 1.0]",
        "GPUFLEET_SIM_JOB_MINUTES": "[0.02, 0.05]",
        "GPUFLEET_ACCOUNTING_INTERVAL_S": "0.5",
    }
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    server.start()
    try:
        server.wait_ready(url)
        token = token_file.read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        created = api.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "c1", "size": 2, "acceptance_tests": False},
        )
        assert created.status_code == 201, created.text
        deadline = time.monotonic() + 60
        while True:
            out = run_cli(
                "usage", "gpu-hours", "--by", "project", "--by", "user", "--output", "json",
                url=url, token=token,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            if report["jobs"] >= 2:
                break
            assert time.monotonic() < deadline, f"no usage: {report}\n{server.output()[-2000:]}"
            time.sleep(1.0)
        assert report["group_by"] == ["project", "user"]
        assert all(r["project"] == "ml" and r["gpu_hours"] > 0 for r in report["rows"])
        table = run_cli("usage", "gpu-hours", "--by", "day", url=url, token=token)
        assert table.returncode == 0 and "GPU-HOURS" in table.stdout and "total" in table.stdout
        bad = run_cli("usage", "gpu-hours", "--by", "planet", url=url, token=token)
        assert bad.returncode == 2
    finally:
        server.stop()
