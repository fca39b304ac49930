"""The Slurm lab itself (``slurm_lab``): real daemons doing what the driver's tests and the
later health-check/epilog work rely on. Every test leaves the nodes idle."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpufleet.testing import slurm_lab as slurm_lab_module
from gpufleet.testing.slurm_lab import SlurmLab, SlurmLabError

pytestmark = pytest.mark.slow

# sacct sees a finished job some seconds after it ends (slurmctld sends in batches)
ACCOUNTING_S = 30.0
USERS = ("root", "daemon", "nobody")  # present on every Debian; sbatch --uid as root


def sbatch(lab: SlurmLab, *args: str) -> str:
    out = lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args).stdout
    return out.strip().split(";")[0]


def sacct_rows(lab: SlurmLab, job_ids: list[str]) -> dict[str, dict[str, str]]:
    out = lab.run(
        "sacct", "-a", "-P", "-X", "-S", "2000-01-01", "-j", ",".join(job_ids),
        "-o", "JobID,User,State,ExitCode,NodeList,AllocTRES",
    ).stdout  # fmt: skip
    header, *rows = out.strip().splitlines()
    keys = header.split("|")
    return {r["JobID"]: r for r in (dict(zip(keys, row.split("|"), strict=True)) for row in rows)}


def wait_for_accounting(
    lab: SlurmLab, job_ids: list[str], *, users: tuple[str, ...] | None = None
) -> dict[str, dict[str, str]]:
    """Poll sacct until every job is COMPLETED (and ran as ``users``, in order).

    Slurm 22.05's slurmdbd first records a job with uid 0 and fixes it 1-4 s later, so a
    job's User can read ``root`` for a moment, whoever submitted it."""
    rows: dict[str, dict[str, str]] = {}

    def recorded() -> bool:
        rows.clear()
        rows.update(sacct_rows(lab, job_ids))
        if not all(rows.get(j, {}).get("State") == "COMPLETED" for j in job_ids):
            return False
        return users is None or tuple(rows[j]["User"] for j in job_ids) == users

    lab.wait_until(
        recorded, timeout_s=ACCOUNTING_S, what=f"jobs {job_ids} COMPLETED in sacct (saw {rows})"
    )
    return rows


def test_three_nodes_are_idle_with_eight_fake_h100(slurm_lab: SlurmLab) -> None:
    out = slurm_lab.run("sinfo", "-h", "-N", "-o", "%N|%t|%G").stdout
    rows = sorted(line.split("|") for line in out.strip().splitlines())
    assert rows == [[n, "idle", "gpu:h100:8"] for n in ("lab-001", "lab-002", "lab-003")]
    assert slurm_lab.node_names == ("lab-001", "lab-002", "lab-003")
    assert slurm_lab.version.startswith("22.05.")
    assert slurm_lab.startup_s is not None and slurm_lab.startup_s < 30


def test_env_points_slurm_commands_at_the_lab(slurm_lab: SlurmLab) -> None:
    env = slurm_lab.env()
    assert Path(env["SLURM_CONF"]).is_file()
    assert env["SLURM_CONF"].startswith(str(slurm_lab.dir))
    assert "SLURM_CONF" not in os.environ  # nothing leaks into this process
    conf = slurm_lab.run("scontrol", "show", "config").stdout
    assert "ReturnToService         = 2" in conf
    assert f"SLURM_CONF              = {env['SLURM_CONF']}" in conf


def test_srun_with_gres_sees_its_gpus(slurm_lab: SlurmLab) -> None:
    out = slurm_lab.run(
        "srun", "-N1", "--gres=gpu:2", "bash", "-c", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"
    ).stdout
    node, gpus = out.split()
    assert node in slurm_lab.node_names
    assert gpus == "0,1"
    too_many = slurm_lab.run("srun", "-N1", "--gres=gpu:9", "true", check=False)
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


def test_jobs_of_three_users_show_up_in_sacct(slurm_lab: SlurmLab) -> None:
    ids = [sbatch(slurm_lab, f"--uid={user}", "--gres=gpu:1", "--wrap=true") for user in USERS]
    rows = wait_for_accounting(slurm_lab, ids, users=USERS)
    for j in ids:
        assert rows[j]["ExitCode"] == "0:0"
        assert rows[j]["NodeList"] in slurm_lab.node_names
        assert "gres/gpu=1" in rows[j]["AllocTRES"]


def test_drain_shows_in_sinfo_and_resume_returns_the_node_to_idle(slurm_lab: SlurmLab) -> None:
    node = "lab-001"
    slurm_lab.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=gpufleet: test")
    try:
        reasons = slurm_lab.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout.strip().splitlines()
        assert f"{node}|gpufleet: test" in reasons
        # "drng" (draining) while a job of an earlier test still ends on the node, then
        # "drain": a drained node runs nothing.
        assert slurm_lab.wait_for_node_state(node, "drain", timeout_s=30) == "drain"
    finally:
        slurm_lab.run("scontrol", "update", f"nodename={node}", "state=resume")
    # right after resume it shows idle* until slurmctld has pinged it
    assert slurm_lab.wait_for_node_state(node, "idle", timeout_s=20) == "idle"
    assert slurm_lab.run("sinfo", "-R", "-h", "-o", "%N").stdout.strip() == ""


def test_accounting_survives_a_slurmdbd_restart(slurm_lab: SlurmLab) -> None:
    before = sbatch(slurm_lab, "--wrap=true")
    wait_for_accounting(slurm_lab, [before])
    slurm_lab.restart_slurmdbd()
    after = sbatch(slurm_lab, "--wrap=true")
    rows = wait_for_accounting(slurm_lab, [before, after])
    assert set(rows) == {before, after}


def test_killed_slurmd_goes_not_responding_and_returns_when_started(
    slurm_lab: SlurmLab,
) -> None:
    node = "lab-003"
    slurm_lab.kill_slurmd(node)
    try:
        # SlurmdTimeout=10: "*" (not responding) after 7-11 s, down* after ~20 s
        state = slurm_lab.wait_for_node_state(node, "idle*", "down*", timeout_s=40)
        assert state.endswith("*")
        show = slurm_lab.run("scontrol", "-o", "show", "node", node).stdout
        assert "NOT_RESPONDING" in show
    finally:
        slurm_lab.start_slurmd(node)
    assert slurm_lab.wait_for_node_state(node, "idle", timeout_s=30) == "idle"


def test_unknown_node_and_failed_command_are_clear_errors(slurm_lab: SlurmLab) -> None:
    with pytest.raises(ValueError, match="no node 'lab-999'"):
        slurm_lab.kill_slurmd("lab-999", signal.SIGKILL)
    with pytest.raises(SlurmLabError, match=r"scontrol update nodename=nosuch .*Invalid node"):
        slurm_lab.run("scontrol", "update", "nodename=nosuch", "state=drain", "reason=x")


def test_hooks_run_the_configured_commands(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    seen = tmp_path / "hooks.txt"
    slurm_lab.set_hook("epilog", f'echo "epilog $SLURM_JOB_ID $SLURMD_NODENAME" >> {seen}')
    slurm_lab.set_hook("healthcheck", f'echo "healthcheck $SLURMD_NODENAME" >> {seen}')
    try:
        job = sbatch(slurm_lab, "-w", "lab-002", "--wrap=true")

        def all_ran() -> bool:
            lines = set(seen.read_text().splitlines()) if seen.exists() else set()
            want = {f"epilog {job} lab-002"} | {f"healthcheck {n}" for n in slurm_lab.node_names}
            return want <= lines

        # HealthCheckInterval=5 s on every node
        slurm_lab.wait_until(all_ran, timeout_s=20, what=f"both hooks ran (saw {seen})")
    finally:
        slurm_lab.set_hook("epilog", None)
        slurm_lab.set_hook("healthcheck", None)
    assert not (slurm_lab.dir / "etc" / "hooks" / "epilog").exists()


def test_fault_file_drains_the_node_at_the_next_health_check(slurm_lab: SlurmLab) -> None:
    node = "lab-002"
    fault = slurm_lab.faults_dir / node
    fault.write_text("xid 79")
    try:
        slurm_lab.wait_for_node_state(node, "drain", timeout_s=20)
        reasons = slurm_lab.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout.splitlines()
        assert f"{node}|lab fault: xid 79" in reasons
    finally:
        fault.unlink()
        slurm_lab.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    slurm_lab.wait_for_node_state(node, "idle", timeout_s=20)


def test_up_without_slurm_names_the_install_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        slurm_lab_module, "REQUIRED_BINARIES", ("slurmctld", "no-such-slurm-binary")
    )
    with pytest.raises(slurm_lab_module.SlurmNotInstalledError) as info:
        SlurmLab(dir=tmp_path / "lab").up()
    assert "no-such-slurm-binary" in str(info.value)
    assert "deploy/slurm-lab/slurm-lab install" in str(info.value)
    assert not (tmp_path / "lab").exists()


def test_commands_before_up_fail_at_once(tmp_path: Path) -> None:
    lab = SlurmLab(dir=tmp_path / "lab")
    assert lab.version.startswith("22.05.")  # needs only the packages
    with pytest.raises(SlurmLabError, match=r"no config yet: call up\(\) first"):
        lab.run("sinfo")
