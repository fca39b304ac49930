"""Sticky faults: bad hardware that survives reboot, reinstall and GPU reset, is reported
again after each, and goes away only with the host."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.core.agent_protocol import FindingState
from gpufleet.core.clock import FakeClock
from gpufleet.sim import faults as fm
from gpufleet.sim.faults import TRANSIENT_S, FaultConfig, SimFault
from gpufleet.sim.findings import FindingSender
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.world import SimWorld

H100 = "NVIDIA H100 80GB HBM3"
PLAN = BootPlan(delay_range_s=(30.0, 60.0))
QUICK = BootPlan(delay_range_s=(10.0, 10.0))
CONFIG = FaultConfig()
LOW, HIGH = CONFIG.sticky_recur_s
REPEAT = dt.timedelta(seconds=CONFIG.sticky_repeat_s)


def spec(name: str, token: str) -> SimInstanceSpec:
    return SimInstanceSpec(
        client_token=token, cluster_id="c1", node_name=name, gpu_model=H100, gpu_count=8
    )


def boot(world: SimWorld, clock: FakeClock) -> str:
    iid = world.provision(spec("c1-000", "tok-0"), plan=PLAN).instance_id
    clock.advance(61)
    return iid


RESTARTS: dict[str, Callable[[SimWorld, str], object]] = {
    "reboot": lambda w, iid: w.reboot(iid, plan=QUICK),
    "reprovision": lambda w, iid: w.reprovision(iid, user_data={}, plan=QUICK),
    "reset_gpu": lambda w, iid: w.reset_gpu(iid, gpu_index=3, plan=QUICK),
}


@pytest.mark.parametrize("action", sorted(RESTARTS))
def test_a_sticky_fault_survives_the_repair_and_recurs_after_it(
    world: SimWorld, world_path: Path, clock: FakeClock, action: str
) -> None:
    iid = boot(world, clock)
    sticky = world.inject_fault(iid, signature_id="xid-48", gpu_index=3, sticky=True)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=3)  # the same GPU, not sticky
    assert sticky.sticky and sticky.clears_at is None
    acted = clock.now()

    RESTARTS[action](world, iid)

    (kept,) = world.faults_of(iid)
    assert (kept.fault_id, kept.count, kept.last_seen) == (sticky.fault_id, 1, acted)
    back = acted + dt.timedelta(seconds=10)  # boot done, or GPU reset done
    assert kept.recurs_at is not None
    assert back + dt.timedelta(seconds=LOW) <= kept.recurs_at <= back + dt.timedelta(seconds=HIGH)
    clock.advance(10 + LOW - 1)
    world.advance()
    assert world.faults_of(iid)[0].count == 1  # not yet: the driver is still loading
    clock.advance(HIGH)
    world.advance()
    (recurred,) = world.faults_of(iid)
    assert (recurred.fault_id, recurred.count) == (sticky.fault_id, 2)
    assert recurred.last_seen == kept.recurs_at and recurred.last_seen > back
    assert recurred.recurs_at == kept.recurs_at + REPEAT and recurred.active  # it goes on
    assert SimWorld(world_path, clock=clock, seed=7).faults_of(iid) == [recurred]
    # It keeps recurring for a while after the restart, then falls silent, still open.
    until = back + dt.timedelta(seconds=CONFIG.sticky_repeat_for_s)
    assert kept.recur_until == until
    clock.advance(CONFIG.sticky_repeat_for_s)
    world.advance()
    (quiet,) = world.faults_of(iid)
    assert quiet.count == 1 + 1 + int((until - kept.recurs_at) / REPEAT)
    assert until - REPEAT < quiet.last_seen <= until
    assert quiet.recurs_at is None and quiet.recur_until is None and quiet.active
    clock.advance(3600)
    world.advance()
    assert world.faults_of(iid) == [quiet]


def test_a_sticky_fault_recurs_after_every_reboot(world: SimWorld, clock: FakeClock) -> None:
    iid = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=1, sticky=True)
    for count in (2, 3):
        world.reboot(iid, plan=QUICK)
        clock.advance(10 + HIGH + 1)
        world.advance()
        assert [f.count for f in world.faults_of(iid)] == [count]


def test_a_failed_reboot_never_reports_it_again(world: SimWorld, clock: FakeClock) -> None:
    iid = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=1, sticky=True)
    world.reboot(iid, plan=BootPlan((10.0, 10.0), failure_rate=1.0))
    clock.advance(10 + HIGH + 1)
    world.advance()
    assert [f.count for f in world.faults_of(iid)] == [1]  # the machine never came up


def test_only_a_new_host_is_rid_of_it(world: SimWorld, clock: FakeClock) -> None:
    iid = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-48", gpu_index=3, sticky=True)
    new = world.replace(iid, spec=spec("c1-000", "tok-new"), plan=QUICK)
    clock.advance(10 + HIGH + 1)
    world.advance()
    assert world.faults_of(new.instance_id) == []
    assert world.active_faults() == {}


def test_the_agent_reports_it_again_after_the_boot(world: SimWorld, clock: FakeClock) -> None:
    """The sim agent's finding queue: open before the repair, the non-sticky one cleared by
    the reboot, and the sticky one sent again (same key, count 2) once it recurs, with a
    last-seen after the machine came back, as the repair's verification looks for."""
    iid = boot(world, clock)
    instance = world.get_instance(iid)
    assert instance is not None
    sender = FindingSender(iid)
    world.inject_fault(iid, signature_id="xid-48", gpu_index=3, sticky=True)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)

    def plan() -> list[tuple[str, FindingState, int, dt.datetime]]:
        sender.pending.clear()  # as if the server acked everything
        sender.plan(instance, world.faults_of(iid, include_cleared=True), now=clock.now())
        return [(c.signature_id, c.state, c.count, c.last_seen) for c in sender.pending]

    opened = clock.now()
    assert plan() == [
        ("xid-48", FindingState.OPEN, 1, opened),
        ("xid-79", FindingState.OPEN, 1, opened),
    ]
    clock.advance(5)
    world.reboot(iid, plan=QUICK)
    rebooted = clock.now()
    assert plan() == [("xid-79", FindingState.CLEARED, 1, rebooted)]
    clock.advance(11)
    world.advance()  # booted; the line has not recurred yet
    assert plan() == []
    clock.advance(HIGH)
    world.advance()
    ((sig, state, count, last_seen),) = plan()
    assert (sig, state, count) == ("xid-48", FindingState.OPEN, 2)
    assert last_seen > rebooted + dt.timedelta(seconds=10)
    (change,) = sender.pending
    assert change.key == f"xid-48/{instance.gpus[3].uuid}"
    assert change.first_seen == opened


def test_a_sticky_transient_fault_never_clears_by_itself(world: SimWorld, clock: FakeClock) -> None:
    iid = boot(world, clock)
    fault = world.inject_fault(iid, signature_id="thermal-slowdown", gpu_index=2, sticky=True)
    assert fault.clears_at is None
    clock.advance(TRANSIENT_S["thermal-slowdown"][1] + 1)
    world.advance()
    assert world.faults_of(iid) == [fault]


def test_a_sticky_repeat_makes_an_open_fault_sticky(world: SimWorld, clock: FakeClock) -> None:
    iid = boot(world, clock)
    first = world.inject_fault(iid, signature_id="xid-48", gpu_index=3)
    again = world.inject_fault(iid, signature_id="xid-48", gpu_index=3, sticky=True)
    assert (again.fault_id, again.count, again.sticky) == (first.fault_id, 2, True)


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_sticky_share_of_background_faults(clock: FakeClock, share: float) -> None:
    config = FaultConfig(rate_per_gpu_day=200.0, sticky_share=share)
    world = SimWorld(None, clock=clock, seed=3, faults=config)
    ids = [
        world.provision(spec(f"c1-{i:03d}", f"tok-{i}"), plan=PLAN).instance_id for i in range(4)
    ]
    clock.advance(61)
    world.advance()
    clock.advance(600)
    world.advance()
    drawn = [f for iid in ids for f in world.faults_of(iid, include_cleared=True)]
    assert any(f.signature_id not in TRANSIENT_S for f in drawn)
    for fault in drawn:
        assert fault.sticky is (share == 1.0 and fault.signature_id not in TRANSIENT_S)


def test_fault_config_validates() -> None:
    with pytest.raises(ValueError, match="sticky_share"):
        FaultConfig(sticky_share=1.5)
    with pytest.raises(ValueError, match="sticky_recur_s"):
        FaultConfig(sticky_recur_s=(5.0, 1.0))
    with pytest.raises(ValueError, match="rate_per_gpu_day"):
        FaultConfig(rate_per_gpu_day=-1.0)
    with pytest.raises(ValueError, match="sticky_repeat_s"):
        FaultConfig(sticky_repeat_s=-1.0)
    with pytest.raises(ValueError, match="sticky_repeat_for_s"):
        FaultConfig(sticky_repeat_for_s=-1.0)


def test_recurrence_folds_every_line_due_and_once_means_once() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    at = t0 + dt.timedelta(seconds=3)
    fault = SimFault(
        "f-1", "i-1", "xid-48", 0, t0, t0, sticky=True, recurs_at=at,
        recur_until=t0 + dt.timedelta(seconds=20),
    )  # fmt: skip
    assert fm.recur([fault], now=t0 + dt.timedelta(seconds=2), repeat_s=5.0) is None
    # Lines at 3, 8, 13 s are due at 14 s: three folds, the next at 18 s.
    (late,) = fm.recur([fault], now=t0 + dt.timedelta(seconds=14), repeat_s=5.0) or []
    assert (late.count, late.last_seen) == (4, t0 + dt.timedelta(seconds=13))
    assert late.recurs_at == t0 + dt.timedelta(seconds=18)
    (last,) = fm.recur([late], now=t0 + dt.timedelta(hours=1), repeat_s=5.0) or []
    assert (last.count, last.last_seen, last.recurs_at) == (5, t0 + dt.timedelta(seconds=18), None)
    (once,) = fm.recur([fault], now=t0 + dt.timedelta(hours=1), repeat_s=0.0) or []
    assert (once.count, once.last_seen, once.recurs_at) == (2, at, None)


def test_a_fault_stored_before_sticky_faults_loads_as_not_sticky() -> None:
    t = "2026-01-01T00:00:00+00:00"
    fault = SimFault.from_json("i-1", ["f-1", "xid-79", 0, t, t, 1, None, None, "injected"])
    assert not fault.sticky and fault.recurs_at is None and fault.recur_until is None
    assert SimFault.from_json("i-1", fault.to_json()) == fault
    sticky = replace(fault, sticky=True, recurs_at=fault.last_seen, recur_until=fault.last_seen)
    assert SimFault.from_json("i-1", sticky.to_json()) == sticky
