"""A stack rollout on the real Slurm lab: before its window opens, gpufleet books the
window as a MAINT reservation on the nodes still to move (right nodes, right times), so a
job whose time limit would reach into the window does not start there while a short one
does; the reservation goes when the rollout ends (aborted here)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from labfleet import LabFleet, lab_fleet

from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.server.workers.rollouts import RolloutLoop
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow


async def _rollout(fleet: LabFleet, rollout_id: str) -> dict[str, Any]:
    body: dict[str, Any] = await fleet.get(f"/api/v1/rollouts/{rollout_id}")
    return body


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_the_window_is_a_maint_reservation_that_keeps_long_jobs_off(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    async with lab_fleet(slurm_lab, database_url, tmp_path) as fleet:
        client = fleet.app.client
        made = await client.post("/api/v1/stacks", json={"name": "lab-new", "driver": "580.95.05"})
        assert made.status_code == 201, made.text
        # The window opens in 20 minutes (UTC), for an hour.
        opens = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=20)).replace(
            second=0, microsecond=0
        )
        window = f"{opens:%Y-%m-%dT%H:%M}/1h"
        created = await client.post(
            f"/api/v1/clusters/{fleet.cluster['id']}/rollouts",
            json={"to_stack": "lab-new", "window": window, "max_unavailable": "1"},
        )
        assert created.status_code == 201, created.text
        rid = created.json()["id"]
        loop = next(lp for lp in fleet.loops if isinstance(lp, RolloutLoop))
        jobs: list[str] = []
        try:
            await loop.run_once()
            rollout = await _rollout(fleet, rid)
            assert rollout["status"] == "scheduled" and rollout["reservation"], rollout
            name = rollout["reservation"]
            sched = SlurmScheduler(SlurmConfig(env=slurm_lab.env()))
            (booked,) = [r for r in await sched.list_reservations() if r.name == name]
            shown = slurm_lab.run("scontrol", "-o", "show", "reservation", name).stdout
            print(shown)
            assert sorted(booked.nodes) == sorted(slurm_lab.node_names)
            assert "MAINT" in booked.flags
            assert booked.start_time == opens and booked.end_time == opens + dt.timedelta(hours=1)
            # A job that would still run when the window opens waits; a short one runs.
            short = fleet.sbatch("--time=5", "-w", "lab-001", "--wrap=sleep 1")
            long = fleet.sbatch("--time=60", "-w", "lab-002", "--wrap=sleep 1")
            jobs += [short, long]
            slurm_lab.wait_until(
                lambda: fleet.job_state(short) in ("RUNNING", "COMPLETING", ""), timeout_s=20,
                what=f"short job {short} started",
            )  # fmt: skip
            reason = slurm_lab.run("squeue", "-h", "-j", long, "-o", "%T|%r").stdout.strip()
            print(f"job {long} (60 min): {reason}")
            assert reason.startswith("PENDING|ReqNodeNotAvail"), reason
            # A second pass books nothing new: one reservation per opening.
            await loop.run_once()
            assert (await _rollout(fleet, rid))["reservation"] == name
            assert [r.name for r in await sched.list_reservations()] == [name]

            aborted = await client.post(f"/api/v1/rollouts/{rid}/abort", json={})
            assert aborted.status_code == 200, aborted.text
            await loop.run_once()
            rollout = await _rollout(fleet, rid)
            assert (rollout["status"], rollout["reservation"]) == ("aborted", "")
            assert await sched.list_reservations() == []
            slurm_lab.wait_until(
                lambda: fleet.job_state(long) in ("RUNNING", "COMPLETING", ""), timeout_s=30,
                what=f"job {long} started once the reservation went",
            )  # fmt: skip
        finally:
            for job in jobs:
                slurm_lab.run("scancel", job, check=False)
            fleet.clean()
