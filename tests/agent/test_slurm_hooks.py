"""The Slurm Epilog and HealthCheckProgram logic, on real processes."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.agent.findings import FindingChange
from gpufleet.agent.outbox import Outbox
from gpufleet.agent.runtime import save_open_findings
from gpufleet.agent.slurm_hooks import bad_findings, epilog, find_leftovers, read_proc, run

JOB = "9876501"


def spawn(env: dict[str, str], script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["bash", "-c", script],
        env={"PATH": os.environ["PATH"], **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def alive(pid: int) -> bool:
    p = read_proc(pid)
    return p is not None and p.state != "Z"


def job_pids(job: str, node: str) -> list[int]:
    want = {f"SLURM_JOB_ID={job}".encode(), f"SLURMD_NODENAME={node}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = set((entry / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if want <= env and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_for(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_epilog_kills_setsid_leftovers_and_their_children_not_decoys(tmp_path: Path) -> None:
    job_env = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "gpu-007"}
    # A double fork into a new session (what escapes proctrack/linuxproc), a grandchild
    # with a wiped environment, and one that ignores SIGTERM.
    leftover = spawn(
        job_env,
        "setsid bash -c 'trap \"\" TERM; env -i sleep 300 & sleep 300; true' </dev/null & "
        "disown; exit 0",
    )
    leftover.wait()
    decoy_other_job = spawn({**job_env, "SLURM_JOB_ID": "9876502"}, "sleep 300")
    decoy_other_node = spawn({**job_env, "SLURMD_NODENAME": "gpu-008"}, "sleep 300")
    wait_for(lambda: len(job_pids(JOB, "gpu-007")) == 2)
    env_pids = job_pids(JOB, "gpu-007")
    found, _ = find_leftovers(JOB, "gpu-007")
    assert set(env_pids) <= set(found.found_by)
    assert "tree" in found.found_by.values()  # the env -i grandchild
    try:
        result = epilog({**job_env}, state_dir=tmp_path, grace_s=0.5)
        assert result is not None
        killed = {p.pid for p in result.killed}
        assert set(env_pids) <= killed and len(killed) == 3, result
        assert result.survivors == []
        assert not any(alive(p) for p in killed)
        assert alive(decoy_other_job.pid) and alive(decoy_other_node.pid)
        [(_, event)] = Outbox(tmp_path).pending(10)
        assert event.kind.value == "node.cleanup"
        assert event.data["job_id"] == JOB and event.data["node"] == "gpu-007"
        assert set(str(event.data["pids"]).split()) == {str(p) for p in killed}
        assert "sleep" in str(event.data["commands"])
    finally:
        for proc in (decoy_other_job, decoy_other_node):
            proc.kill()
            proc.wait()
        for pid in job_pids(JOB, "gpu-007"):  # a failed run leaves nothing behind
            os.kill(pid, 9)


def test_epilog_never_kills_itself_or_its_parents(tmp_path: Path) -> None:
    # Run as slurmd would: the epilog's own environment carries the job id.
    env = {**os.environ, "SLURM_JOB_ID": "9876503", "SLURMD_NODENAME": "gpu-009",
           "GPUFLEET_AGENT_STATE_DIR": str(tmp_path)}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.agent.slurm_hooks", "epilog"],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert Outbox(tmp_path).depth() == 0  # nothing of the job was left; nothing reported


def test_epilog_exits_0_on_any_trouble(tmp_path: Path, monkeypatch: object) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("x")
    leftover = spawn({"SLURM_JOB_ID": "9876504", "SLURMD_NODENAME": "n"}, "sleep 300")
    try:
        wait_for(lambda: job_pids("9876504", "n"))
        env = {**os.environ, "SLURM_JOB_ID": "9876504", "SLURMD_NODENAME": "n"}
        out = subprocess.run(
            [sys.executable, "-m", "gpufleet.agent.slurm_hooks", "epilog", "--state-dir",
             str(blocked / "sub"), "--grace-s", "0.2"],
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert out.returncode == 0  # the event could not be written: said, still 0
        assert "could not queue the event" in out.stderr
        assert not job_pids("9876504", "n")
        assert run("epilog", state_dir=tmp_path) == 0  # no SLURM_JOB_ID here at all
    finally:
        leftover.kill()
        leftover.wait()


def test_cgroup_members_are_found_whatever_their_environment(tmp_path: Path) -> None:
    bare = spawn({}, "sleep 300")
    try:
        job_dir = tmp_path / "freezer" / "slurm_gpu-001" / "uid_0" / "job_42" / "step_batch"
        job_dir.mkdir(parents=True)
        (job_dir / "cgroup.procs").write_text(f"{bare.pid}\n")
        found, _ = find_leftovers("42", "gpu-001", cgroup_root=tmp_path)
        assert found.found_by == {bare.pid: "cgroup"}
        assert found.cgroups == [str(job_dir.parent)]
    finally:
        bare.kill()
        bare.wait()


def _change(signature: str, severity: str, source: str) -> FindingChange:
    now = dt.datetime.now(dt.UTC)
    return FindingChange.model_validate({
        "key": f"{signature}/x", "signature_id": signature, "state": "open",
        "severity": severity, "source": source, "first_seen": now, "last_seen": now,
    })  # fmt: skip


def test_bad_findings_are_fatal_or_critical_hardware_ones(tmp_path: Path) -> None:
    assert bad_findings(tmp_path) == []  # no agent snapshot: nothing to say
    save_open_findings(
        tmp_path / "open-findings.json",
        [
            _change("xid-79", "fatal", "kernel-log"),
            _change("xid-13", "warning", "kernel-log"),
            _change("slurm-not-responding", "critical", "scheduler"),
        ],
    )
    assert [f["signature_id"] for f in bad_findings(tmp_path)] == ["xid-79"]
    (tmp_path / "open-findings.json").write_text("{torn", encoding="utf-8")
    assert bad_findings(tmp_path) == []
    (tmp_path / "open-findings.json").write_text(json.dumps([]), encoding="utf-8")
    assert bad_findings(tmp_path) == []
