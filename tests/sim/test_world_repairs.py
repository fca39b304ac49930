"""Repair actions in the sim world: boot times, failed reboots, GPU resets, requeues,
and how a killed job shows in accounting."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import DriverError
from gpufleet.sim.models import BootPlan, SimInstanceSpec, SimInstanceState
from gpufleet.sim.workload import WorkloadConfig
from gpufleet.sim.world import SimWorld

H100 = "NVIDIA H100 80GB HBM3"
PLAN = BootPlan(delay_range_s=(30.0, 60.0), failure_rate=0.0)
RESET = BootPlan(delay_range_s=(10.0, 10.0), failure_rate=0.0)
QUIET = WorkloadConfig(busy_share=(0.0, 0.0))  # only the jobs a test submits run


def spec(name: str, *, token: str | None = None) -> SimInstanceSpec:
    return SimInstanceSpec(
        client_token=token or f"tok-{name}",
        cluster_id="c1",
        node_name=name,
        gpu_model=H100,
        gpu_count=8,
    )


def boot(world: SimWorld, clock: FakeClock, n: int = 1) -> list[str]:
    ids = [world.provision(spec(f"c1-{i:03d}"), plan=PLAN).instance_id for i in range(n)]
    clock.advance(61)
    return ids


@pytest.fixture
def quiet(world_path: Path, clock: FakeClock) -> SimWorld:
    return SimWorld(world_path, clock=clock, seed=7, workload=QUIET)


def run_job(world: SimWorld, *, nodes: int = 1, duration_s: float = 3600.0) -> str:
    job = world.submit_job(
        cluster_id="c1", node_count=nodes, gpus_per_node=8, duration_s=duration_s
    )
    world.advance()
    assert job.job_id in {j.job_id for j in world.running_jobs()}
    return job.job_id


# -- boot times and counts --------------------------------------------------------------


def test_booted_at_follows_every_boot_and_survives_a_reopen(
    world: SimWorld, world_path: Path, clock: FakeClock
) -> None:
    created = world.provision(spec("c1-000"), plan=PLAN)
    assert created.booted_at == created.created_at
    clock.advance(61)
    rebooted_at = clock.now()
    assert world.reboot(created.instance_id, plan=PLAN).booted_at == rebooted_at
    clock.advance(61)
    reinstalled_at = clock.now()
    world.reprovision(created.instance_id, user_data={}, plan=PLAN)
    world.reboot(created.instance_id, plan=PLAN, hard=True)  # a power cycle
    clock.advance(61)

    reopened = SimWorld(world_path, clock=clock, seed=7)
    got = reopened.get_instance(created.instance_id)
    assert got is not None and got.booted_at == reinstalled_at
    assert reopened.reboot_count(created.instance_id) == 2
    assert reopened.action_counts(created.instance_id) == {
        "reboot": 1,
        "reprovision": 1,
        "power_cycle": 1,
    }
    assert reopened.reboot_count("i-missing") == 0
    new = reopened.replace(created.instance_id, spec=spec("c1-000", token="r1"), plan=PLAN)
    assert new.booted_at == new.created_at == clock.now()
    assert reopened.action_counts(new.instance_id) == {}


def test_a_reboot_that_fails_leaves_the_machine_failed(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    got = world.reboot(iid, plan=BootPlan((5.0, 5.0), failure_rate=1.0))
    assert got.state is SimInstanceState.PENDING and got.error is None
    clock.advance(6)
    failed = world.get_instance(iid)
    assert failed is not None and failed.state is SimInstanceState.FAILED
    assert failed.error == "sim: host did not come back after reboot"
    world.reboot(iid, plan=BootPlan((5.0, 5.0)))  # a broken host stays broken
    clock.advance(6)
    still = world.get_instance(iid)
    assert still is not None and still.state is SimInstanceState.FAILED
    world.reprovision(iid, user_data={}, plan=BootPlan((5.0, 5.0)))  # a reinstall revives it
    clock.advance(6)
    back = world.get_instance(iid)
    assert back is not None and back.state is SimInstanceState.RUNNING and back.error is None


# -- GPU reset ----------------------------------------------------------------------------


def test_reset_gpu_clears_that_gpus_faults_and_kills_the_job(
    quiet: SimWorld, world_path: Path, clock: FakeClock
) -> None:
    (iid,) = boot(quiet, clock)
    job_id = run_job(quiet)
    quiet.inject_fault(iid, signature_id="xid-48", gpu_index=2)
    quiet.inject_fault(iid, signature_id="xid-79", gpu_index=5)
    quiet.inject_fault(iid, signature_id="ib-link-down")
    before = quiet.get_instance(iid)
    assert before is not None
    since = clock.now()

    after = quiet.reset_gpu(iid, gpu_index=2, plan=RESET)

    assert {(f.signature_id, f.gpu_index) for f in quiet.faults_of(iid)} == {
        ("xid-79", 5),
        ("ib-link-down", None),
    }
    (killed,) = quiet.accounting_since(since)
    assert (killed.job_id, killed.state) == (job_id, "NODE_FAIL")
    back_at = clock.now() + dt.timedelta(seconds=10)
    assert after.resetting_until == {2: back_at}
    assert quiet.resetting_gpus() == {iid: frozenset({2})}
    # The machine did not restart.
    assert (after.booted_at, after.boot_id) == (before.booted_at, before.boot_id)
    assert after.state is SimInstanceState.RUNNING
    assert quiet.action_counts(iid) == {"reset_gpu": 1}
    # No job starts while the GPU is off the bus, and the reset survives a reopen.
    quiet.submit_job(cluster_id="c1", node_count=1, gpus_per_node=8, duration_s=60)
    quiet.advance()
    assert quiet.running_jobs() == []
    reopened = SimWorld(world_path, clock=clock, seed=7, workload=QUIET)
    assert reopened.resetting_gpus() == {iid: frozenset({2})}
    clock.advance(11)
    assert reopened.resetting_gpus() == {}
    reopened.advance()
    assert len(reopened.running_jobs()) == 1


def test_reset_of_every_gpu_keeps_node_wide_faults(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    world.inject_fault(iid, signature_id="xid-48", gpu_index=2)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=5)
    world.inject_fault(iid, signature_id="ib-link-down")
    got = world.reset_gpu(iid, gpu_index=None, plan=RESET)
    assert [f.signature_id for f in world.faults_of(iid)] == ["ib-link-down"]
    assert sorted(got.resetting_until) == list(range(8))


def test_a_failed_reset_changes_nothing(quiet: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(quiet, clock)
    job_id = run_job(quiet)
    fault = quiet.inject_fault(iid, signature_id="xid-48", gpu_index=2)
    with pytest.raises(DriverError, match=r"node c1-000: nvidia-smi -r -i 2 failed"):
        quiet.reset_gpu(iid, gpu_index=2, plan=BootPlan((10.0, 10.0), failure_rate=1.0))
    assert quiet.faults_of(iid) == [fault]
    assert [j.job_id for j in quiet.running_jobs()] == [job_id]
    assert quiet.resetting_gpus() == {}
    assert quiet.action_counts(iid) == {"reset_gpu_failed": 1}


def test_reset_refuses_a_booting_machine_and_a_missing_gpu(
    world: SimWorld, clock: FakeClock
) -> None:
    (iid,) = boot(world, clock)
    with pytest.raises(DriverError, match="no GPU 8"):
        world.reset_gpu(iid, gpu_index=8, plan=RESET)
    world.reboot(iid, plan=PLAN)
    with pytest.raises(DriverError, match="pending, not running"):
        world.reset_gpu(iid, gpu_index=0, plan=RESET)
    with pytest.raises(DriverError, match="no such instance"):
        world.reset_gpu("i-nope", gpu_index=0, plan=RESET)


def test_a_reboot_ends_a_gpu_reset(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock)
    world.reset_gpu(iid, gpu_index=1, plan=BootPlan((600.0, 600.0)))
    world.reboot(iid, plan=BootPlan((5.0, 5.0)))
    clock.advance(6)
    assert world.resetting_gpus() == {}


# -- requeue ------------------------------------------------------------------------------


def test_requeue_puts_the_job_back_under_its_id_and_not_on_the_drained_node(
    quiet: SimWorld, world_path: Path, clock: FakeClock
) -> None:
    boot(quiet, clock, 2)
    job_id = run_job(quiet)
    (node,) = quiet.running_jobs()[0].nodes
    other = "c1-001" if node == "c1-000" else "c1-000"
    quiet.drain_node(node, reason="gpufleet: repair r1")
    quiet.drain_node(other, reason="gpufleet: repair r2")
    since = clock.now()

    assert quiet.requeue_jobs_on_node(node) == [job_id]

    assert quiet.jobs_on_node(node) == [] and quiet.running_jobs() == []
    assert quiet.pending_gpu_demand() == 8
    (run,) = quiet.accounting_since(since)
    assert (run.job_id, run.state, run.nodes, run.requeues) == (job_id, "REQUEUED", (node,), 0)
    quiet.advance()
    assert quiet.running_jobs() == []  # every node is drained: it waits
    assert quiet.requeue_jobs_on_node(node) == []  # nothing runs there: nothing to do

    reopened = SimWorld(world_path, clock=clock, seed=7, workload=QUIET)
    assert reopened.pending_gpu_demand() == 8
    reopened.resume_node(other, only_reason_prefix="gpufleet:")
    clock.advance(1)
    reopened.advance()
    (again,) = reopened.running_jobs()
    assert (again.job_id, again.nodes, again.state, again.requeues) == (
        job_id,
        (other,),
        "RUNNING",
        1,
    )
    assert again.started_at == clock.now()
    assert [j.state for j in reopened.accounting_since(since)] == ["REQUEUED"]


def test_requeue_stops_a_job_on_all_its_nodes(quiet: SimWorld, clock: FakeClock) -> None:
    boot(quiet, clock, 3)
    job_id = run_job(quiet, nodes=3)
    for i in range(3):
        quiet.drain_node(f"c1-{i:03d}", reason="gpufleet: x")
    assert quiet.requeue_jobs_on_node("c1-001") == [job_id]
    assert quiet.busy_instance_ids() == frozenset()
    assert quiet.pending_gpu_demand() == 24


def test_a_job_that_cannot_be_requeued_is_left_running(quiet: SimWorld, clock: FakeClock) -> None:
    boot(quiet, clock)
    job = quiet.submit_job(
        cluster_id="c1", node_count=1, gpus_per_node=8, duration_s=600, requeueable=False
    )
    quiet.advance()
    with pytest.raises(DriverError, match=f"c1-000: scontrol requeue {job.job_id}"):
        quiet.requeue_jobs_on_node("c1-000")
    assert [j.job_id for j in quiet.jobs_on_node("c1-000")] == [job.job_id]
    assert quiet.accounting_since(clock.now()) == []


# -- how jobs end -------------------------------------------------------------------------

KILLS: dict[str, Callable[[SimWorld, str], object]] = {
    "down": lambda w, _iid: w.down_node("c1-000", reason="gpufleet: x"),
    "terminate": lambda w, iid: w.terminate(iid),
    "replace": lambda w, iid: w.replace(iid, spec=spec("c1-000", token="new"), plan=PLAN),
    "reboot": lambda w, iid: w.reboot(iid, plan=PLAN),
    "power_cycle": lambda w, iid: w.reboot(iid, plan=PLAN, hard=True),
    "reprovision": lambda w, iid: w.reprovision(iid, user_data={}, plan=PLAN),
    "reset_gpu": lambda w, iid: w.reset_gpu(iid, gpu_index=0, plan=RESET),
}


@pytest.mark.parametrize("action", sorted(KILLS))
def test_a_job_killed_by_a_node_action_ends_as_node_fail(
    quiet: SimWorld, clock: FakeClock, action: str
) -> None:
    (iid,) = boot(quiet, clock)
    job_id = run_job(quiet)
    since = clock.now()
    KILLS[action](quiet, iid)
    assert [(j.job_id, j.state) for j in quiet.accounting_since(since)] == [(job_id, "NODE_FAIL")]


def test_a_drained_node_lets_its_job_finish_and_kills_nothing(
    world: SimWorld, clock: FakeClock
) -> None:
    boot(world, clock, 10)
    since = clock.now()
    world.advance()
    running = {j.job_id for j in world.running_jobs()}
    for i in range(10):
        world.drain_node(f"c1-{i:03d}", reason="gpufleet: repair")
    clock.advance(3601)
    world.advance()
    ended = world.accounting_since(since)
    assert {j.job_id for j in ended} == running
    assert all(j.state in ("COMPLETED", "FAILED") for j in ended)
    assert not any(j.state in ("NODE_FAIL", "REQUEUED") for j in ended)  # no job was killed


# -- state files written before these features -------------------------------------------


def test_a_state_file_without_the_new_fields_still_loads(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "old-world.json"
    t0 = clock.now()
    created, ready = t0 - dt.timedelta(hours=2), t0 - dt.timedelta(hours=1)
    instance = {
        "instance_id": "i-old",
        "client_token": "tok-old",
        "cluster_id": "c1",
        "node_name": "c1-000",
        "gpu_model": H100,
        "gpu_count": 8,
        "user_data": {},
        "created_at": created.isoformat(),
        "ready_at": ready.isoformat(),
        "will_fail": False,
        "slot": 0,
        "serial": "SIM0000000001",
        "gpus": [[i, f"GPU-{i}", f"{i:013d}"] for i in range(8)],
        "boot_id": 2,
        "terminated_at": None,
        # A fault as files stored them before sticky faults: nine fields.
        "faults": [["f-1", "xid-48", 2, ready.isoformat(), ready.isoformat(), 1, None, None,
                    "injected"]],
    }  # fmt: skip
    # A job as files stored it before requeue: fifteen fields.
    job = ["1001", "pretrain", "alice", "llm-pretrain", "c1", 1, 8, ready.isoformat(), 7200.0,
           "RUNNING", ["c1-000"], ready.isoformat(), (ready + dt.timedelta(hours=2)).isoformat(),
           None, None]  # fmt: skip
    meta = {
        "next_slot": 1,
        "next_job_id": 1001,
        "targets": {"c1": 0.0},
        "scheduler_available": True,
        "restarts": 0,
        "faults_drawn_at": None,
    }
    workload = {"flags": [], "running": [job], "queued": [], "accounting": []}
    payload = {"meta": meta, "instances": [instance], "workload": workload}
    path.write_text(json.dumps({**payload, "version": 2, "epoch": 1}))

    world = SimWorld(path, clock=clock, seed=1, workload=QUIET)
    got = world.get_instance("i-old")
    assert got is not None and got.state is SimInstanceState.RUNNING
    assert got.booted_at == created  # unknown: the creation time, a lower bound
    assert got.resetting_until == {}
    assert world.action_counts("i-old") == {}
    (fault,) = world.faults_of("i-old")
    assert not fault.sticky and fault.recurs_at is None
    (running,) = world.running_jobs()
    assert running.requeues == 0
    world.drain_node("c1-000", reason="gpufleet: x")
    assert world.requeue_jobs_on_node("c1-000") == ["1001"]
    world.reboot("i-old", plan=PLAN)
    assert world.faults_of("i-old") == []  # not sticky: the reboot cleared it
    reopened = SimWorld(path, clock=clock, seed=1, workload=QUIET)
    assert reopened.reboot_count("i-old") == 1
    again = reopened.get_instance("i-old")
    assert again is not None and again.booted_at == t0
