"""Sim faults: the background rate, persistence, what clears them, their telemetry."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest

from gpufleet.core.agent_protocol import FindingState, GpuSample
from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import DriverError
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.core.signatures.matcher import KernelLogMatcher
from gpufleet.sim.faults import (
    DEFAULT_RATE_PER_GPU_DAY,
    LLAMA3_MIX,
    TRANSIENT_S,
    FaultConfig,
    FaultModel,
    apply_effects,
    kernel_log_line,
)
from gpufleet.sim.findings import FindingSender
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.world import SimWorld

H100 = "NVIDIA H100 80GB HBM3"
PLAN = BootPlan(delay_range_s=(30.0, 60.0), failure_rate=0.0)


def boot(world: SimWorld, clock: FakeClock, n: int = 1) -> list[str]:
    ids = [
        world.provision(
            SimInstanceSpec(
                client_token=f"tok-{i}",
                cluster_id="c1",
                node_name=f"c1-{i:03d}",
                gpu_model=H100,
                gpu_count=8,
            ),
            plan=PLAN,
        ).instance_id
        for i in range(n)
    ]
    clock.advance(61)
    return ids


def test_every_signature_in_the_mix_is_in_the_catalog() -> None:
    for entry in LLAMA3_MIX:
        assert get_signature(entry.signature_id) is not None, entry
    for signature_id in TRANSIENT_S:
        assert get_signature(signature_id) is not None, signature_id


def test_background_rate_is_as_configured_over_a_million_gpu_days() -> None:
    model = FaultModel(FaultConfig(rate_per_gpu_day=DEFAULT_RATE_PER_GPU_DAY))
    rng = random.Random(42)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    machines = [(f"i-{i}", 8) for i in range(125)]  # 1,000 GPUs
    model.draw(now=start, rng=rng, machines=machines)  # the first call only starts the clock
    drawn = []
    for day in range(1, 1001):  # 1,000 days: 10^6 GPU-days, ~500 faults expected
        drawn += model.draw(now=start + dt.timedelta(days=day), rng=rng, machines=machines)
    assert 400 <= len(drawn) <= 600, len(drawn)
    by_signature: dict[str, int] = {}
    for fault in drawn:
        by_signature[fault.signature_id] = by_signature.get(fault.signature_id, 0) + 1
    # Fallen off the bus is the largest single class (Llama 3: faulty GPU).
    assert max(by_signature, key=lambda s: by_signature[s]) == "xid-79"
    gpu_faults = [f for f in drawn if f.signature_id == "xid-79"]
    assert all(f.gpu_index is not None and 0 <= f.gpu_index < 8 for f in gpu_faults)
    assert all(f.gpu_index is None for f in drawn if f.signature_id == "ib-link-down")


def test_a_world_at_a_demo_rate_draws_faults_in_advance(clock: FakeClock) -> None:
    world = SimWorld(None, clock=clock, seed=3, faults=FaultConfig(rate_per_gpu_day=50.0))
    ids = boot(world, clock, 4)
    world.advance()
    clock.advance(600)  # 32 GPUs × 50/day × 600 s ≈ 11 faults
    world.advance()
    drawn = [f for iid in ids for f in world.faults_of(iid, include_cleared=True)]
    assert 3 <= len(drawn) <= 30
    assert {f.origin for f in drawn} == {"background"}


def test_rate_zero_draws_nothing(clock: FakeClock) -> None:
    world = SimWorld(None, clock=clock, seed=3, faults=FaultConfig(rate_per_gpu_day=0.0))
    ids = boot(world, clock, 4)
    world.advance()
    clock.advance(86400 * 30)
    world.advance()
    assert all(world.faults_of(iid) == [] for iid in ids)


def test_injected_fault_survives_a_world_reload(
    world: SimWorld, world_path: Path, clock: FakeClock
) -> None:
    (iid,) = boot(world, clock)
    fault = world.inject_fault(iid, signature_id="xid-79", gpu_index=3)
    assert (fault.signature_id, fault.gpu_index, fault.count) == ("xid-79", 3, 1)
    assert fault.clears_at is None  # log-style: stays until the machine restarts
    again = world.inject_fault(iid, signature_id="xid-79", gpu_index=3)
    assert (again.fault_id, again.count) == (fault.fault_id, 2)  # folds, like a repeated line

    reloaded = SimWorld(world_path, clock=clock, seed=7)
    assert reloaded.faults_of(iid) == [again]


def test_a_gpu_signature_without_a_gpu_picks_one_and_a_node_signature_takes_none(
    world: SimWorld, clock: FakeClock
) -> None:
    (iid,) = boot(world, clock)
    gpu_fault = world.inject_fault(iid, signature_id="xid-48")
    assert gpu_fault.gpu_index is not None and 0 <= gpu_fault.gpu_index < 8
    assert world.inject_fault(iid, signature_id="ib-link-down").gpu_index is None


@pytest.mark.parametrize("action", ["reboot", "reprovision"])
def test_reboot_and_reprovision_clear_every_fault(
    world: SimWorld, world_path: Path, clock: FakeClock, action: str
) -> None:
    (iid,) = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    world.inject_fault(iid, signature_id="thermal-slowdown", gpu_index=1)
    if action == "reboot":
        world.reboot(iid, plan=PLAN)
    else:
        world.reprovision(iid, user_data={}, plan=PLAN)
    assert world.faults_of(iid) == []
    history = world.faults_of(iid, include_cleared=True)
    assert len(history) == 2 and all(f.cleared_at is not None for f in history)
    assert SimWorld(world_path, clock=clock, seed=7).faults_of(iid) == []


def test_replace_leaves_the_faults_with_the_old_host(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    new = world.replace(
        iid,
        spec=SimInstanceSpec(
            client_token="tok-new", cluster_id="c1", node_name="c1-000", gpu_model=H100,
            gpu_count=8,
        ),
        plan=PLAN,
    )  # fmt: skip
    assert world.faults_of(new.instance_id) == []
    assert iid not in world.active_faults()


def test_a_transient_fault_clears_after_its_drawn_duration(
    world: SimWorld, clock: FakeClock
) -> None:
    (iid,) = boot(world, clock)
    fault = world.inject_fault(iid, signature_id="thermal-slowdown", gpu_index=2)
    assert fault.clears_at is not None
    low, high = TRANSIENT_S["thermal-slowdown"]
    assert low <= (fault.clears_at - fault.started_at).total_seconds() <= high
    world.advance()
    assert world.faults_of(iid) == [fault]
    clock.advance(high + 1)
    world.advance()
    assert world.faults_of(iid) == []


def test_clear_fault_by_signature(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=5)
    assert [f.gpu_index for f in world.clear_fault(iid, signature_id="xid-79", gpu_index=5)] == [5]
    assert [f.gpu_index for f in world.faults_of(iid)] == [0]
    assert world.clear_fault(iid, signature_id="xid-48") == []


def test_inject_refuses_unknown_signatures_gpus_and_machines(
    world: SimWorld, clock: FakeClock
) -> None:
    (iid,) = boot(world, clock)
    with pytest.raises(DriverError, match="unknown signature 'xid-9999'"):
        world.inject_fault(iid, signature_id="xid-9999")
    with pytest.raises(DriverError, match=r"GPUs 0\.\.7, not 8"):
        world.inject_fault(iid, signature_id="xid-79", gpu_index=8)
    with pytest.raises(DriverError, match="no such instance"):
        world.inject_fault("i-nope", signature_id="xid-79")


def test_listeners_hear_every_change(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    heard: list[str] = []
    world.add_fault_listener(heard.append)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    world.reboot(iid, plan=PLAN)
    assert heard == [iid, iid]
    world.remove_fault_listener(heard.append)
    clock.advance(120)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    assert len(heard) == 2


def _samples() -> list[GpuSample]:
    return [
        GpuSample(
            index=i, uuid=f"GPU-{i}", utilization_pct=95.0, memory_used_mib=60000.0,
            memory_total_mib=81559.0, temperature_c=70.0, power_w=650.0, sm_clock_mhz=1950.0,
        )
        for i in range(8)
    ]  # fmt: skip


def test_effects_on_telemetry(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=1)
    world.inject_fault(iid, signature_id="thermal-slowdown", gpu_index=2)
    world.inject_fault(iid, signature_id="xid-48", gpu_index=3)
    out = {s.index: s for s in apply_effects(_samples(), world.faults_of(iid))}
    assert sorted(out) == [0, 2, 3, 4, 5, 6, 7]  # the GPU off the bus is not reported
    assert out[2].temperature_c >= 89 and out[2].sm_clock_mhz <= 1000
    assert out[3].ecc_dbe_volatile == 1 and out[3].ecc_dbe_aggregate == 1
    assert out[0] == _samples()[0]


def test_the_kernel_log_line_is_one_the_catalog_matches() -> None:
    for signature_id in ("xid-79", "xid-48", "xid-119", "xid-94"):
        signature = get_signature(signature_id)
        assert signature is not None
        line = kernel_log_line(signature, gpu_index=0, uptime_s=123.456789)
        assert line.startswith("[  123.456789] NVRM: Xid (PCI:0000:18:00): ")
        matches = KernelLogMatcher().feed(line)
        assert [m.signature for m in matches] == [signature_id], line


def test_finding_sender_opens_folds_and_clears_in_order(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    instance = world.get_instance(iid)
    assert instance is not None
    sender = FindingSender(iid)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    assert sender.plan(instance, world.faults_of(iid, include_cleared=True), now=clock.now()) == 1
    (opened,) = sender.pending
    assert opened.state is FindingState.OPEN and opened.severity.value == "fatal"
    assert opened.key == f"xid-79/{instance.gpus[0].uuid}"
    assert "GPU has fallen off the bus" in opened.evidence
    assert sender.plan(instance, world.faults_of(iid, include_cleared=True), now=clock.now()) == 0
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)  # seen again: count 2
    world.reboot(iid, plan=PLAN)
    sender.plan(instance, world.faults_of(iid, include_cleared=True), now=clock.now())
    states = [(c.state, c.count) for c in sender.pending]
    assert states == [(FindingState.OPEN, 1), (FindingState.CLEARED, 2)]
    seqs = [c.seq for c in sender.pending]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
