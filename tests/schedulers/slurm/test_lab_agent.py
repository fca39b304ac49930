"""The node agent on the real lab: it restarts a killed or hung slurmd (and the node
returns to idle), and reports Slurm's GPUs disagreeing with the hardware."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from gpufleet.agent.main import build_agent, build_collectors
from gpufleet.agent.outbox import Outbox
from gpufleet.agent.runtime import Agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow

SLURMD = shutil.which("slurmd", path="/usr/sbin:/usr/bin:/sbin") or "slurmd"


def _agent(lab: SlurmLab, tmp_path: Path, node: str, **settings: object) -> Agent:
    values: dict[str, object] = {
        "hostname": node,
        "state_dir": tmp_path / "agent",
        "collectors": ("sim", "slurm", "daemons"),
        "metrics_listen": None,
        "slurmd_pidfile": lab.dir / "run" / f"slurmd-{node}.pid",
        "slurmd_start": (SLURMD, "-N", node),
        "munge_pidfile": None,
        "daemon_check_s": 0.2,
        "daemon_hang_s": 2.0,
        "daemon_backoff_initial_s": 1.0,
        **settings,
    }
    config = AgentSettings(**values)  # type: ignore[arg-type]
    collectors, sources = build_collectors(config)
    client = AgentClient(base_url="http://127.0.0.1:9", node_token="unused")  # never sent
    return build_agent(config, client=client, collectors=collectors, sources=sources)


async def _sample_until(agent: Agent, check: object, *, timeout_s: float, what: str) -> float:
    assert callable(check)
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        await agent.sample_once()
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def _slurmd_pid(lab: SlurmLab, node: str) -> int:
    return int((lab.dir / "run" / f"slurmd-{node}.pid").read_text())


@pytest.fixture
def slurm_env(slurm_lab: SlurmLab, monkeypatch: pytest.MonkeyPatch) -> SlurmLab:
    for name, value in slurm_lab.env().items():
        monkeypatch.setenv(name, value)  # what scontrol and slurmd on the node read
    return slurm_lab


@pytest.mark.parametrize("how", ["killed", "hung"])
async def test_agent_restarts_slurmd_and_the_node_returns_to_idle(
    slurm_env: SlurmLab, tmp_path: Path, how: str
) -> None:
    lab = slurm_env
    agent = _agent(lab, tmp_path, "lab-002")
    await agent.sample_once()  # sees slurmd up
    old = _slurmd_pid(lab, "lab-002")
    # a crash leaves its pid file behind (the lab's own kill-slurmd tidies it away)
    os.kill(old, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    try:
        took = await _sample_until(
            agent, lambda: Outbox(tmp_path / "agent").depth() >= 1, timeout_s=30,
            what="slurmd restarted",
        )  # fmt: skip
        [(_, event)] = Outbox(tmp_path / "agent").pending(5)
        assert event.kind.value == "node.daemon" and event.data["daemon"] == "slurmd"
        assert ("hung" if how == "hung" else "dead") in event.message
        assert _slurmd_pid(lab, "lab-002") != old
        back = time.monotonic()
        lab.wait_for_node_state("lab-002", "idle", timeout_s=30)
        print(
            f"slurmd {how} → restarted in {took:.1f} s, idle {time.monotonic() - back:.1f} s later"
        )
        assert not [f for f in agent.detector.open_findings() if "keeps-dying" in f.signature_id]
    finally:
        if how == "hung":
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, signal.SIGCONT)
                os.kill(old, signal.SIGKILL)
        if lab.node_states().get("lab-002", "").endswith("*"):
            lab.start_slurmd("lab-002")
        lab.wait_for_node_state("lab-002", "idle", timeout_s=40)


async def test_gres_mismatch_is_a_finding(slurm_env: SlurmLab, tmp_path: Path) -> None:
    lab = slurm_env
    # The lab's slurm.conf gives lab-003 Gres=gpu:h100:8; this "hardware" has 6.
    agent = _agent(lab, tmp_path, "lab-003", sim_gpus=6, collectors=("sim", "slurm"))
    await agent.sample_once()
    [finding] = [
        f for f in agent.detector.open_findings() if f.signature_id.startswith("slurm-gres")
    ]
    assert finding.signature_id == "slurm-gres-more-than-hardware"
    assert "Slurm offers 8" in finding.evidence and "the node has 6" in finding.evidence
    assert "gpu:h100:8" in finding.evidence
    [(_, event)] = Outbox(tmp_path / "agent").pending(5)
    assert event.kind.value == "node.gpu_state" and event.data["hardware_gpus"] == 6

    # Matching hardware: nothing.
    same = _agent(lab, tmp_path / "b", "lab-003", sim_gpus=8, collectors=("sim", "slurm"))
    await same.sample_once()
    assert not [f for f in same.detector.open_findings() if f.signature_id.startswith("slurm")]
