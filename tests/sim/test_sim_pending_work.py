"""Demand in the simulator, for the autoscaler: jobs submitted by GPUs, demand traces fed
in over simulated time, the per-cluster switch for synthetic background jobs, and the
pending work the sim scheduler reports, all kept across a restart."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpufleet.core.autoscale import PendingWork
from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SupportsPendingWork
from gpufleet.schedulers.sim.driver import SimScheduler
from gpufleet.sim import store
from gpufleet.sim.demand import TraceJob, nightly_batch
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.records import JobRecord
from gpufleet.sim.workload import WorkloadConfig
from gpufleet.sim.world import SimWorld

H100 = "NVIDIA H100 80GB HBM3"
PLAN = BootPlan(delay_range_s=(30.0, 60.0), failure_rate=0.0)
# Synthetic users keep 60-80 % of each cluster busy unless the cluster is switched off.
BUSY = WorkloadConfig(busy_share=(0.6, 0.8), job_minutes=(600.0, 600.0))


def boot(world: SimWorld, clock: FakeClock, n: int, *, cluster: str, gpus: int = 8) -> None:
    for i in range(n):
        world.provision(
            SimInstanceSpec(
                client_token=f"tok-{cluster}-{i}",
                cluster_id=cluster,
                node_name=f"{cluster}-{i:03d}",
                gpu_model=H100,
                gpu_count=gpus,
            ),
            plan=PLAN,
        )
    clock.advance(61)


def open_world(path: Path, clock: FakeClock) -> SimWorld:
    return SimWorld(path, clock=clock, seed=3, workload=BUSY)


@pytest.fixture
def busy(world_path: Path, clock: FakeClock) -> SimWorld:
    return open_world(world_path, clock)


@pytest.fixture(params=["journal", "snapshot"])
def save_as(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Reopen from journal lines, or from a snapshot written at every save (the other
    half of the persistence code)."""
    if request.param == "snapshot":
        monkeypatch.setattr(store, "_MIN_COMPACT_BYTES", -1)
    return str(request.param)


def synthetic_jobs(world: SimWorld, cluster: str, *, besides: tuple[str, ...] = ()) -> list[str]:
    """Running jobs that are neither a trace's nor one of ``besides`` (submitted)."""
    return [
        j.job_id
        for j in world.running_jobs(cluster_id=cluster)
        if j.user != "trace" and j.job_id not in besides
    ]


# ------------------------------------------------------------------ submitted jobs


def test_a_job_of_gpus_takes_whole_nodes_and_waits_until_they_are_free(
    busy: SimWorld, clock: FakeClock
) -> None:
    boot(busy, clock, 3, cluster="c1")
    busy.set_synthetic_load("c1", on=False)
    submitted = clock.now()
    big = busy.submit_job("c1", gpus=12, duration_s=600, name="train")
    assert (big.node_count, big.gpus, big.name, big.state) == (2, 16, "train", "PENDING")
    assert busy.pending_work(cluster_id="c1") == [PendingWork(big.job_id, 16, submitted)]

    busy.advance()
    assert busy.pending_work() == []
    (running,) = busy.running_jobs(cluster_id="c1")
    assert (running.job_id, len(running.nodes)) == (big.job_id, 2)

    clock.advance(30)
    second = busy.submit_job("c1", gpus=9, duration_s=600)  # 2 nodes; 1 is free
    small = busy.submit_job("c1", node_count=1, gpus_per_node=8, duration_s=60)
    busy.advance()
    # Backfill: the small job passes the one that does not fit.
    assert [w.id for w in busy.pending_work()] == [second.job_id]
    assert busy.pending_gpu_demand(cluster_id="c1") == 16
    assert busy.pending_gpu_demand(cluster_id="c2") == 0
    assert {j.job_id for j in busy.running_jobs()} == {big.job_id, small.job_id}

    clock.advance(600)
    busy.advance()  # the big job ends; the waiting one starts on its nodes
    assert busy.pending_work() == []
    assert [j.job_id for j in busy.running_jobs()] == [second.job_id]


def test_submit_job_refuses_what_it_cannot_size(busy: SimWorld, clock: FakeClock) -> None:
    with pytest.raises(DriverError, match=r"cluster c9: no nodes to size a job of 8 by"):
        busy.submit_job("c9", gpus=8, duration_s=60)
    # A cluster with no node yet (scaled to zero) takes jobs sized by hand.
    job = busy.submit_job("c9", gpus=20, gpus_per_node=8, duration_s=60, now=clock.now())
    assert (job.node_count, job.gpus) == (3, 24)
    assert busy.pending_gpu_demand(cluster_id="c9") == 24
    for bad in (
        {"gpus": 8, "node_count": 1},
        {},
        {"gpus": 0},
        {"node_count": 0, "gpus_per_node": 8},
    ):
        with pytest.raises(ValueError, match="submit_job"):
            busy.submit_job("c9", duration_s=60, **bad)  # type: ignore[arg-type]


def test_the_node_size_is_the_clusters_commonest(busy: SimWorld, clock: FakeClock) -> None:
    boot(busy, clock, 2, cluster="c1", gpus=4)
    busy.provision(SimInstanceSpec("tok-big", "c1", "c1-big", H100, 8), plan=PLAN)
    job = busy.submit_job("c1", gpus=6, duration_s=60)
    assert (job.node_count, job.gpus) == (2, 8)


# --------------------------------------------------------- the synthetic switch


def test_a_switched_off_cluster_runs_only_submitted_jobs(busy: SimWorld, clock: FakeClock) -> None:
    boot(busy, clock, 10, cluster="quiet")
    boot(busy, clock, 10, cluster="loud")
    assert busy.synthetic_load("quiet") is True
    busy.set_synthetic_load("quiet", on=False)
    assert busy.synthetic_load("quiet") is False and busy.synthetic_load("loud") is True
    busy.advance()
    assert synthetic_jobs(busy, "quiet") == []
    assert 6 <= sum(len(j.nodes) for j in busy.running_jobs(cluster_id="loud")) <= 8
    job = busy.submit_job("quiet", gpus=8, duration_s=60)
    busy.advance()
    assert [j.job_id for j in busy.running_jobs(cluster_id="quiet")] == [job.job_id]

    busy.set_synthetic_load("quiet", on=True)
    clock.advance(1)
    busy.advance()
    assert synthetic_jobs(busy, "quiet", besides=(job.job_id,))  # the synthetic users return


def test_switching_off_lets_running_synthetic_jobs_end_in_their_time(
    busy: SimWorld, clock: FakeClock
) -> None:
    boot(busy, clock, 4, cluster="c1")
    busy.advance()
    before = synthetic_jobs(busy, "c1")
    assert before
    busy.set_synthetic_load("c1", on=False)
    busy.advance()
    assert synthetic_jobs(busy, "c1") == before
    clock.advance(601 * 60)
    busy.advance()
    assert busy.running_jobs(cluster_id="c1") == []


# ----------------------------------------------------------------- demand traces


TRACE = [
    TraceJob("late", arrive_s=3600, gpus=4, duration_s=600),
    TraceJob("first", arrive_s=0, gpus=8, duration_s=1800),
    TraceJob("second", arrive_s=600, gpus=16, duration_s=600),
    TraceJob("third", arrive_s=600, gpus=8, duration_s=600),
]


def test_a_trace_arrives_as_the_clock_passes_each_arrival(busy: SimWorld, clock: FakeClock) -> None:
    boot(busy, clock, 2, cluster="c1")
    busy.set_synthetic_load("c1", on=False)
    start = clock.now()
    busy.feed_trace("c1", TRACE, start=start)
    assert busy.trace_jobs_left(cluster_id="c1") == 4
    assert busy.pending_work() == []  # nothing arrives before an advance

    busy.advance()
    assert busy.trace_jobs_left() == 3
    (first,) = busy.running_jobs(cluster_id="c1")
    assert (first.name, first.user, first.submitted_at, first.gpus) == ("first", "trace", start, 8)

    clock.advance(900)  # past 600 s: two arrive, submitted at their arrival, not now
    busy.advance()
    assert busy.trace_jobs_left() == 1
    (third,) = [j for j in busy.running_jobs() if j.name == "third"]
    waiting = busy.pending_work(cluster_id="c1")
    assert [(w.gpus, w.since) for w in waiting] == [(16, start + dt.timedelta(seconds=600))]
    assert third.submitted_at == start + dt.timedelta(seconds=600)

    clock.advance(2700)  # 3600 s: the last arrives; the first two ended, the 16 GPUs run
    busy.advance()
    assert busy.trace_jobs_left() == 0
    assert {j.name for j in busy.running_jobs()} == {"second"}
    assert [w.gpus for w in busy.pending_work()] == [8]  # "late": 4 GPUs, a whole node
    clock.advance(600)
    busy.advance()
    assert [j.name for j in busy.running_jobs()] == ["late"]
    assert busy.pending_work() == []


def test_a_trace_fed_late_catches_up_and_two_traces_interleave(
    busy: SimWorld, clock: FakeClock
) -> None:
    start = clock.now() - dt.timedelta(hours=1)
    busy.feed_trace("c9", TRACE[:2], start=start, gpus_per_node=8)
    busy.feed_trace("c9", [TraceJob("mid", 1800, 1, 60)], start=start, gpus_per_node=8)
    busy.advance()  # no node in c9: everything that arrived waits, oldest first
    assert [(w.gpus, w.since - start) for w in busy.pending_work(cluster_id="c9")] == [
        (8, dt.timedelta(0)),
        (8, dt.timedelta(seconds=1800)),
        (8, dt.timedelta(seconds=3600)),
    ]
    assert busy.trace_jobs_left() == 0


def test_feed_trace_refuses_jobs_it_cannot_run(busy: SimWorld) -> None:
    with pytest.raises(ValueError, match="job bad: needs gpus >= 1"):
        busy.feed_trace("c1", [TraceJob("bad", 0, 0, 60)], gpus_per_node=8)
    with pytest.raises(DriverError, match="no nodes to size"):
        busy.feed_trace("c1", TRACE)
    busy.feed_trace("c1", [])  # nothing to feed: nothing to do
    assert busy.trace_jobs_left() == 0


def test_a_generated_trace_feeds_a_cluster_for_a_night(busy: SimWorld, clock: FakeClock) -> None:
    trace = nightly_batch(days=1, gpus_per_node=8)
    boot(busy, clock, 8, cluster="c1")
    busy.set_synthetic_load("c1", on=False)
    busy.feed_trace("c1", trace)
    clock.advance(3600 + 601)  # 01:00 plus the ten minutes the batch arrives over
    busy.advance()
    assert busy.trace_jobs_left() == 0
    assert len(busy.running_jobs(cluster_id="c1")) == 8
    assert len(busy.pending_work(cluster_id="c1")) == len(trace) - 8


# --------------------------------------------------------------------- restarts


def test_a_restart_keeps_queued_jobs_the_switch_and_the_trace(
    world_path: Path, clock: FakeClock, save_as: str
) -> None:
    world = open_world(world_path, clock)
    boot(world, clock, 2, cluster="c1")
    boot(world, clock, 2, cluster="c2")
    world.set_synthetic_load("c1", on=False)
    start = clock.now()
    world.feed_trace("c1", TRACE, start=start)
    world.advance()  # "first" runs on one node
    big = world.submit_job("c1", gpus=16, duration_s=60)  # needs both nodes: waits
    world.advance()
    clock.advance(600)
    world.advance()  # "second" (16) and "third" (8) arrive; "third" takes the free node
    before = world.pending_work()
    assert [(w.gpus, w.since) for w in before] == [
        (16, big.submitted_at),
        (16, start + dt.timedelta(seconds=600)),  # "second"
    ]
    assert before[0].id == big.job_id
    assert world.trace_jobs_left() == 1

    reopened = open_world(world_path, clock)
    assert reopened.pending_work() == before
    assert reopened.synthetic_load("c1") is False and reopened.synthetic_load("c2") is True
    assert reopened.trace_jobs_left(cluster_id="c1") == 1
    assert {j.name for j in reopened.running_jobs(cluster_id="c1")} == {"first", "third"}

    clock.advance(3000)  # past 3600 s: the last one arrives in the reopened world
    reopened.advance()
    assert reopened.trace_jobs_left() == 0
    assert [j.job_id for j in reopened.running_jobs(cluster_id="c1")] == [big.job_id]
    assert synthetic_jobs(reopened, "c2")  # c2 kept its synthetic users
    again = open_world(world_path, clock)
    assert again.trace_jobs_left() == 0
    assert again.pending_work() == reopened.pending_work()
    assert again.synthetic_load("c1") is False


def test_a_requeued_job_waits_since_its_requeue(
    world_path: Path, clock: FakeClock, save_as: str
) -> None:
    world = open_world(world_path, clock)
    boot(world, clock, 1, cluster="c1")
    world.set_synthetic_load("c1", on=False)
    job = world.submit_job("c1", gpus=8, duration_s=3600)
    world.advance()
    clock.advance(120)
    world.drain_node("c1-000", reason="gpufleet: repair")
    assert world.requeue_jobs_on_node("c1-000") == [job.job_id]
    assert world.pending_work() == [PendingWork(job.job_id, 8, clock.now())]
    requeued_at = clock.now()
    clock.advance(60)
    assert open_world(world_path, clock).pending_work() == [PendingWork(job.job_id, 8, requeued_at)]


def test_job_records_of_older_files_load() -> None:
    record = JobRecord(
        job_id="7",
        name="old",
        user="alice",
        account="a",
        cluster_id="c1",
        node_count=1,
        gpus_per_node=8,
        submitted_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        duration_s=60,
    )
    raw = record.to_json()
    assert JobRecord.from_json(raw[:17]) == record  # written before queued_at
    assert JobRecord.from_json(raw[:15]) == record  # written before requeue


# ------------------------------------------------------------- the sim scheduler


async def test_the_sim_scheduler_reports_its_clusters_pending_work(
    busy: SimWorld, clock: FakeClock
) -> None:
    boot(busy, clock, 2, cluster="c1")
    boot(busy, clock, 2, cluster="c2")
    for cluster in ("c1", "c2"):
        busy.set_synthetic_load(cluster, on=False)
    sched = SimScheduler(busy).for_cluster("c1")
    assert isinstance(sched, SupportsPendingWork)
    assert await sched.pending_work() == []
    waiting = busy.submit_job("c1", gpus=24, duration_s=60)
    busy.submit_job("c2", gpus=32, duration_s=60)
    fits = busy.submit_job("c1", gpus=8, duration_s=60)
    # The read moves the workload first: the job that fits starts, the other waits.
    assert await sched.pending_work() == [PendingWork(waiting.job_id, 24, waiting.submitted_at)]
    assert await sched.pending_gpu_demand() == 24
    assert fits.job_id in {j.job_id for j in busy.running_jobs()}
    everything = await SimScheduler(busy).pending_work()
    assert sorted(w.gpus for w in everything) == [24, 32]


async def test_the_sim_scheduler_down_raises_and_never_answers_nothing(
    busy: SimWorld, clock: FakeClock
) -> None:
    sched = SimScheduler(busy).for_cluster("c1")
    busy.submit_job("c1", gpus=8, gpus_per_node=8, duration_s=60)
    busy.set_scheduler_available(False)
    with pytest.raises(DriverError, match="squeue --states=PENDING: slurmctld is not responding"):
        await sched.pending_work()
    with pytest.raises(DriverError, match="slurmctld is not responding"):
        await sched.pending_gpu_demand()
    busy.set_scheduler_available(True)
    assert [w.gpus for w in await sched.pending_work()] == [8]
