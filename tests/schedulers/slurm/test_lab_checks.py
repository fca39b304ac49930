"""Active checks on the real Slurm lab: a check runs as a Slurm job in a reservation on an
idle node and its result lands in the store; a node running a job is skipped; other jobs
do not land on reserved nodes; a hung check is killed at its timeout and fails.

The lab has no GPU, so the check's tool is a stand-in (``checks_stand_in``) printing a
recorded real ``dcgmi diag -j`` output (DCGM 3.1, 8 GPUs): the reservation, the job,
srun, the output files and the real parser are what is exercised.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from labfleet import LabFleet, lab_fleet

from gpufleet.server.workers.checks.runner import CheckRunner
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parents[2] / "fixtures" / "checks" / "dcgm3-r1-8gpu-from-dcgm-test.txt"
ENDED = {"passed", "failed", "error", "cancelled"}


def reservations(lab: SlurmLab) -> str:
    return lab.run("scontrol", "-o", "show", "reservation").stdout


async def run_check(fleet: LabFleet, body: dict[str, Any]) -> dict[str, Any]:
    response = await fleet.app.client.post(
        "/api/v1/checks", json={"cluster": fleet.cluster["id"], **body}
    )
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    assert run["status"] == "pending"
    return run


async def wait_status(
    fleet: LabFleet, run_id: str, wanted: set[str], *, timeout_s: float = 90.0
) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        run: dict[str, Any] = await fleet.get(f"/api/v1/checks/{run_id}")
        return run if run["status"] in wanted else None

    found: dict[str, Any] = await fleet.until(
        reached, timeout_s=timeout_s, what=f"check run {run_id} {'/'.join(sorted(wanted))}"
    )
    return found


async def test_a_check_runs_as_a_slurm_job_in_a_reservation_and_skips_a_busy_node(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    stand_in = ["sh", "-c", f"sleep 4; cat {FIXTURE}"]
    async with lab_fleet(
        slurm_lab, database_url, tmp_path, checks_stand_in={"dcgm-diag": stand_in}
    ) as fleet:
        busy = fleet.sbatch("-w", "lab-002", "--wrap=sleep 300")
        slurm_lab.wait_until(
            lambda: fleet.job_state(busy) == "RUNNING", timeout_s=20, what=f"job {busy} running"
        )
        started = time.monotonic()
        run = await run_check(
            fleet,
            {"nodes": ["lab-001", "lab-002"], "check": "dcgm-diag", "level": 1},
        )

        running = await wait_status(fleet, run["id"], {"running", *ENDED})
        assert running["status"] == "running", running
        assert running["backend"] == "slurm"
        [skipped] = running["skipped"]
        assert skipped["node"] == "lab-002" and f"running job {busy}" in skipped["reason"]
        name = f"gpufleet-check-{run['id']}"
        assert f"ReservationName={name}" in reservations(slurm_lab)
        assert "Nodes=lab-001 " in reservations(slurm_lab)
        # While the check runs, nobody else's job starts on the reserved node.
        intruder = fleet.sbatch("-w", "lab-001", "--wrap=true")
        await asyncio.sleep(1.0)
        assert fleet.job_state(intruder) == "PENDING"

        done = await wait_status(fleet, run["id"], ENDED)
        took = time.monotonic() - started
        assert done["status"] == "passed", done["result"]["invocations"]
        result = done["result"]
        node_id = fleet.nodes["lab-001"]["id"]
        assert set(result["nodes"]) == {node_id}
        verdict = result["nodes"][node_id]
        assert verdict["outcome"] == "pass"
        assert verdict["figures"]["gpus"] == 8 and verdict["figures"]["version"] == "3.1.0"
        assert len(verdict["gpus"]) == 8
        assert result["stand_in"] is True and result["backend"] == "slurm"
        [invocation] = result["invocations"]
        assert invocation["argv"][:7] == ["srun", "-N", "1", "-n", "1", "-w", "lab-001"]
        assert invocation["exit_code"] == 0
        output = (await fleet.app.client.get(f"/api/v1/checks/{run['id']}/output")).text
        assert FIXTURE.read_text().strip()[-200:] in output
        # The job is in Slurm's accounting, and the reservation is gone.
        acct = slurm_lab.run(
            "sacct", "-X", "-n", "-P", "--name", name, "--format=JobName,State"
        ).stdout
        assert f"{name}|COMPLETED" in acct
        assert name not in reservations(slurm_lab)
        slurm_lab.wait_until(
            lambda: fleet.job_state(intruder) in ("", "COMPLETED"),
            timeout_s=30,
            what="the other job ran once the check was done",
        )
        print(f"\nslurm lab: check run submit → result in {took:.1f} s (4 s of it the stand-in)")

        # A reservation left by a server that died mid-run is swept.
        stale = "gpufleet-check-00000000-0000-7000-8000-000000000000"
        slurm_lab.run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={stale}",
            "Nodes=lab-003",
            "StartTime=now",
            "Duration=10",
            "Users=root",
            "Flags=MAINT",
        )
        runner = next(loop for loop in fleet.loops if isinstance(loop, CheckRunner))
        assert stale in await runner.cleanup_reservations()
        assert stale not in reservations(slurm_lab)


async def test_a_hung_check_is_killed_at_its_timeout_and_fails(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    async with lab_fleet(
        slurm_lab, database_url, tmp_path, checks_stand_in={"gpu-burn": ["sleep", "600"]}
    ) as fleet:
        run = await run_check(
            fleet,
            {"nodes": ["lab-003"], "check": "gpu-burn", "params": {"timeout_s": 10}},
        )
        done = await wait_status(fleet, run["id"], ENDED, timeout_s=120)
        assert done["status"] == "failed", done
        verdict = done["result"]["nodes"][fleet.nodes["lab-003"]["id"]]
        codes = {r["code"] for r in verdict["reasons"]}
        assert "did-not-finish" in codes, verdict
        assert any("timeout" in r["message"] for r in verdict["reasons"])
        assert f"gpufleet-check-{run['id']}" not in reservations(slurm_lab)
        findings = await fleet.findings("lab-003", open=True)
        assert [f["signature_id"] for f in findings] == ["check-gpu-burn-failed"]


async def test_ib_write_bw_pairs_run_as_parallel_steps_of_one_job(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    recorded = FIXTURE.parent / "ib-write-bw-ndr-reference.txt"
    # Servers print nothing judged; clients print a recorded NDR run naming their HCA.
    stand_in = ["sh", "-c", f"sed 's/mlx5_0/{{hca}}/' {recorded}"]
    async with lab_fleet(
        slurm_lab, database_url, tmp_path, checks_stand_in={"ib-write-bw": stand_in}
    ) as fleet:
        run = await run_check(
            fleet,
            {
                "nodes": ["lab-001", "lab-003"],
                "check": "ib-write-bw",
                "params": {"hcas": ["mlx5_0", "mlx5_1"], "fabric": "NDR"},
            },
        )
        done = await wait_status(fleet, run["id"], ENDED)
        assert done["status"] == "passed", done["result"]["invocations"]
        nodes = done["result"]["nodes"]
        for name, peer in (("lab-001", "lab-003"), ("lab-003", "lab-001")):
            hcas = nodes[fleet.nodes[name]["id"]]["hcas"]
            assert sorted(hcas) == ["mlx5_0", "mlx5_1"]
            assert {h["peer"] for h in hcas.values()} == {peer}
            assert [h["bw_avg_gbits"] for h in hcas.values()] == [pytest.approx(388.77)] * 2
        invocations = done["result"]["invocations"]
        assert len(invocations) == 8 and all(i["exit_code"] == 0 for i in invocations)


async def test_cancelling_a_running_check_cancels_its_job_and_frees_the_node(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    async with lab_fleet(
        slurm_lab, database_url, tmp_path, checks_stand_in={"gpu-burn": ["sleep", "600"]}
    ) as fleet:
        run = await run_check(fleet, {"nodes": ["lab-002"], "check": "gpu-burn"})
        await wait_status(fleet, run["id"], {"running", *ENDED})
        name = f"gpufleet-check-{run['id']}"
        slurm_lab.wait_until(
            lambda: "RUNNING" in slurm_lab.run("squeue", "-h", "-n", name, "-o", "%T").stdout,
            timeout_s=30,
            what="the check job running",
        )
        asked = await fleet.app.client.post(f"/api/v1/checks/{run['id']}/cancel")
        assert asked.status_code == 200, asked.text
        done = await wait_status(fleet, run["id"], ENDED)
        assert done["status"] == "cancelled", done
        slurm_lab.wait_until(
            lambda: not slurm_lab.run("squeue", "-h", "-n", name).stdout.strip(),
            timeout_s=30,
            what="the check job gone",
        )
        assert name not in reservations(slurm_lab)
        slurm_lab.wait_for_node_state("lab-002", "idle", timeout_s=30)
