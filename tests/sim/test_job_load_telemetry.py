"""The sim's jobs drive its telemetry: GPUs a job uses warm up, draw power, fill memory
and run near the job's level; their fabric ports move traffic; the rest idle. Faults
still override the load. All on a fake clock, a step per report interval."""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core.agent_protocol import GpuSample, NodeReport
from gpufleet.core.clock import FakeClock
from gpufleet.core.gpu_models import GPU_MODELS
from gpufleet.server.services.telemetry_history import nodes_now
from gpufleet.sim.fabric import STATE_ACTIVE, STATE_DOWN, IbPortTelemetry
from gpufleet.sim.faults import FaultConfig, hca_index
from gpufleet.sim.load import IDLE, INFERENCE, TRAINING, profile_for
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.reports import NodeSampler
from gpufleet.sim.workload import WorkloadConfig
from gpufleet.sim.world import SimWorld
from gpufleet.testing.databases import SqliteTemplate
from gpufleet.testing.fleet import sim_fleet

H100 = GPU_MODELS["NVIDIA H100 80GB HBM3"]
STEP_S = 10.0  # the agents' report interval
GIB = 1024.0


@dataclass
class Fleet:
    """A quiet world (no synthetic jobs, no background faults) of 8-GPU nodes, each with
    the sampler its simulated agent reports from, moved a report interval at a time."""

    clock: FakeClock
    world: SimWorld
    ids: list[str]
    samplers: dict[str, NodeSampler] = field(default_factory=dict)
    reports: dict[str, list[NodeReport]] = field(default_factory=dict)
    ports: dict[str, list[tuple[IbPortTelemetry, ...]]] = field(default_factory=dict)

    def step(self, n: int = 1) -> None:
        """``n`` report intervals: the world moves, then every node samples what runs."""
        for _ in range(n):
            self.clock.advance(STEP_S)
            self.world.advance()
            loads = self.world.node_loads()
            faults = self.world.active_faults()
            for iid, sampler in self.samplers.items():
                report = sampler.sample(load=loads.get(iid, IDLE), faults=faults.get(iid, ()))
                self.reports[iid].append(report)
                self.ports[iid].append(sampler.ports)

    def gpus(self, node: int) -> dict[int, GpuSample]:
        """The node's GPUs in its last report, by index."""
        return {g.index: g for g in self.reports[self.ids[node]][-1].gpus}

    def series(self, node: int, gpu: int, reading: str) -> list[float]:
        """One reading of one GPU over every report so far."""
        return [
            float(getattr(g, reading))
            for r in self.reports[self.ids[node]]
            for g in r.gpus
            if g.index == gpu
        ]

    def xmit_gbps(self, node: int, *, steps: int, port: int | None = None) -> float:
        """Mean transmit rate, Gb/s per port, over the last ``steps`` samples."""
        history = self.ports[self.ids[node]]
        first, last = history[-steps - 1], history[-1]
        pairs = list(zip(first, last, strict=True))
        if port is not None:
            pairs = [pairs[port]]
        words = sum(b.port_xmit_data - a.port_xmit_data for a, b in pairs) / len(pairs)
        return words * 4 * 8 / (steps * STEP_S) / 1e9

    def submit(
        self,
        *,
        name: str,
        duration_s: float = 3600.0,
        gpus: int | None = None,
        node_count: int | None = None,
    ) -> str:
        job = self.world.submit_job(
            "c1", duration_s=duration_s, name=name, gpus=gpus, node_count=node_count
        )
        return job.job_id


def make_fleet(nodes: int = 4, *, seed: int = 11) -> Fleet:
    clock = FakeClock()
    world = SimWorld(
        None,
        clock=clock,
        seed=seed,
        workload=WorkloadConfig(busy_share=(0.0, 0.0)),
        faults=FaultConfig(rate_per_gpu_day=0.0),
    )
    ids = [
        world.provision(
            SimInstanceSpec(f"ct-{i}", "c1", f"c1-{i:03d}", H100.name, 8),
            plan=BootPlan((5.0, 5.0)),
        ).instance_id
        for i in range(nodes)
    ]
    clock.advance(6)
    fleet = Fleet(clock=clock, world=world, ids=ids)
    for i, instance in enumerate(world.list_instances()):
        fleet.samplers[instance.instance_id] = NodeSampler(
            instance,
            clock=clock,
            rng=random.Random(seed * 100 + i),
            seconds=lambda: clock.now().timestamp(),
        )
        fleet.reports[instance.instance_id] = []
        fleet.ports[instance.instance_id] = []
    fleet.step()  # every node reports once, idle
    return fleet


def assert_idle(gpu: GpuSample) -> None:
    assert gpu.utilization_pct <= 1.0, gpu
    assert gpu.memory_used_mib < GIB, gpu
    assert H100.idle_power_w * 0.9 <= gpu.power_w <= 90.0, gpu
    assert gpu.temperature_c <= 40.0, gpu
    assert gpu.sm_clock_mhz <= H100.idle_sm_clock_mhz + 50, gpu


def test_a_job_on_some_gpus_warms_them_while_the_rest_of_the_node_and_idle_nodes_idle() -> None:
    fleet = make_fleet()
    # Three GPUs of one 8-GPU node: it takes the whole node but loads only those.
    fleet.submit(name="pretrain", gpus=3)
    fleet.step(30)  # five minutes: temperature takes a few time constants
    node = fleet.gpus(0)
    for index in range(3):
        gpu = node[index]
        assert 85.0 <= gpu.utilization_pct <= 100.0, gpu
        assert 0.75 * H100.memory_mib <= gpu.memory_used_mib <= 0.96 * H100.memory_mib, gpu
        assert 450.0 <= gpu.power_w <= H100.power_limit_w, gpu
        assert gpu.sm_clock_mhz >= H100.max_sm_clock_mhz - 100, gpu
        assert 60.0 <= gpu.temperature_c <= 80.0, gpu
        # Warmed gradually: a thermal time constant, not a jump to the steady state.
        temps = fleet.series(0, index, "temperature_c")
        assert temps[1] < 50.0 < temps[-1]
        assert all(b - a < 8.0 for a, b in itertools.pairwise(temps))
    for index in range(3, 8):
        assert_idle(node[index])
    for other in (1, 2, 3):
        for gpu in fleet.gpus(other).values():
            assert_idle(gpu)


def test_the_job_kind_sets_the_level_training_steady_inference_in_bursts() -> None:
    fleet = make_fleet(nodes=2)
    assert profile_for("pretrain") is TRAINING and profile_for("inf-12") is INFERENCE
    fleet.submit(name="pretrain", node_count=1)
    fleet.submit(name="inf-12", node_count=1)
    fleet.step(60)
    training = [u for g in range(8) for u in fleet.series(0, g, "utilization_pct")[3:]]
    inference = [u for g in range(8) for u in fleet.series(1, g, "utilization_pct")[3:]]
    assert min(training) >= 85.0 and statistics.pstdev(training) < 4.0
    assert min(inference) >= 28.0 and max(inference) <= 90.0
    assert statistics.pstdev(inference) > 8.0  # bursts, not one level
    # One level per job: a training job's GPUs run in lockstep.
    means = [statistics.fmean(fleet.series(0, g, "utilization_pct")[3:]) for g in range(8)]
    assert max(means) - min(means) < 3.0
    # Serving holds less memory than training and draws less power on average.
    assert fleet.gpus(1)[0].memory_used_mib < fleet.gpus(0)[0].memory_used_mib
    assert statistics.fmean(fleet.series(1, 0, "power_w")[3:]) < statistics.fmean(
        fleet.series(0, 0, "power_w")[3:]
    )


def test_ib_counters_grow_with_a_multi_node_job_and_barely_on_an_idle_node() -> None:
    fleet = make_fleet()
    fleet.submit(name="pretrain", node_count=2)  # nodes 0 and 1
    fleet.submit(name="pretrain", node_count=1)  # node 2, alone
    fleet.step(12)
    multi, single, idle = (fleet.xmit_gbps(n, steps=10) for n in (0, 2, 3))
    # All-reduce over NDR rails: a good share of the 400 Gb/s line rate, every rail.
    assert 100.0 <= multi <= 400.0
    assert fleet.xmit_gbps(1, steps=10) >= 100.0
    assert single < 2.0 and single > 100 * idle
    assert idle < 0.001  # subnet management only
    for ports in (fleet.ports[fleet.ids[0]][-1], fleet.ports[fleet.ids[3]][-1]):
        for port in ports:
            assert port.state == STATE_ACTIVE and port.rate_gbps == 400.0
            assert port.port_rcv_data > 0 and port.port_xmit_packets > 0
    # Receive follows transmit: a ring sends what it receives.
    first, last = fleet.ports[fleet.ids[0]][-11], fleet.ports[fleet.ids[0]][-1]
    sent = sum(b.port_xmit_data - a.port_xmit_data for a, b in zip(first, last, strict=True))
    received = sum(b.port_rcv_data - a.port_rcv_data for a, b in zip(first, last, strict=True))
    assert 0.9 < received / sent < 1.1


def test_ending_the_job_brings_readings_down_and_temperature_decays_gradually() -> None:
    fleet = make_fleet(nodes=2)
    fleet.submit(name="pretrain", node_count=2, duration_s=600.0)
    fleet.step(90)  # the job ends after 600 s, the fleet runs on five minutes more
    ended = next(
        i
        for i, report in enumerate(fleet.reports[fleet.ids[0]])
        if report.gpus[0].utilization_pct < 10.0 and i > 5
    )
    temps = fleet.series(0, 0, "temperature_c")
    hot = temps[ended - 1]
    assert hot >= 60.0
    after = fleet.reports[fleet.ids[0]][ended + 1 :]
    for report in after:
        for gpu in report.gpus:
            assert gpu.utilization_pct <= 1.0
            assert gpu.memory_used_mib < GIB
            assert gpu.power_w <= 90.0
    # Cooling takes minutes: a minute after the job still warm, five minutes after cool.
    assert temps[ended] > hot - 8.0
    assert temps[ended + 6] > 42.0
    assert temps[-1] < 40.0
    assert all(b - a < 1.0 for a, b in itertools.pairwise(temps[ended:]))
    # The fabric goes quiet too.
    assert fleet.xmit_gbps(0, steps=10) < 0.001


def test_faults_override_the_load_where_they_apply() -> None:
    fleet = make_fleet(nodes=3)
    fleet.submit(name="pretrain", node_count=2)  # nodes 0 and 1
    fleet.step(20)
    busy, idle = fleet.ids[0], fleet.ids[2]
    fleet.world.inject_fault(busy, signature_id="thermal-slowdown", gpu_index=1)
    fleet.world.inject_fault(idle, signature_id="thermal-slowdown", gpu_index=2)
    fleet.world.inject_fault(busy, signature_id="xid-79", gpu_index=5)
    link = fleet.world.inject_fault(busy, signature_id="ib-link-down")
    fleet.step(12)
    gpus = fleet.gpus(0)
    # A thermal fault heats and throttles, loaded or not.
    assert gpus[1].temperature_c >= 89.0
    assert gpus[1].sm_clock_mhz <= H100.max_sm_clock_mhz / 2
    assert fleet.gpus(2)[2].temperature_c >= 89.0
    # A GPU off the bus is missing; the job's other GPUs still run.
    assert 5 not in gpus
    assert all(gpus[i].utilization_pct >= 85.0 for i in (0, 2, 3, 4, 6, 7))
    # The link that went down moves nothing and counted one drop; the other rails work.
    down = hca_index(link, nics=8)
    ports = fleet.ports[busy][-1]
    assert ports[down].state == STATE_DOWN and ports[down].phys_state != 5
    assert ports[down].link_downed == 1
    assert fleet.xmit_gbps(0, steps=10, port=down) == 0.0
    others = [p for p in range(8) if p != down]
    assert all(fleet.xmit_gbps(0, steps=10, port=p) > 50.0 for p in others)
    # Cleared, the link comes back and carries the job's traffic again.
    fleet.world.clear_fault(busy, signature_id="ib-link-down")
    fleet.step(3)
    assert fleet.ports[busy][-1][down].state == STATE_ACTIVE
    assert fleet.xmit_gbps(0, steps=2, port=down) > 50.0


def test_the_same_seed_gives_the_same_telemetry() -> None:
    def run() -> list[object]:
        fleet = make_fleet(nodes=3, seed=5)
        fleet.submit(name="inf-3", gpus=2)
        fleet.submit(name="sft", node_count=2)
        fleet.step(20)
        return [
            (report.gpus, fleet.ports[iid][i])
            for iid in fleet.ids
            for i, report in enumerate(fleet.reports[iid])
        ]

    assert run() == run()


async def test_the_server_stores_what_the_jobs_put_on_the_gpus(
    sqlite_template: SqliteTemplate, tmp_path: Path
) -> None:
    """Through the simulated agents' real path: reports over the agent API, the GPU rows
    the server keeps, and the per-node summary the console's Utilization tab ranks."""
    url = sqlite_template.clone(tmp_path / "db")
    async with sim_fleet(url, tmp_path, size=3, step_s=STEP_S) as fleet:
        job = fleet.world.submit_job(fleet.cluster_id, gpus=4, name="pretrain", duration_s=3600)
        for _ in range(6):
            await fleet.tick()
        (running,) = fleet.world.running_jobs()
        assert running.job_id == job.job_id
        (busy,) = running.nodes
        listed = await fleet.get("/api/v1/nodes", cluster=fleet.cluster_id, gpus="true")
        for node in listed["items"]:
            utils = {g["index"]: g["utilization_pct"] for g in node["gpus"]}
            assert len(utils) == 8
            used = range(4) if node["name"] == busy else range(0)
            assert all(utils[i] >= 85.0 for i in used), (node["name"], utils)
            assert all(utils[i] <= 1.0 for i in range(8) if i not in used), (node["name"], utils)
        async with fleet.app.ctx.db.session() as session:
            summary = {n.name: n for n in await nodes_now(session, cluster_id=fleet.cluster_id)}
        busy_util = summary[busy].util_avg
        assert busy_util is not None and 40.0 <= busy_util <= 50.0  # 4 of 8 GPUs busy
        for name, node in summary.items():
            if name != busy:
                assert node.util_avg is not None and node.util_avg <= 1.0
                assert node.power_w < summary[busy].power_w / 3
