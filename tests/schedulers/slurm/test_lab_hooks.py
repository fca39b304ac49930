"""`gpufleet slurm epilog` and `gpufleet slurm healthcheck` run by real slurmd."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.findings import FindingChange
from gpufleet.agent.outbox import Outbox
from gpufleet.agent.runtime import save_open_findings
from gpufleet.testing.slurm_lab import SlurmLab, free_port_base

pytestmark = pytest.mark.slow

GPUFLEET = Path(sys.executable).parent / "gpufleet"
LEFTOVER = "setsid bash -c 'sleep 600' </dev/null >/dev/null 2>&1 & disown; exit 0"


@pytest.fixture(scope="module")
def linuxproc_lab() -> Iterator[SlurmLab]:
    """A lab without cgroups (proctrack/linuxproc): slurmstepd tracks a job by its
    process tree, so a setsid'd child outlives the job — the case the epilog is for."""
    base = free_port_base(nodes=2)
    lab = SlurmLab(
        dir=Path(tempfile.mkdtemp(prefix="gf-lab-lp-", dir="/tmp")),
        nodes=2,
        port_base=base,
        first_job_id=(base // 200) * 1000 + 700_001,
        cgroup="none",
    )
    lab.up()
    yield lab
    lab.purge()


def _job_pids(job_id: str, node: str) -> list[int]:
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if want <= env and state != "Z":
            found.append(int(entry.name))
    return found


def _run_job(lab: SlurmLab, script: str) -> str:
    out = lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null",
                  "-w", "lab-001", f"--wrap={script}")  # fmt: skip
    job_id = out.stdout.strip().split(";")[0]

    def ended() -> bool:
        state = lab.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").stdout.strip()
        return state not in ("", "PENDING", "RUNNING")

    lab.wait_until(ended, timeout_s=30, what=f"job {job_id} ended")
    return job_id


def test_epilog_kills_a_setsid_leftover_of_a_finished_job(
    linuxproc_lab: SlurmLab, tmp_path: Path
) -> None:
    lab = linuxproc_lab
    # Control: with a hook that cleans nothing, the leftover outlives its job.
    lab.set_hook("epilog", "true")
    control = _run_job(lab, LEFTOVER)
    lab.wait_until(lambda: bool(_job_pids(control, "lab-001")), timeout_s=10,
                   what="the leftover of the control job")  # fmt: skip
    time.sleep(2)  # well after the job and its epilog ended
    survivors = _job_pids(control, "lab-001")
    assert survivors, "the leftover should outlive a job on proctrack/linuxproc"

    state_dir = tmp_path / "agent"
    lab.set_hook("epilog", f"{shlex.quote(str(GPUFLEET))} slurm epilog --state-dir {state_dir}")
    try:
        started = time.monotonic()
        job = _run_job(lab, LEFTOVER)
        lab.wait_until(lambda: Outbox(state_dir).depth() == 1, timeout_s=20,
                       what="the cleanup event")  # fmt: skip
        # (the epilog itself carries the job's environment until it has exited)
        lab.wait_until(lambda: _job_pids(job, "lab-001") == [], timeout_s=10,
                       what="no process of the job left")  # fmt: skip
        [(_, event)] = Outbox(state_dir).pending(5)
        assert event.kind.value == "node.cleanup"
        assert event.data["job_id"] == job and event.data["node"] == "lab-001"
        assert "sleep" in str(event.data["commands"])
        print(f"job end → leftover killed and reported in {time.monotonic() - started:.1f} s")
        # The epilog exited 0: the node takes jobs again (a failing Epilog drains it).
        lab.wait_for_node_state("lab-001", "idle", timeout_s=10)
        assert "lab-001" not in lab.run("sinfo", "-R", "-h", "-o", "%N").stdout
        # The control job's leftover is another job's: untouched by this epilog.
        assert _job_pids(control, "lab-001") == survivors
    finally:
        lab.set_hook("epilog", None)
        for pid in _job_pids(control, "lab-001"):
            os.kill(pid, signal.SIGKILL)


def _fatal(signature: str) -> FindingChange:
    now = dt.datetime.now(dt.UTC)
    return FindingChange.model_validate({
        "key": f"{signature}/GPU-1", "signature_id": signature, "state": "open",
        "severity": "fatal", "source": "kernel-log", "first_seen": now, "last_seen": now,
    })  # fmt: skip


def _reason(lab: SlurmLab, node: str) -> str:
    return lab.run("sinfo", "-h", "-n", node, "-o", "%E").stdout.strip()


def test_healthcheck_drains_only_with_its_own_reason_and_resumes_only_that(
    slurm_lab: SlurmLab, tmp_path: Path
) -> None:
    lab = slurm_lab
    dirs = {n: tmp_path / n for n in lab.node_names}
    for d in dirs.values():
        d.mkdir()
    save_open_findings(dirs["lab-002"] / "open-findings.json", [_fatal("xid-79")])
    lab.run("scontrol", "update", "nodename=lab-003", "state=drain", "reason=operator: fan")
    command = f"{shlex.quote(str(GPUFLEET))} slurm healthcheck --state-dir {tmp_path}/"
    lab.set_hook("healthcheck", command + "$SLURMD_NODENAME")
    try:
        lab.wait_until(lambda: _reason(lab, "lab-002") == "gpufleet: healthcheck xid-79",
                       timeout_s=30, what="lab-002 drained by the healthcheck")  # fmt: skip
        time.sleep(6)  # another interval: nothing else changes
        assert _reason(lab, "lab-003") == "operator: fan"  # a foreign drain stays as it is
        assert lab.node_states()["lab-001"] == "idle"

        save_open_findings(dirs["lab-002"] / "open-findings.json", [])  # the finding cleared
        save_open_findings(dirs["lab-003"] / "open-findings.json", [])
        lab.wait_for_node_state("lab-002", "idle", timeout_s=30)
        time.sleep(6)
        assert _reason(lab, "lab-003") == "operator: fan"  # never resumed by gpufleet
    finally:
        lab.set_hook("healthcheck", None)
        lab.run("scontrol", "update", "nodename=lab-002,lab-003", "state=resume", check=False)
        for node in lab.node_names:
            lab.wait_for_node_state(node, "idle", timeout_s=30)
