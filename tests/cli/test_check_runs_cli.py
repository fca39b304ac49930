"""``gpufleet checks run | list | show | output | cancel`` end to end: a real ``gpufleet
server`` process with a simulated fleet whose agents run the sim's check tools, driven
only through the CLI as a person would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpufleet.testing.processes import RUN_CLI, ServerProcess, fast_sim_server_env, free_port

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Fleet:
    url: str
    token: str

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "GPUFLEET_URL": self.url,
            "GPUFLEET_TOKEN": self.token,
            "COLUMNS": "250",
        }
        return subprocess.run(
            [sys.executable, "-c", RUN_CLI, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def ok(self, *args: str) -> str:
        done = self.cli(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--output", "json"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("checks-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file)
    env["GPUFLEET_CHECK_INTERVAL_S"] = "0.3"
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    server.start()
    try:
        server.wait_ready(url)
        fleet = Fleet(url=url, token=token_file.read_text().strip())
        fleet.ok("projects", "create", "ml")
        fleet.ok(
            "clusters", "create", "c1", "--project", "ml", "--size", "2", "--no-acceptance-tests"
        )
        deadline = time.monotonic() + 60
        while True:
            nodes = fleet.json("nodes", "list", "--cluster", "c1")["items"]
            if len(nodes) == 2 and all(n["state"] == "in_service" for n in nodes):
                break
            assert time.monotonic() < deadline, nodes
            time.sleep(0.3)
        yield fleet
    finally:
        server.stop()


def test_run_wait_show_list_and_output(fleet: Fleet) -> None:
    started = time.monotonic()
    done = fleet.cli(
        "checks",
        "run",
        "--cluster",
        "c1",
        "--check",
        "dcgm-diag",
        "--level",
        "1",
        "--nodes",
        "c1-000",
        "--wait",
        "--output",
        "json",
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout, done.stderr)
    run = json.loads(done.stdout)
    assert (run["status"], run["outcome"], run["backend"]) == ("passed", "pass", "agent")
    [verdict] = run["result"]["nodes"].values()
    assert verdict["name"] == "c1-000" and verdict["figures"]["gpus"] == 8
    table = fleet.ok("checks", "show", run["id"])
    assert "Verdict per node" in table and "c1-000" in table and "passed" in table
    listed = fleet.json("checks", "list", "--cluster", "c1")["items"]
    assert run["id"] in [r["id"] for r in listed]
    output = fleet.ok("checks", "output", run["id"])
    assert '"DCGM Diagnostic"' in output
    print(f"\nsim (real clock): `checks run --wait` dcgm-diag -r 1 → result in {took:.1f} s")


def test_a_failed_check_exits_1_and_names_the_gpu(fleet: Fleet) -> None:
    fleet.ok(
        "inject",
        "--node",
        "c1-001",
        "--cluster",
        "c1",
        "--signature",
        "row-remap-pending",
        "--gpu",
        "2",
    )
    done = fleet.cli(
        "checks",
        "run",
        "-c",
        "c1",
        "--check",
        "dcgm-diag",
        "--level",
        "1",
        "--nodes",
        "c1-001",
        "--wait",
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "failed" in done.stdout and "c1-001" in done.stdout
    assert "GPU 2" in done.stdout


def test_bad_input_and_cancel(fleet: Fleet) -> None:
    bad = fleet.cli("checks", "run", "-c", "c1", "--check", "dcgm-diag", "--nodes", "nosuch")
    assert bad.returncode == 2 and "no node 'nosuch'" in bad.stderr
    unknown = fleet.cli("checks", "run", "-c", "c1", "--check", "memtest")
    assert unknown.returncode == 2
    run = fleet.json(
        "checks",
        "run",
        "-c",
        "c1",
        "--check",
        "gpu-burn",
        "--param",
        "duration_s=600",
        "--nodes",
        "c1-000",
    )
    cancelled = fleet.json("checks", "cancel", run["id"])
    assert cancelled["status"] in ("cancelled", "running")
    deadline = time.monotonic() + 30
    while fleet.json("checks", "show", run["id"])["status"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.3)
