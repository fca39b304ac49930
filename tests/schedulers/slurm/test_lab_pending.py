"""``SlurmScheduler.pending_work`` on the real Slurm lab (22.05.8): real jobs that wait for
GPUs, and real ones that wait for something more nodes would not give them, read through
``squeue --json``, ``scontrol`` text and slurmrestd. Every test leaves the lab idle."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow


def sbatch(lab: SlurmLab, *args: str) -> str:
    out = lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args).stdout
    return out.strip().split(";")[0]


def squeue(lab: SlurmLab, job_id: str, field: str) -> str:
    return lab.run("squeue", "-h", "-j", job_id, "-o", field, check=False).stdout.strip()


def wait_for(lab: SlurmLab, job_id: str, field: str, want: str) -> None:
    lab.wait_until(
        lambda: squeue(lab, job_id, field).startswith(want),
        timeout_s=30,
        what=f"job {job_id} {field} {want} (saw {squeue(lab, job_id, field)!r})",
    )


@pytest.fixture
def lab(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    slurm_lab.reset()
    yield slurm_lab
    slurm_lab.reset()


def schedulers(lab: SlurmLab) -> dict[str, SlurmScheduler]:
    env = lab.env()
    return {
        "json": SlurmScheduler(SlurmConfig(env=env)),
        "text": SlurmScheduler(SlurmConfig(env=env, use_json=False)),
        "rest": SlurmScheduler(SlurmConfig(env=env, rest_url=f"unix://{lab.rest_socket}")),
    }


async def test_pending_work_lists_the_jobs_that_wait_for_gpus(lab: SlurmLab) -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    # Fill the nodes: 8, 6 and 6 of each node's 8 GPUs.
    blockers = [
        sbatch(lab, "--gres=gpu:8", "-w", "lab-001", "--wrap=sleep 300"),
        sbatch(lab, "--gres=gpu:6", "-w", "lab-002", "--wrap=sleep 300"),
        sbatch(lab, "--gres=gpu:6", "-w", "lab-003", "--wrap=sleep 300"),
    ]
    for job_id in blockers:
        wait_for(lab, job_id, "%T", "RUNNING")
    two_nodes = sbatch(lab, "--uid=nobody", "-N", "2", "--gres=gpu:8", "--wrap=true")
    per_job = sbatch(lab, "-N", "1", "--gpus=3", "--wrap=true")  # one node with 3 free: none
    array = sbatch(lab, "--array=0-5%2", "--gres=gpu:4", "--wrap=true")
    # Jobs more nodes would not start:
    sbatch(lab, "-H", "--gres=gpu:1", "--wrap=true")  # held
    sbatch(lab, "--begin=now+3600", "--gres=gpu:1", "--wrap=true")  # BeginTime
    sbatch(lab, f"--dependency=afterok:{blockers[0]}", "--gres=gpu:2", "--wrap=true")
    sbatch(lab, "-w", "lab-001", "--gres=gpu:2", "--wrap=true")  # pinned to a busy node
    wait_for(lab, two_nodes, "%r", "Resources")

    expected = [
        (two_nodes, 16),
        (per_job, 3),
        (f"{array}_0", 4),
        (f"{array}_1", 4),
    ]
    for via, sched in schedulers(lab).items():
        work = await sched.pending_work()
        read = dt.datetime.now(dt.UTC)
        assert [(w.id, w.gpus) for w in work] == expected, via
        # Eligible times: an array's is set when the scheduler first looks at it.
        assert all(before <= w.since <= read for w in work), (via, work)
        assert await sched.pending_gpu_demand() == 27, via
        await sched.aclose()

    # lab-003 drained: a job that needs all three nodes waits with ReqNodeNotAvail, and
    # counts (a new node would start it).
    lab.run("scontrol", "update", "nodename=lab-003", "state=drain", "reason=gpufleet: test")
    wide = sbatch(lab, "-N", "3", "--gres=gpu:1", "--wrap=true")
    wait_for(lab, wide, "%r", "ReqNodeNotAvail")
    sched = SlurmScheduler(SlurmConfig(env=lab.env()))
    work = {w.id: w for w in await sched.pending_work()}
    assert work[wide].gpus == 3
    assert len(work) == len(expected) + 1

    # The work goes as nodes free up: the blockers end, the waiting jobs start or finish.
    lab.run("scontrol", "update", "nodename=lab-003", "state=resume")
    lab.run("scancel", *blockers)
    lab.wait_until(
        lambda: squeue(lab, two_nodes, "%T") in ("", "RUNNING", "COMPLETING"),
        timeout_s=30,
        what=f"job {two_nodes} started",
    )
    left = {w.id for w in await sched.pending_work()}
    assert two_nodes not in left


async def test_a_requeued_job_waits_from_its_requeue(lab: SlurmLab) -> None:
    job_id = sbatch(lab, "--gres=gpu:8", "--wrap=sleep 300")
    wait_for(lab, job_id, "%T", "RUNNING")
    requeued = dt.datetime.now(dt.UTC).replace(microsecond=0)
    lab.run("scontrol", "requeue", job_id)
    # Slurm holds a requeued job until its BeginTime (about two minutes): not counted.
    wait_for(lab, job_id, "%r", "BeginTime")
    sched = SlurmScheduler(SlurmConfig(env=lab.env()))
    assert await sched.pending_work() == []
    # Every node drained, the job released now: it waits for nodes (Resources).
    lab.run("scontrol", "update", "nodename=lab-[001-003]", "state=drain", "reason=gpufleet: x")
    lab.run("scontrol", "update", f"jobid={job_id}", "StartTime=now")
    wait_for(lab, job_id, "%r", "Nodes required for job are DOWN, DRAINED")
    (work,) = await sched.pending_work()
    assert (work.id, work.gpus) == (job_id, 8)
    assert requeued <= work.since <= dt.datetime.now(dt.UTC)


async def test_slurmrestd_down_is_an_error_not_an_empty_list(lab: SlurmLab) -> None:
    sched = schedulers(lab)["rest"]
    assert await sched.pending_work() == []
    lab.stop_slurmrestd("local")
    try:
        with pytest.raises(DriverError, match="slurmrestd"):
            await sched.pending_work()
    finally:
        lab.start_slurmrestd()
        await sched.aclose()
    fresh = schedulers(lab)["rest"]
    assert await fresh.pending_work() == []
    await fresh.aclose()
