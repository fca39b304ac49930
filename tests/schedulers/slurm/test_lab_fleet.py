"""gpufleet on the real Slurm lab: a repair drains a node running a job, waits for it,
reboots the (sim) machine and resumes the node in Slurm; a drain by someone else becomes
a finding through the node's real agent."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from labfleet import LabFleet, lab_fleet
from sqlalchemy import select

from gpufleet.agent.collectors.slurm import SlurmCollector
from gpufleet.agent.main import build_agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.server.db.tables import EventRow
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow


async def _status(fleet: LabFleet, repair_id: str) -> str:
    return str((await fleet.get(f"/api/v1/repairs/{repair_id}"))["status"])


async def _timeline(fleet: LabFleet, repair_id: str) -> list[str]:
    async with fleet.app.ctx.db.session() as session:
        rows = await session.scalars(
            select(EventRow).where(EventRow.kind == "repair.status").order_by(EventRow.id)
        )
        return [r.data["to"] for r in rows if repair_id in r.message]


async def test_repair_drains_the_running_job_waits_reboots_and_resumes(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    async with lab_fleet(slurm_lab, database_url, tmp_path) as fleet:
        job = fleet.sbatch("--uid=nobody", "--gres=gpu:2", "-w", "lab-002", "--wrap=sleep 12")
        slurm_lab.wait_until(lambda: fleet.job_state(job) == "RUNNING", timeout_s=20,
                             what=f"job {job} running")  # fmt: skip
        node = fleet.nodes["lab-002"]
        injected = await fleet.app.client.post(
            f"/api/v1/nodes/{node['id']}/faults", json={"signature": "xid-79", "gpu_index": 1}
        )
        assert injected.status_code == 202, injected.text

        async def proposed() -> dict[str, Any] | None:
            found = [r for r in await fleet.repairs() if r["status"] == "proposed"]
            return found[0] if found else None

        repair = await fleet.until(proposed, what="a reboot recommendation")
        assert (repair["action"], repair["signature_id"]) == ("reboot", "xid-79")
        shown = await fleet.get(f"/api/v1/repairs/{repair['id']}")
        assert [(j["job_id"], j["user"]) for j in shown["jobs"]] == [(job, "nobody")]
        # What ran there when it was recommended: the planner's read of every node it
        # recommends for, in one node list and one job list (SupportsJobsOnNodes).
        recommended = [(j["job_id"], j["user"]) for j in shown["evidence"]["jobs"]]
        assert recommended == [(job, "nobody")]
        machine = fleet.world.get_instance(fleet.instance_id("lab-002"))
        assert machine is not None

        approved = await fleet.app.client.post(
            f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "lab test"}
        )
        assert approved.status_code == 200, approved.text

        async def draining() -> bool:
            return await _status(fleet, repair["id"]) == "draining"

        await fleet.until(draining, timeout_s=20, what="draining")
        # In Slurm: drained with gpufleet's reason while the job still runs.
        assert fleet.reason("lab-002") == f"gpufleet: {repair['id']} xid-79"
        assert slurm_lab.node_states()["lab-002"] in ("drng", "mix", "alloc")
        assert fleet.job_state(job) == "RUNNING"
        sinfo_r = slurm_lab.run("sinfo", "-R", "-h", "-o", "%E|%N").stdout
        assert f"gpufleet: {repair['id']} xid-79|lab-002" in sinfo_r

        async def succeeded() -> bool:
            status = await _status(fleet, repair["id"])
            assert status not in ("failed", "dismissed"), status
            return status == "succeeded"

        await fleet.until(succeeded, timeout_s=90, what=f"success of {repair['id']}")
        # The job ran to its end (never killed), the machine rebooted once, Slurm has it back.
        state = slurm_lab.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State").stdout
        assert state.strip() == "COMPLETED"
        after = fleet.world.get_instance(fleet.instance_id("lab-002"))
        assert after is not None and after.boot_id == machine.boot_id + 1
        slurm_lab.wait_for_node_state("lab-002", "idle", timeout_s=20)
        assert fleet.reason("lab-002") in ("", "none")
        assert (await fleet.get(f"/api/v1/nodes/{node['id']}"))["state"] == "in_service"
        assert await _timeline(fleet, repair["id"]) == [
            "approved", "cordoning", "draining", "acting", "verifying", "succeeded",
        ]  # fmt: skip


async def test_foreign_drain_becomes_a_finding_through_the_agent(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in slurm_lab.env().items():
        monkeypatch.setenv(name, value)  # what scontrol on the node reads
    async with lab_fleet(slurm_lab, database_url, tmp_path) as fleet:
        settings = AgentSettings(
            hostname="lab-003",
            state_dir=tmp_path / "agent",
            collectors=("slurm",),
            metrics_listen=None,
        )
        async with fleet.app.anonymous() as http:
            client = AgentClient(
                base_url="http://test", node_token=fleet.node_token("lab-003"), http=http
            )
            collector = SlurmCollector(hostname="lab-003")
            agent = build_agent(settings, client=client, collectors=[collector], sources=[])

            async def sample() -> None:
                await agent.sample_once()
                await agent.sender.send_findings_once()

            await sample()
            assert await fleet.findings("lab-003", open="true") == []

            reason = "NHC: check_fs_mount: /scratch not mounted"
            slurm_lab.run("scontrol", "update", "nodename=lab-003", "state=drain",
                          f"reason={reason}")  # fmt: skip
            started = time.monotonic()
            await sample()
            (finding,) = await fleet.findings("lab-003", open="true")
            assert finding["signature_id"] == "slurm-foreign-drain"
            assert reason in finding["evidence"]
            print(f"foreign drain → finding in {time.monotonic() - started:.2f} s")
            # An operator's drain is reported, never undone by gpufleet.
            await fleet.tick()
            assert reason in fleet.reason("lab-003")

            # Resumed by the operator: the finding clears.
            slurm_lab.run("scontrol", "update", "nodename=lab-003", "state=resume")
            slurm_lab.wait_for_node_state("lab-003", "idle", timeout_s=20)
            await sample()
            assert await fleet.findings("lab-003", open="true") == []

            # gpufleet's own drain is not a foreign one.
            slurm_lab.run("scontrol", "update", "nodename=lab-003", "state=drain",
                          "reason=gpufleet: r-test manual")  # fmt: skip
            await sample()
            assert await fleet.findings("lab-003", open="true") == []
            await client.aclose()
