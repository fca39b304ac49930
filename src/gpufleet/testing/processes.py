"""Real server and agent processes for tests that kill and restart them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

RUN_CLI = "from gpufleet.cli.main import run; run()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fast_sim_server_env(*, data_dir: Path, port: int, token_file: Path) -> dict[str, str]:
    """``gpufleet server`` settings for a sim fleet that moves in seconds: quick boots and
    reboots, no background jobs or faults (a drain is over at once), fast loops, and loop
    leases of 5 s (a server restarted after a crash waits for its dead self's leases to
    expire before its loops run: 15 s by default)."""
    return {
        "GPUFLEET_DATA_DIR": str(data_dir),
        "GPUFLEET_DATABASE_URL": "",
        "GPUFLEET_PORT": str(port),
        "GPUFLEET_BOOTSTRAP_TOKEN_FILE": str(token_file),
        "GPUFLEET_ANNOUNCE_BOOTSTRAP_TOKEN": "false",
        "GPUFLEET_SIM_AGENTS": "true",
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[0.5, 1.0]",
        "GPUFLEET_SIM_REBOOT_DELAY_S": "[1.0, 1.0]",
        "GPUFLEET_SIM_BUSY_SHARE": "[0.0, 0.0]",
        "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
        "GPUFLEET_REPAIR_INTERVAL_S": "0.3",
        "GPUFLEET_CHECK_INTERVAL_S": "0.3",
        "GPUFLEET_AUTOSCALE_INTERVAL_S": "0.3",
        "GPUFLEET_REPORT_INTERVAL_S": "0.5",
        "GPUFLEET_LEASE_TTL_S": "5",
    }


class CliProcess:
    """``gpufleet <args>`` in a child process, with its output in a log file."""

    def __init__(self, *, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = args
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUN_CLI, *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush; the hardest crash there is."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class ServerProcess(CliProcess):
    """``gpufleet server`` (or ``demo``) in a child process."""

    def wait_ready(self, url: str, *, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout_s} s:\n{self.output()}")


class AgentProcess(CliProcess):
    """The real node agent, ``gpufleet agent``, in a child process.

    It follows ``kernel_log`` (a file, as on a node whose kernel log goes to syslog),
    keeps its spool and log offsets in ``state_dir`` and takes every other setting from
    ``GPUFLEET_AGENT_*`` in ``env``. Fast retries and a 1 s report interval by default,
    so tests that take the server away see it come back within a second or two.
    """

    def __init__(
        self,
        *,
        server_url: str,
        node_token: str,
        state_dir: Path,
        kernel_log: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        token_file = state_dir.parent / f"{state_dir.name}.token"
        token_file.write_text(node_token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        self.token_file = token_file
        self.state_dir = state_dir
        self.kernel_log = kernel_log
        defaults = {
            "GPUFLEET_AGENT_SERVER_URL": server_url,
            "GPUFLEET_AGENT_NODE_TOKEN_FILE": str(token_file),
            "GPUFLEET_AGENT_STATE_DIR": str(state_dir),
            "GPUFLEET_AGENT_KERNEL_LOG": f"file:{kernel_log}",
            "GPUFLEET_AGENT_COLLECTORS": '["sim", "kmsg"]',
            "GPUFLEET_AGENT_METRICS_LISTEN": "",
            "GPUFLEET_AGENT_REPORT_INTERVAL_S": "1",
            "GPUFLEET_AGENT_RETRY_INITIAL_S": "0.2",
            "GPUFLEET_AGENT_RETRY_MAX_S": "1",
            "GPUFLEET_AGENT_REQUEST_TIMEOUT_S": "5",
        }
        super().__init__(args=["agent"], env={**defaults, **(env or {})}, log_path=log_path)

    def token(self) -> str:
        """The node token the agent runs with: given, or got by enrolling ("" before)."""
        return self.token_file.read_text(encoding="utf-8").strip()

    def log_offset(self) -> int | None:
        """Bytes of the followed log the agent has matched and spooled (its checkpoint)."""
        try:
            state = json.loads((self.state_dir / "kernel-log-file.json").read_text())
        except (OSError, ValueError):
            return None
        return int(state["offset"])

    def wait_caught_up(self, *, timeout_s: float = 10.0) -> None:
        """Until every line written to the followed log so far is matched and spooled."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.output()}")
            size = self.kernel_log.stat().st_size if self.kernel_log.exists() else 0
            if self.log_offset() == size:
                return
            time.sleep(0.05)
        raise TimeoutError(
            f"agent at {self.log_offset()} of {self.kernel_log} after {timeout_s} s:\n"
            + self.output()[-4000:]
        )


def printed_value(proc: CliProcess, name: str, *, timeout_s: float = 30) -> str:
    """The value of a ``NAME=value`` line the process printed (e.g. GPUFLEET_TOKEN)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(rf"^{name}=(\S+)$", proc.output(), re.MULTILINE)
        if match:
            return match.group(1)
        time.sleep(0.1)
    raise AssertionError(f"{name} not printed within {timeout_s} s:\n{proc.output()}")


def run_cli(*args: str, url: str, token: str) -> subprocess.CompletedProcess[str]:
    """``gpufleet ARGS`` as a user runs it, against ``url`` with ``token``."""
    env = {**os.environ, "GPUFLEET_URL": url, "GPUFLEET_TOKEN": token}
    # Output to a pipe, as `gpufleet ... | grep` sees it: the CLI's pipe width, not a
    # terminal's width some test runner left in COLUMNS (pytest-xdist workers have one).
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return subprocess.run(
        [sys.executable, "-c", RUN_CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
