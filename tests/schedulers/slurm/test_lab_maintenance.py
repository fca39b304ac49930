"""A maintenance window booked ahead on the real Slurm lab (22.05.8), through
``SlurmScheduler.create_reservation(start=...)``: a MAINT reservation that starts in a few
minutes keeps a job whose time limit would reach into the window off its nodes, while a
job that ends before the window, and one on a node outside it, start. Deleting the
reservation lets the held job run. Leaves the lab idle, with no reservation."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from uuid import uuid4

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.testing.slurm_lab import SlurmLab, SlurmLabError

pytestmark = pytest.mark.slow

WINDOW = ("lab-001", "lab-002")
OUTSIDE = "lab-003"


def sbatch(lab: SlurmLab, *args: str) -> str:
    out = lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args).stdout
    return out.strip().split(";")[0]


def squeue(lab: SlurmLab, job_id: str, field: str) -> str:
    return lab.run("squeue", "-h", "-j", job_id, "-o", field, check=False).stdout.strip()


def wait_for(lab: SlurmLab, job_id: str, *states: str, field: str = "%T") -> str:
    """Wait until the job's ``field`` is one of ``states`` (or, without any, has a value
    other than None): the value seen."""
    seen = ""

    def reached() -> bool:
        nonlocal seen
        seen = squeue(lab, job_id, field)
        return seen in states if states else seen not in ("", "None")

    try:
        lab.wait_until(reached, timeout_s=20, what=f"job {job_id} {field} in {states}")
    except SlurmLabError as exc:
        raise AssertionError(f"{exc}; last seen {seen!r}") from exc
    return seen


@pytest.fixture
def lab(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    slurm_lab.reset()
    yield slurm_lab
    slurm_lab.reset()


async def test_a_window_booked_ahead_keeps_overlapping_jobs_off_its_nodes(lab: SlurmLab) -> None:
    sched = SlurmScheduler(SlurmConfig(env=lab.env()))
    name = f"gpufleet-maint-test-{uuid4().hex[:8]}"
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=3)).replace(microsecond=0)
    # Given in another zone on purpose: the driver must send the same instant.
    start_elsewhere = start.astimezone(dt.timezone(dt.timedelta(hours=-5)))
    jobs: list[str] = []
    try:
        await sched.create_reservation(
            name, nodes=WINDOW, duration_s=3600, users=("root",), start=start_elsewhere
        )
        # A retry of the same call is no error; the same name elsewhere is.
        await sched.create_reservation(
            name, nodes=WINDOW, duration_s=3600, users=("root",), start=start
        )
        with pytest.raises(DriverError, match="exists on lab-001,lab-002, not lab-003"):
            await sched.create_reservation(
                name, nodes=(OUTSIDE,), duration_s=3600, users=("root",), start=start
            )

        shown = lab.run("env", "TZ=UTC", "scontrol", "-o", "show", "reservation", name).stdout
        print(f"\nscontrol: {shown.strip()}")
        assert "Nodes=lab-[001-002] " in shown
        assert "MAINT" in shown.split("Flags=")[1].split()[0].split(",")
        assert f"StartTime={start:%Y-%m-%dT%H:%M:%S} " in shown
        assert f"EndTime={start + dt.timedelta(hours=1):%Y-%m-%dT%H:%M:%S} " in shown
        assert "State=INACTIVE" in shown  # not begun yet
        [info] = [r for r in await sched.list_reservations() if r.name == name]
        assert info.nodes == WINDOW
        assert "MAINT" in info.flags
        assert info.state == "INACTIVE"
        assert info.start_time == start
        assert info.end_time == start + dt.timedelta(hours=1)

        # Ends before the window: starts on a window node. Submitted first, because once
        # a job is refused a node the main scheduler passes that node over for the jobs
        # after it, and only backfill (every 30 s) would start this one.
        short = sbatch(lab, "-w", WINDOW[1], "--time=1", "--wrap=sleep 2")
        jobs.append(short)
        wait_for(lab, short, "RUNNING")
        # Would run into the window: held, on the node it shares with the short one and
        # on the idle one.
        held = [sbatch(lab, "-w", node, "--time=10", "--wrap=true") for node in WINDOW]
        jobs.extend(held)
        # Outside the window: starts.
        outside = sbatch(lab, "-w", OUTSIDE, "--time=10", "--wrap=sleep 2")
        jobs.append(outside)
        wait_for(lab, outside, "RUNNING")
        for job in held:
            wait_for(lab, job, field="%r")  # Slurm gave its reason
            state, reason = squeue(lab, job, "%T|%r").split("|", 1)
            print(f"job {job} (--time=10 -w {squeue(lab, job, '%n')}): {state}, {reason!r}")
            assert state == "PENDING"
            # 22.05 says "ReqNodeNotAvail, May be reserved for other job"
            assert reason.startswith("ReqNodeNotAvail"), reason
            assert "reserved" in reason.lower(), reason

        await sched.delete_reservation(name)
        assert name not in {r.name for r in await sched.list_reservations()}
        for job in held:
            wait_for(lab, job, "RUNNING", "COMPLETING", "COMPLETED", "")
        # Let every job end by itself: cancelling a running one keeps its node
        # completing for a while, which the next test would wait out.
        for job in jobs:
            wait_for(lab, job, "COMPLETED", "")
    finally:
        for job in jobs:
            lab.run("scancel", job, check=False)
        await sched.delete_reservation(name)
