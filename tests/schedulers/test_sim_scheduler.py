from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence

import pytest

from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import (
    SchedJob,
    SchedNodeState,
    Scheduler,
    SupportsDown,
    SupportsDrain,
    SupportsJobsOnNodes,
    SupportsRequeue,
    jobs_on_nodes,
)
from gpufleet.schedulers.sim.driver import SimScheduler
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.world import SimWorld

PLAN = BootPlan((10.0, 10.0))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world(clock: FakeClock) -> SimWorld:
    world = SimWorld(None, clock=clock, seed=11)
    for cluster in ("a", "b"):
        for i in range(10):
            world.provision(
                SimInstanceSpec(
                    f"{cluster}{i}", cluster, f"{cluster}-{i:03d}", "NVIDIA H100 80GB HBM3", 8
                ),
                plan=PLAN,
            )
    clock.advance(11)
    return world


@pytest.fixture
def sched(world: SimWorld) -> SimScheduler:
    return SimScheduler(world).for_cluster("a")


def test_implements_every_protocol(sched: SimScheduler) -> None:
    assert sched.kind == "sim"
    for proto in (Scheduler, SupportsDrain, SupportsDown, SupportsRequeue):
        assert isinstance(sched, proto)


async def test_list_nodes_is_per_cluster(sched: SimScheduler, world: SimWorld) -> None:
    nodes = await sched.list_nodes()
    assert sorted(n.name for n in nodes) == [f"a-{i:03d}" for i in range(10)]
    assert {n.state for n in nodes} <= {SchedNodeState.IDLE, SchedNodeState.ALLOCATED}
    busy = [n for n in nodes if n.state is SchedNodeState.ALLOCATED]
    assert 5 <= len(busy) <= 9
    assert all(n.gpus == 8 and n.gpus_allocated == 8 and n.job_ids for n in busy)
    assert len(await SimScheduler(world).list_nodes()) == 20


async def test_booting_node_is_unknown(sched: SimScheduler, world: SimWorld) -> None:
    iid = world.node_status("a-000", cluster_id="a").instance_id
    world.reboot(iid, plan=PLAN)
    (node,) = [n for n in await sched.list_nodes() if n.name == "a-000"]
    assert node.state is SchedNodeState.UNKNOWN


async def test_drain_with_job_is_draining_then_drained(
    sched: SimScheduler, clock: FakeClock
) -> None:
    busy = next(n for n in await sched.list_nodes() if n.job_ids)
    await sched.drain(busy.name, reason="gpufleet: repair r1")
    await sched.drain(busy.name, reason="gpufleet: repair r1")
    (node,) = [n for n in await sched.list_nodes() if n.name == busy.name]
    assert node.state is SchedNodeState.DRAINING and node.reason == "gpufleet: repair r1"
    assert len(await sched.jobs_on_node(busy.name)) == 1
    clock.advance(3601)
    (node,) = [n for n in await sched.list_nodes() if n.name == busy.name]
    assert node.state is SchedNodeState.DRAINED
    assert await sched.jobs_on_node(busy.name) == []
    await sched.resume(busy.name)
    (node,) = [n for n in await sched.list_nodes() if n.name == busy.name]
    assert node.state in (SchedNodeState.IDLE, SchedNodeState.ALLOCATED)


async def test_resume_refuses_an_operator_drain(sched: SimScheduler) -> None:
    await sched.drain("a-001", reason="ops: replacing PSU")
    with pytest.raises(DriverError, match="a-001"):
        await sched.resume("a-001")


async def test_resume_of_an_idle_node_succeeds(sched: SimScheduler) -> None:
    await sched.resume("a-002")


async def test_down_kills_jobs(sched: SimScheduler, clock: FakeClock) -> None:
    busy = next(n for n in await sched.list_nodes() if n.job_ids)
    since = clock.now()
    await sched.down(busy.name, reason="gpufleet: xid 79")
    (node,) = [n for n in await sched.list_nodes() if n.name == busy.name]
    assert node.state is SchedNodeState.DOWN
    assert await sched.jobs_on_node(busy.name) == []
    ended = await sched.accounting_since(since)
    assert [j.state for j in ended if j.job_id == busy.job_ids[0]] == ["NODE_FAIL"]
    await sched.resume(busy.name)


async def test_accounting_is_per_cluster_and_ordered(sched: SimScheduler, clock: FakeClock) -> None:
    since = clock.now()
    await sched.list_nodes()
    clock.advance(2 * 3600)
    jobs = await sched.accounting_since(since)
    assert jobs and all(j.extra["cluster_id"] == "a" for j in jobs)
    ends = [j.ended_at for j in jobs]
    assert all(e is not None for e in ends)
    assert ends == sorted(e for e in ends if e is not None)
    later = await sched.accounting_since(clock.now() + dt.timedelta(seconds=1))
    assert later == []


async def test_pending_gpu_demand(sched: SimScheduler, world: SimWorld) -> None:
    world.submit_job(cluster_id="a", node_count=20, gpus_per_node=8, duration_s=60)
    assert await sched.pending_gpu_demand() == 160
    assert await SimScheduler(world).for_cluster("b").pending_gpu_demand() == 0


async def test_unknown_node_raises(sched: SimScheduler) -> None:
    with pytest.raises(DriverError, match="b-000"):
        await sched.jobs_on_node("b-000")  # in the other cluster


async def test_unavailable_scheduler_fails_closed(sched: SimScheduler, world: SimWorld) -> None:
    world.set_scheduler_available(False)
    with pytest.raises(DriverError, match="not responding"):
        await sched.jobs_on_node("a-000")
    with pytest.raises(DriverError):
        await sched.drain("a-000", reason="gpufleet: x")
    with pytest.raises(DriverError, match="scontrol requeue"):
        await sched.requeue_jobs("a-000")


async def test_requeue_puts_jobs_back_in_the_queue(
    sched: SimScheduler, world: SimWorld, clock: FakeClock
) -> None:
    busy = next(n for n in await sched.list_nodes() if n.job_ids)
    await sched.drain(busy.name, reason="gpufleet: repair r1")
    since = clock.now()
    assert await sched.requeue_jobs(busy.name) == list(busy.job_ids)
    assert await sched.jobs_on_node(busy.name) == []  # and not restarted there
    (node,) = [n for n in await sched.list_nodes() if n.name == busy.name]
    assert node.state is SchedNodeState.DRAINED
    ended = await sched.accounting_since(since)
    assert [(j.job_id, j.state) for j in ended] == [(busy.job_ids[0], "REQUEUED")]
    assert ended[0].extra["restarts"] == "0"
    # It waits for room (every other node busy or taken), then runs again, same id.
    job_id = busy.job_ids[0]
    running = {j.job_id: j for j in world.running_jobs(cluster_id="a")}
    if job_id not in running:
        assert await sched.pending_gpu_demand() > 0
        clock.advance(3601)
        await sched.list_nodes()
        running = {j.job_id: j for j in world.running_jobs(cluster_id="a")}
    assert job_id in running and busy.name not in running[job_id].nodes
    assert running[job_id].requeues == 1
    assert await sched.requeue_jobs(busy.name) == []


class _Gated:
    """The sim scheduler, each ``jobs_on_node`` held until ``full`` reads are in flight
    (or every node's is): reads made one after another never get past the first."""

    kind = "sim"

    def __init__(self, inner: SimScheduler, full: int) -> None:
        self.inner = inner
        self.full = full
        self.in_flight = 0
        self.peak = 0
        self.opened = asyncio.Event()

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= self.full:
            self.opened.set()
        try:
            await self.opened.wait()
            return await self.inner.jobs_on_node(node)
        finally:
            self.in_flight -= 1


async def test_jobs_on_nodes_reads_a_few_nodes_at_a_time(sched: SimScheduler) -> None:
    names = [f"a-{i:03d}" for i in range(10)] + ["b-000", "nosuch"]  # two it does not know
    gated = _Gated(sched, full=4)
    found = await asyncio.wait_for(jobs_on_nodes(gated, names, at_once=4), timeout=10)  # type: ignore[arg-type]
    assert gated.peak == 4  # at once, and never more than asked
    want = {n: await sched.jobs_on_node(n) for n in names[:10]}
    assert {n: found[n] for n in names[:10]} == want
    assert any(want.values())  # some nodes do run jobs
    for unknown in ("b-000", "nosuch"):  # the error the node's own read raised
        error = found[unknown]
        assert isinstance(error, DriverError) and unknown in error.message


class _Batched:
    """A scheduler that answers for many nodes in one read (as Slurm does)."""

    kind = "batched"

    def __init__(self, answer: dict[str, list[SchedJob] | None] | None) -> None:
        self.answer = answer
        self.asked: list[list[str]] = []

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        raise AssertionError("one read for all the nodes, not one a node")

    async def jobs_on_nodes(self, nodes: Sequence[str]) -> dict[str, list[SchedJob] | None]:
        self.asked.append(list(nodes))
        if self.answer is None:
            raise DriverError("squeue: connection refused")
        return self.answer


async def test_jobs_on_nodes_asks_once_where_the_scheduler_can() -> None:
    job = SchedJob("7", "train", "u", "a", "RUNNING", ("n1",), 8)
    batched = _Batched({"n1": [job], "n2": [], "n3": None})
    assert isinstance(batched, SupportsJobsOnNodes)
    assert await jobs_on_nodes(batched, []) == {}  # type: ignore[arg-type]
    assert batched.asked == []  # no node, no read (the planner asks on every pass)
    found = await jobs_on_nodes(batched, ["n1", "n2", "n3"])  # type: ignore[arg-type]
    assert (found["n1"], found["n2"]) == ([job], [])
    unknown = found["n3"]
    assert isinstance(unknown, DriverError)
    assert unknown.message == "node n3: the scheduler does not list it"
    assert batched.asked == [["n1", "n2", "n3"]]
    # The state cannot be read at all: no node's jobs are known, each says why.
    failing = _Batched(None)
    errors = await jobs_on_nodes(failing, ["n1", "n2"])  # type: ignore[arg-type]
    assert [str(e) for e in errors.values()] == ["squeue: connection refused"] * 2
