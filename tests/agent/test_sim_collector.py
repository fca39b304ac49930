"""The agent's sim collector reads the simulator's telemetry model: its GPUs follow the
load on the node, into the agent's report (what the server stores) and its /metrics
(dcgm-exporter's series), the same readings by one path."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.collectors.sim import SimCollector
from gpufleet.agent.exporter import last_xid_from, render
from gpufleet.agent.main import build_agent
from gpufleet.agent.runtime import Agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.clock import FakeClock
from gpufleet.sim.load import IDLE, INFERENCE, TRAINING, NodeLoad, job_load


def make_agent(tmp_path: Path, collector: SimCollector, clock: FakeClock) -> Agent:
    settings = AgentSettings(state_dir=tmp_path, node_token="t", metrics_listen=None)  # type: ignore[arg-type]
    client = AgentClient(base_url="http://127.0.0.1:1", node_token="t")
    return build_agent(settings, client=client, collectors=[collector], sources=[], clock=clock)


def exported(agent: Agent, metric: str) -> dict[str, float]:
    """One GPU series of /metrics, by its ``gpu`` label."""
    text = render(agent, hostname="sim-001", last_xid=last_xid_from(agent))
    return {
        s.labels["gpu"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metric
    }


async def test_the_gpus_follow_the_load_into_the_report_and_metrics(tmp_path: Path) -> None:
    clock = FakeClock()
    load = NodeLoad(gpus={0: job_load("41", TRAINING), 1: job_load("42", INFERENCE)})
    collector = SimCollector(gpus=4, seed=3, load=lambda: load)
    agent = make_agent(tmp_path, collector, clock)
    for _ in range(30):  # five minutes of 10 s samples
        clock.advance(10)
        await agent.sample_once()
    report = {g.index: g for g in agent.report_once().gpus}
    assert report[0].utilization_pct >= 85.0 and report[0].temperature_c >= 60.0
    assert 30.0 <= report[1].utilization_pct <= 90.0
    for idle in (2, 3):
        assert report[idle].utilization_pct <= 1.0 and report[idle].temperature_c <= 40.0
        assert report[idle].power_w <= 90.0
    util = exported(agent, "DCGM_FI_DEV_GPU_UTIL")
    temp = exported(agent, "DCGM_FI_DEV_GPU_TEMP")
    assert util == {str(i): g.utilization_pct for i, g in report.items()}
    assert temp == {str(i): g.temperature_c for i, g in report.items()}

    # The job ends: utilisation drops at once, temperature over minutes.
    hot = report[0].temperature_c
    load = IDLE
    clock.advance(10)
    await agent.sample_once()
    assert exported(agent, "DCGM_FI_DEV_GPU_UTIL")["0"] <= 5.0
    assert hot - 8.0 < exported(agent, "DCGM_FI_DEV_GPU_TEMP")["0"] < hot


async def test_without_a_load_busy_decides(tmp_path: Path) -> None:
    clock = FakeClock()
    busy = make_agent(tmp_path / "busy", SimCollector(gpus=2, seed=1), clock)
    idle = make_agent(tmp_path / "idle", SimCollector(gpus=2, seed=1, busy=False), clock)
    for _ in range(3):
        clock.advance(10)
        await busy.sample_once()
        await idle.sample_once()
    assert all(u >= 85.0 for u in exported(busy, "DCGM_FI_DEV_GPU_UTIL").values())
    assert all(u <= 1.0 for u in exported(idle, "DCGM_FI_DEV_GPU_UTIL").values())
