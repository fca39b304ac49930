"""The agent's GPU state refresh on the real lab: Slurm's GPUs against the hardware's.

An in-process agent (``build_agent``) for a lab node, its "hardware" the sim collector's
GPUs, its Slurm view the real ``scontrol show node``; findings and events go to a real
HTTP server speaking the agent protocol (``tests/agent/recording_server.py``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.main import build_agent, build_collectors
from gpufleet.agent.runtime import Agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.testing.slurm_lab import SCRIPT, SlurmLab

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "recording_server", Path(__file__).resolve().parents[2] / "agent" / "recording_server.py"
)
assert _spec is not None and _spec.loader is not None
recording_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recording_server)
NODE = "lab-003"


@pytest.fixture
def slurm_env(slurm_lab: SlurmLab, monkeypatch: pytest.MonkeyPatch) -> SlurmLab:
    for name, value in slurm_lab.env().items():
        monkeypatch.setenv(name, value)  # what scontrol, slurmd and the lab script read
    return slurm_lab


@pytest.fixture
def server() -> Iterator[Any]:
    s = recording_server.RecordingServer()
    yield s
    s.down()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        yield client


def make_agent(
    server: Any, http: httpx.AsyncClient, state_dir: Path, *, gpus: int, **settings: object
) -> Agent:
    values: dict[str, object] = {
        "server_url": server.url,
        "node_token": "node-token",
        "hostname": NODE,
        "state_dir": state_dir,
        "collectors": ("sim", "slurm"),
        "sim_gpus": gpus,
        "metrics_listen": None,
        "gres_fix_command": (),  # report only, unless a test gives one
        **settings,
    }
    config = AgentSettings(**values)  # type: ignore[arg-type]
    collectors, sources = build_collectors(config)
    client = AgentClient(base_url=server.url, node_token="node-token", http=http)
    return build_agent(config, client=client, collectors=collectors, sources=sources)


async def sample_and_send(agent: Agent) -> None:
    await agent.sample_once()
    while await agent.sender.send_findings_once():
        pass
    while await agent.sender.send_events_once():
        pass


GPU_STATE_IDS = {
    "slurm-gres-more-than-hardware",
    "slurm-gres-fewer-than-hardware",
    "slurm-gres-type-mismatch",
}


def gres_findings(server: Any) -> list[dict[str, Any]]:
    """The GPU state refresh's findings (not Slurm's own gres/gpu drain reason)."""
    return [f for f in server.stored if f["signature_id"] in GPU_STATE_IDS]


def gpu_state_events(server: Any) -> list[dict[str, Any]]:
    return [e for e in server.events if e["kind"] == "node.gpu_state"]


async def test_more_gpus_in_slurm_than_hardware_is_a_finding(
    slurm_env: SlurmLab, server: Any, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    # The lab's slurm.conf gives lab-003 Gres=gpu:h100:8; this "hardware" has 6.
    agent = make_agent(server, http, tmp_path / "six", gpus=6)
    await sample_and_send(agent)
    [finding] = gres_findings(server)
    assert finding["signature_id"] == "slurm-gres-more-than-hardware"
    assert finding["severity"] == "critical" and finding["component"] == "slurm-gres-count-high"
    evidence = finding["evidence"]
    assert "Slurm offers 8 GPU(s); the node has 6" in evidence and "Gres=gpu:h100:8" in evidence
    [event] = gpu_state_events(server)
    assert event["data"]["slurm_gpus"] == 8 and event["data"]["hardware_gpus"] == 6

    # Matching hardware: no finding, no event.
    server.stored.clear()
    server.events.clear()
    same = make_agent(server, http, tmp_path / "eight", gpus=8)
    await sample_and_send(same)
    await sample_and_send(same)
    assert gres_findings(server) == [] and gpu_state_events(server) == []
    assert not [f for f in server.stored if f["signature_id"].startswith("slurm")]


def _gres_conf(lab: SlurmLab, *, short: str, gpus: int) -> str:
    lines = ["AutoDetect=off"]
    for node in lab.node_names:
        n = gpus if node == short else lab.gpus
        lines.append(f"NodeName={node} Name=gpu Type=h100 File={lab.dir}/dev/nvidia[0-{n - 1}]")
    return "\n".join(lines) + "\n"


def _node_text(lab: SlurmLab) -> str:
    return lab.run("scontrol", "show", "node", NODE).stdout


async def test_gpus_back_after_a_refused_registration_are_fixed_by_a_slurmd_restart(
    slurm_env: SlurmLab, server: Any, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """lab-003's slurmd starts while 2 of its 8 GPUs are missing (slurmctld refuses it:
    DRAIN+INVALID_REG, 6 < 8); the GPUs come back; the agent restarts slurmd."""
    lab = slurm_env
    conf = lab.dir / "etc" / "gres.conf"
    original = conf.read_text()
    try:
        conf.write_text(_gres_conf(lab, short=NODE, gpus=6))
        lab.kill_slurmd(NODE, signal.SIGTERM)
        lab.start_slurmd(NODE)
        conf.write_text(original)  # slurmd read it at start; the "GPUs" are back now
        lab.wait_until(
            lambda: "INVALID_REG" in _node_text(lab), timeout_s=20, what="registration refused"
        )
        assert "gres/gpu count reported lower than configured (6 < 8)" in _node_text(lab)

        restart = f"{SCRIPT} kill-slurmd {NODE} TERM && {SCRIPT} start-slurmd {NODE}"
        agent = make_agent(
            server, http, tmp_path / "agent", gpus=8, gres_fix_command=("bash", "-c", restart)
        )
        started = time.monotonic()
        while not any(e["message"].startswith("GPU state fixed") for e in server.events):
            assert time.monotonic() - started < 30, f"not fixed: {server.events}"
            await sample_and_send(agent)
            await asyncio.sleep(0.2)
        took = time.monotonic() - started
        text = _node_text(lab)
        assert "INVALID_REG" not in text
        ran = gpu_state_events(server)[0]
        assert ran["data"]["ok"] is True and "registers them again" in ran["message"]
        assert gres_findings(server) == []  # fixed before it was ever raised
        # Slurm's own drain stays (its reason is not gpufleet's): the agent leaves it, and
        # the catalog's finding for that reason stands until someone resumes the node
        assert "DRAIN" in text and "(6 < 8)" in text
        open_ids = {f.signature_id for f in agent.detector.open_findings()}
        assert "slurm-gres-gpu-count-low" in open_ids
        print(f"refused registration → slurmd restarted and registered 8 in {took:.1f} s")
    finally:
        conf.write_text(original)
        lab.start_slurmd(NODE)  # a no-op when it runs
        lab.run("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)
        lab.wait_for_node_state(NODE, "idle", timeout_s=30)
