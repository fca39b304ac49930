"""``gpufleet clusters migrate`` and ``gpufleet rollouts`` against a real server with a
simulated fleet: a two-node cluster moves to a new stack in a window open now, the
rollout is listed and shown node by node, the cluster ends on the new stack; bad windows
and pacing are refused before anything is sent, and a finished rollout refuses changes
with the server's reason."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli

pytestmark = pytest.mark.slow

OLD, NEW = "gpu-2026.09", "gpu-2026.12"


def _flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def test_migrate_a_cluster_and_follow_its_rollout(tmp_path: Path) -> None:
    port, token_file = free_port(), tmp_path / "owner-token"
    env = fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=token_file)
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(url)
        token = token_file.read_text().strip()

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return run_cli(*args, url=url, token=token)

        def cli(*args: str) -> str:
            done = run(*args)
            assert done.returncode == 0, (args, done.stderr)
            return done.stdout

        def cli_json(*args: str) -> Any:
            return json.loads(cli(*args, "--output", "json"))

        cli("projects", "create", "ml")
        # A reinstalled node reports clean for 30 s by default before it counts as done;
        # 2 s here (the sim agents report every 0.5 s) keeps the test short.
        cli("repairs", "policy", "set", "--project", "ml", "--verify-settle-s", "2")
        cli("stacks", "create", OLD, "--driver", "570.172.08", "--latest")
        cli("stacks", "create", NEW, "--driver", "580.95.05", "--cuda", "12.9")
        made = cli_json("clusters", "create", "train", "--project", "ml", "--size", "2",
                        "--no-acceptance-tests")  # fmt: skip
        assert made["stack"] == OLD
        deadline = time.monotonic() + 30
        while cli_json("clusters", "show", "train")["status"] != "ready":
            assert time.monotonic() < deadline, server.output()[-2000:]
            time.sleep(0.3)  # real sleep: the server's simulated machines boot on its clock

        # Refused here, before anything is sent: exit 2 naming what is accepted.
        someday = run("clusters", "migrate", "train", "--to", NEW, "--window", "someday")
        said = _flat(someday.stderr)
        assert someday.returncode == 2, someday.stderr
        assert "'someday'" in said and "sat 02:00/4h" in said and "daily 01:00/90m" in said
        none_out = run("clusters", "migrate", "train", "--to", NEW, "--window", "daily 01:00/2h",
                       "--max-unavailable", "0")  # fmt: skip
        assert none_out.returncode == 2 and "max unavailable '0'" in _flat(none_out.stderr)
        assert "Traceback" not in someday.stderr + none_out.stderr
        assert cli_json("rollouts", "list", "--cluster", "train") == []

        # A daily window that opened a minute ago: the nodes move now.
        opened = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        window = f"daily {opened:%H:%M}/2h"
        printed = _flat(cli("clusters", "migrate", "train", "--to", NEW, "--window", window,
                            "--reason", "driver 580"))  # fmt: skip
        assert f"{OLD} -> {NEW}" in printed and f"daily {opened:%H:%M} for 2h (UTC)" in printed
        assert "open now" in printed and "nodes 2" in printed
        [listed] = cli_json("rollouts", "list", "--cluster", "train")
        rollout_id = listed["id"]
        assert rollout_id in printed

        deadline = time.monotonic() + 120
        while (shown := cli_json("rollouts", "show", rollout_id))["status"] != "succeeded":
            assert shown["status"] in ("scheduled", "running"), shown
            assert time.monotonic() < deadline, (shown, server.output()[-2000:])
            time.sleep(0.5)  # real sleep: the server's loops move the nodes on its clock
        assert shown["counts"] == {"done": 2} and shown["failures"] == 0

        table = cli("rollouts", "list", "--cluster", "train")
        assert rollout_id in table and "succeeded" in table and "done 2" in _flat(table)
        detail = cli("rollouts", "show", rollout_id)
        for header in ("NODE", "STATUS", "REPAIR", "REPAIR STATUS", "ATTEMPTS", "DETAIL"):
            assert header in detail
        rows = {line.split()[0]: line.split() for line in detail.splitlines() if line.strip()}
        assert rows["train-000"][1] == "done" and rows["train-001"][1] == "done", detail
        assert cli_json("clusters", "show", "train")["stack"] == NEW

        # A finished rollout: exit 2 with the server's reason (409), nothing changed.
        for args in (
            ("pause", rollout_id, "--reason", "too late"),
            ("rollback", rollout_id, "train-000"),
        ):
            refused = run("rollouts", *args)
            assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
            assert f"rollout {rollout_id} is succeeded" in _flat(refused.stderr), refused.stderr
        assert cli_json("rollouts", "show", rollout_id)["status"] == "succeeded"
    finally:
        server.stop()
