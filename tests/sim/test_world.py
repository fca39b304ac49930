from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import DriverError
from gpufleet.sim.models import BootPlan, SimInstanceSpec, SimInstanceState
from gpufleet.sim.workload import WorkloadConfig
from gpufleet.sim.world import SimWorld

H100 = "NVIDIA H100 80GB HBM3"
PLAN = BootPlan(delay_range_s=(30.0, 60.0), failure_rate=0.0)


def spec(name: str, *, cluster: str = "c1", token: str | None = None) -> SimInstanceSpec:
    return SimInstanceSpec(
        client_token=token or f"tok-{cluster}-{name}",
        cluster_id=cluster,
        node_name=name,
        gpu_model=H100,
        gpu_count=8,
        user_data={"gpufleet_node_token": "secret-1"},
    )


def boot(world: SimWorld, clock: FakeClock, n: int, *, cluster: str = "c1") -> list[str]:
    ids = [
        world.provision(spec(f"{cluster}-{i:03d}", cluster=cluster), plan=PLAN).instance_id
        for i in range(n)
    ]
    clock.advance(61)
    return ids


def test_instance_boots_after_its_delay(world: SimWorld, clock: FakeClock) -> None:
    inst = world.provision(spec("c1-000"), plan=PLAN)
    assert inst.state is SimInstanceState.PENDING
    assert inst.created_at + dt.timedelta(seconds=30) <= inst.ready_at
    assert inst.ready_at <= inst.created_at + dt.timedelta(seconds=60)
    assert inst.hostname == "c1-000"
    assert re.fullmatch(r"SIM[0-9A-F]{10}", inst.serial)
    assert len(inst.gpus) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f-]{36}", g.uuid) for g in inst.gpus)
    assert all(re.fullmatch(r"\d{13}", g.serial) for g in inst.gpus)
    assert len({g.uuid for g in inst.gpus}) == 8
    clock.advance(61)
    got = world.get_instance(inst.instance_id)
    assert got is not None and got.state is SimInstanceState.RUNNING


def test_provision_is_idempotent_and_refreshes_user_data(world: SimWorld) -> None:
    first = world.provision(spec("c1-000"), plan=PLAN)
    again = SimInstanceSpec(
        client_token=first.client_token,
        cluster_id="c1",
        node_name="c1-000",
        gpu_model=H100,
        gpu_count=8,
        user_data={"gpufleet_node_token": "secret-2"},
    )
    second = world.provision(again, plan=PLAN)
    assert second.instance_id == first.instance_id
    assert second.gpus == first.gpus
    assert second.user_data == {"gpufleet_node_token": "secret-2"}
    assert len(world.list_instances(include_terminated=True)) == 1


def test_topology_follows_slots(world: SimWorld) -> None:
    insts = [world.provision(spec(f"c1-{i:03d}"), plan=PLAN) for i in range(17)]
    assert insts[0].rack == "rack-000" and insts[0].pdu == "pdu-000"
    assert insts[0].leaf_switch == "leaf-00"
    assert insts[4].pdu == "pdu-001" and insts[3].pdu == "pdu-000"
    assert insts[8].rack == "rack-001" and insts[7].rack == "rack-000"
    assert insts[16].leaf_switch == "leaf-01" and insts[15].leaf_switch == "leaf-00"
    assert len({i.bmc_address for i in insts}) == 17


def test_failure_rate_one_fails_every_instance(world: SimWorld, clock: FakeClock) -> None:
    inst = world.provision(spec("c1-000"), plan=BootPlan((1.0, 1.0), failure_rate=1.0))
    clock.advance(2)
    got = world.get_instance(inst.instance_id)
    assert got is not None and got.state is SimInstanceState.FAILED and got.error


def test_unknown_gpu_model_is_refused(world: SimWorld) -> None:
    bad = SimInstanceSpec("t", "c1", "c1-000", "NVIDIA K80", 8)
    with pytest.raises(DriverError, match="c1-000"):
        world.provision(bad, plan=PLAN)


def test_capacity_limit(world: SimWorld) -> None:
    world.provision(spec("c1-000"), plan=PLAN, max_instances=1)
    with pytest.raises(DriverError, match="capacity"):
        world.provision(spec("c1-001"), plan=PLAN, max_instances=1)


def test_reboot_goes_pending_then_running_and_keeps_gpus(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock, 1)
    before = world.get_instance(iid)
    after = world.reboot(iid, plan=BootPlan((5.0, 5.0)))
    assert before is not None
    assert after.state is SimInstanceState.PENDING
    assert after.boot_id == before.boot_id + 1
    assert after.gpus == before.gpus
    clock.advance(6)
    got = world.get_instance(iid)
    assert got is not None and got.state is SimInstanceState.RUNNING


def test_reprovision_sets_new_user_data(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock, 1)
    got = world.reprovision(iid, user_data={"k": "v"}, plan=PLAN)
    assert got.state is SimInstanceState.PENDING and got.user_data == {"k": "v"}


def test_replace_terminates_old_and_is_idempotent(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock, 1)
    old = world.get_instance(iid)
    assert old is not None
    new_spec = spec("c1-000", token="replacement-1")
    new = world.replace(iid, spec=new_spec, plan=PLAN)
    again = world.replace(iid, spec=new_spec, plan=PLAN)
    assert again.instance_id == new.instance_id != iid
    assert {g.uuid for g in new.gpus}.isdisjoint({g.uuid for g in old.gpus})
    assert new.serial != old.serial and new.bmc_address != old.bmc_address
    terminated = world.get_instance(iid)
    assert terminated is not None and terminated.state is SimInstanceState.TERMINATED
    assert [i.instance_id for i in world.list_instances()] == [new.instance_id]
    assert len(world.list_instances(include_terminated=True)) == 2


def test_terminate_is_idempotent(world: SimWorld, clock: FakeClock) -> None:
    (iid,) = boot(world, clock, 1)
    world.terminate(iid)
    world.terminate(iid)
    world.terminate("i-missing")
    assert world.list_instances() == []
    with pytest.raises(DriverError):
        world.reboot(iid, plan=PLAN)


def test_state_survives_a_restart(world_path: Path, clock: FakeClock) -> None:
    world = SimWorld(world_path, clock=clock, seed=1)
    ids = boot(world, clock, 10)
    world.advance()
    world.drain_node("c1-003", reason="gpufleet: test")
    before = world.list_instances()
    jobs = world.running_jobs()
    assert jobs

    reloaded = SimWorld(world_path, clock=clock, seed=1)
    assert reloaded.list_instances() == before
    assert reloaded.running_jobs() == jobs
    assert reloaded.node_status("c1-003").reason == "gpufleet: test"
    # The saved random state continues: no new instance repeats an old serial or GPU.
    extra = reloaded.provision(spec("c1-100"), plan=PLAN)
    assert extra.serial not in {i.serial for i in before}
    assert extra.instance_id not in ids
    assert world_path.stat().st_mode & 0o077 == 0
    assert json.loads(world_path.read_text())["version"] == 2


def test_journal_is_folded_into_snapshots(world_path: Path, clock: FakeClock) -> None:
    world = SimWorld(world_path, clock=clock, seed=1)
    journal = world_path.with_name(world_path.name + ".journal")
    epochs = set()
    for i in range(1500):  # enough journal to pass the 1 MiB compaction threshold
        world.provision(spec(f"c1-{i:04d}"), plan=PLAN)
        if i % 100 == 0:
            epochs.add(json.loads(world_path.read_text())["epoch"])
    assert len(epochs) > 1
    assert journal.stat().st_size < 2 << 20
    reloaded = SimWorld(world_path, clock=clock, seed=1)
    assert reloaded.list_instances() == world.list_instances()


def test_torn_journal_tail_and_stale_epochs_are_ignored(world_path: Path, clock: FakeClock) -> None:
    world = SimWorld(world_path, clock=clock, seed=1)
    world.provision(spec("c1-000"), plan=PLAN)
    journal = world_path.with_name(world_path.name + ".journal")
    with journal.open("a") as fh:
        fh.write('{"epoch": 1, "changes": [{"i": {"instan')  # killed mid-write
    reloaded = SimWorld(world_path, clock=clock)
    assert [i.node_name for i in reloaded.list_instances()] == ["c1-000"]
    reloaded.provision(spec("c1-001"), plan=PLAN)  # appends after the cut
    names = [i.node_name for i in SimWorld(world_path, clock=clock).list_instances()]
    assert names == ["c1-000", "c1-001"]
    # Lines of an older epoch were folded into the snapshot already: skipped, not replayed.
    lines = journal.read_text().splitlines()
    journal.write_text("".join(line.replace('"epoch":1', '"epoch":0') + "\n" for line in lines))
    assert SimWorld(world_path, clock=clock).list_instances() == []


def test_operator_reason_survives_down(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 1)
    world.drain_node("c1-000", reason="ops: cabling")
    world.down_node("c1-000", reason="gpufleet: xid 79")
    with pytest.raises(DriverError):
        world.resume_node("c1-000", only_reason_prefix="gpufleet:")


def test_workload_keeps_most_nodes_busy(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 50)
    world.advance()
    busy = {n for j in world.running_jobs() for n in j.nodes}
    assert 30 <= len(busy) <= 40
    for job in world.running_jobs():
        assert 1 <= job.node_count <= 4 and job.gpus == 8 * job.node_count
        assert job.user and job.account


def test_jobs_end_into_accounting(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 20)
    start = clock.now()
    world.advance()
    first = {j.job_id for j in world.running_jobs()}
    clock.advance(61 * 60)
    world.advance()
    ended = world.accounting_since(start)
    assert first <= {j.job_id for j in ended}
    assert all(j.state in ("COMPLETED", "FAILED") for j in ended)
    assert [j.ended_at for j in ended] == sorted(j.ended_at for j in ended)  # type: ignore[type-var]
    assert world.running_jobs()  # new jobs started on the freed nodes


def test_time_scale_shortens_jobs(world_path: Path, clock: FakeClock) -> None:
    world = SimWorld(world_path, clock=clock, seed=3, workload=WorkloadConfig(time_scale=0.01))
    boot(world, clock, 10)
    world.advance()
    clock.advance(40)  # 60 min * 0.01 = 36 s
    world.advance()
    assert len(world.accounting_since(clock.now() - dt.timedelta(hours=1))) > 0


def test_drained_node_takes_no_new_jobs(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 4)
    for i in range(4):
        world.drain_node(f"c1-{i:03d}", reason="gpufleet: test")
    world.advance()
    assert world.running_jobs() == []


def test_down_kills_the_job(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 10)
    world.advance()
    job = world.running_jobs()[0]
    node = job.nodes[0]
    world.down_node(node, reason="gpufleet: xid 79")
    assert world.jobs_on_node(node) == []
    (killed,) = [j for j in world.accounting_since(clock.now()) if j.job_id == job.job_id]
    assert killed.state == "NODE_FAIL"
    status = world.node_status(node)
    assert status.down and status.reason == "gpufleet: xid 79"


def test_reboot_kills_the_job(world: SimWorld, clock: FakeClock) -> None:
    ids = boot(world, clock, 10)
    world.advance()
    busy = world.busy_instance_ids()
    iid = next(i for i in ids if i in busy)
    world.reboot(iid, plan=PLAN)
    assert iid not in world.busy_instance_ids()


def test_operator_drain_keeps_its_reason(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 1)
    world.drain_node("c1-000", reason="bob: bad fan")
    world.drain_node("c1-000", reason="gpufleet: repair")
    assert world.node_status("c1-000").reason == "bob: bad fan"
    with pytest.raises(DriverError, match="bad fan"):
        world.resume_node("c1-000", only_reason_prefix="gpufleet:")


def test_queued_job_counts_as_demand_until_it_starts(world: SimWorld, clock: FakeClock) -> None:
    boot(world, clock, 2)
    for i in range(2):
        world.drain_node(f"c1-{i:03d}", reason="gpufleet: x")
    world.submit_job(cluster_id="c1", node_count=2, gpus_per_node=8, duration_s=60)
    world.advance()
    assert world.pending_gpu_demand() == 16
    for i in range(2):
        world.resume_node(f"c1-{i:03d}", only_reason_prefix="gpufleet:")
    world.advance()
    assert world.pending_gpu_demand() == 0
    assert any(j.node_count == 2 and j.user == "alice" for j in world.running_jobs())


def test_same_node_name_in_two_clusters(world: SimWorld, clock: FakeClock) -> None:
    world.provision(spec("gpu-000", cluster="a"), plan=PLAN)
    world.provision(spec("gpu-000", cluster="b"), plan=PLAN)
    with pytest.raises(DriverError, match="several clusters"):
        world.node_status("gpu-000")
    assert world.node_status("gpu-000", cluster_id="b").cluster_id == "b"


def test_in_memory_world_writes_nothing(tmp_path: Path, clock: FakeClock) -> None:
    world = SimWorld(None, clock=clock, seed=1)
    boot(world, clock, 3)
    world.advance()
    assert list(tmp_path.iterdir()) == []
