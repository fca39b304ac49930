"""``gpufleet stacks`` and ``clusters create --stack`` against a real server with a
simulated fleet: the owner defines stacks, new clusters take the latest, a pinned one
keeps its own, and the simulated machines report the stack their cluster was made with."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli

pytestmark = pytest.mark.slow


def test_stacks_from_the_cli(tmp_path: Path) -> None:
    port, token_file = free_port(), tmp_path / "owner-token"
    env = fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=token_file)
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(url)
        token = token_file.read_text().strip()

        def cli(*args: str) -> str:
            done = run_cli(*args, url=url, token=token)
            assert done.returncode == 0, (args, done.stderr)
            return done.stdout

        cli("projects", "create", "ml")
        cli("stacks", "create", "gpu-2026.09", "--driver", "570.172.08", "--slurm", "24.05.8",
            "--latest")  # fmt: skip
        cli("stacks", "create", "gpu-2026.12", "--driver", "580.95.05", "--cuda", "12.9",
            "--os-image", "ubuntu-24.04-gpu-2026.12", "--notes", "driver 580")  # fmt: skip
        listed = cli("stacks", "list")
        assert "* gpu-2026.09" in " ".join(listed.split()) and "gpu-2026.12" in listed
        cli("stacks", "latest", "gpu-2026.12")
        shown = cli("stacks", "show", "gpu-2026.12")
        assert "580.95.05" in shown and "yes" in shown and "driver 580" in shown
        made = json.loads(
            cli(
                "clusters",
                "create",
                "train",
                "--project",
                "ml",
                "--size",
                "1",
                "--no-acceptance-tests",
                "--output",
                "json",
            )
        )
        assert made["stack"] == "gpu-2026.12"
        old = json.loads(
            cli(
                "clusters",
                "create",
                "old",
                "--project",
                "ml",
                "--size",
                "1",
                "--no-acceptance-tests",
                "--stack",
                "gpu-2026.09",
                "--output",
                "json",
            )
        )
        assert old["stack"] == "gpu-2026.09"

        deadline = time.monotonic() + 60
        while True:
            nodes = json.loads(cli("nodes", "list", "--cluster", "train", "--output", "json"))
            items = nodes["items"] if isinstance(nodes, dict) else nodes
            if items and items[0].get("software"):
                break
            assert time.monotonic() < deadline, server.output()[-2000:]
            time.sleep(0.5)  # real sleep: the server's simulated machines boot on its clock
        assert items[0]["software"]["driver"] == "580.95.05"
        node = cli("nodes", "show", items[0]["name"], "--cluster", "train")
        assert "driver 580.95.05" in node and "off its stack" not in node

        unknown = run_cli("clusters", "create", "x", "--project", "ml", "--size", "1",
                          "--stack", "gpu-1999", url=url, token=token)  # fmt: skip
        assert unknown.returncode != 0 and "gpu-1999" in unknown.stderr
        bad = run_cli("stacks", "create", "Bad Name", url=url, token=token)
        assert bad.returncode != 0 and "Traceback" not in bad.stderr
    finally:
        server.stop()
