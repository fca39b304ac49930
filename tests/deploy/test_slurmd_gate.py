"""deploy/systemd/slurmd-gpufleet-acceptance.conf: the drop-in that keeps a cloud node's
slurmd from starting before gpufleet accepted the machine. Its ExecStartPre runs here
as systemd would run it (``/bin/sh -c``), against a node-state file the test writes as
the agent does (tests/server/test_agent_node_state.py shows the agent writing it)."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

DROP_IN = Path(__file__).parents[2] / "deploy" / "systemd" / "slurmd-gpufleet-acceptance.conf"
AGENT_FILE = "/var/lib/gpufleet-agent/node-state"


def _sections() -> dict[str, dict[str, str]]:
    """systemd's unit syntax: sections, ``key=value``, a trailing backslash joins lines."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    logical = ""
    for raw in DROP_IN.read_text().splitlines():
        if not logical and (not raw.strip() or raw.lstrip().startswith(("#", ";"))):
            continue
        if raw.endswith("\\"):
            logical += raw[:-1] + " "
            continue
        line, logical = logical + raw, ""
        if line.startswith("["):
            current = sections.setdefault(line.strip("[] "), {})
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def _gate(state_file: Path) -> list[str]:
    command = _sections()["Service"]["ExecStartPre"]
    assert AGENT_FILE in command  # the agent's default state dir (gpufleet-agent.service)
    return shlex.split(command.replace(AGENT_FILE, str(state_file)))


def test_the_drop_in_orders_slurmd_after_the_agent() -> None:
    sections = _sections()
    assert sections["Unit"]["After"] == sections["Unit"]["Wants"] == "gpufleet-agent.service"
    assert int(sections["Service"]["TimeoutStartSec"]) > 0
    assert _gate(Path("/x"))[:2] == ["/bin/sh", "-c"]


def test_slurmd_waits_for_in_service(tmp_path: Path) -> None:
    state = tmp_path / "node-state"
    gate = subprocess.Popen(_gate(state), stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert gate.poll() is None  # no file yet (the agent has not heard from gpufleet)
        state.write_text("acceptance\n")
        time.sleep(2.5)
        assert gate.poll() is None  # still being tested
        state.write_text("in_service\n")
        assert gate.wait(timeout=5) == 0
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()


def test_slurmd_does_not_start_on_a_machine_that_failed(tmp_path: Path) -> None:
    state = tmp_path / "node-state"
    state.write_text("cordoned\n")
    gate = subprocess.run(_gate(state), capture_output=True, text=True, timeout=10)
    assert gate.returncode == 1
    assert "gpufleet: node is cordoned; slurmd not started" in gate.stderr
