"""Slurm's power saving on the real lab (22.05): ``State=CLOUD`` nodes, a ResumeProgram and a
SuspendProgram that record each call, and the test in the role of gpufleet (it starts a
resumed node's slurmd, or does not).

The module starts a lab of its own (the session's has no cloud nodes, and a running lab
keeps its configuration): 3 lab nodes, ``cloud1``/``cloud2`` in the partition ``cloud``
with short timeouts. Slurm runs the programs as SlurmUser (root in the lab), so they only
append a line per call (and copy ``SLURM_RESUME_FILE``, gone when slurmctld stops); the
test reads the line as gpufleet's server would take the request.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.schedulers.slurm.power import expand_nodes, parse_resume_file
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port
from gpufleet.testing.slurm_lab import (
    INSTALL_HINT,
    CloudNodes,
    SlurmLab,
    SlurmLabError,
    free_port_base,
    missing_binaries,
)

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parents[2] / "fixtures" / "slurm" / "resume-file-22.05.json"
# the test starts a node's slurmd within about a second, or after gpufleet's acceptance
# of the node's machine (a quick suite: a few seconds in the sim on a quiet machine, over
# 20 s seen on a loaded CI machine; a partition's ResumeTimeout cannot be changed by
# `scontrol update` in 22.05, so one value serves the test that lets a node time out too)
RESUME_TIMEOUT_S = 45
SUSPEND_TIME_S = 4
SUSPEND_TIMEOUT_S = 3

RECORDER = """#!/bin/bash
# ResumeProgram / SuspendProgram of the power-saving test (the file's name is the action).
# slurmctld runs it as SlurmUser (root here) with the hostlist as the only argument.
dir={calls}
action=$(basename "$0")
n=$(date +%s%N)
copy=-
if [ -n "${{SLURM_RESUME_FILE:-}}" ]; then
  copy=$dir/resume-file-$n.json
  cp "$SLURM_RESUME_FILE" "$copy"
fi
env >"$dir/env-$action-$n.txt"
printf '%s\\t%s\\t%s\\t%s\\t%s\\n' "$n" "$action" "$#" "$copy" "$*" >>"$dir/calls.log"
# a test may hand the call on to the real program (gpufleet slurm resume|suspend)
[ -x "$dir/then-$action" ] && exec "$dir/then-$action" "$@"
exit 0
"""


@dataclass(frozen=True)
class Call:
    at_ns: int
    action: str
    argc: int
    resume_file: Path | None
    hostlist: str


@dataclass
class PowerLab:
    lab: SlurmLab
    calls_dir: Path
    failed: bool = False  # a test of this module failed: keep the lab for its logs

    def calls(self) -> list[Call]:
        log = self.calls_dir / "calls.log"
        if not log.exists():
            return []
        out: list[Call] = []
        for line in log.read_text().splitlines():
            at, action, argc, copy, hostlist = line.split("\t")
            path = None if copy == "-" else Path(copy)
            out.append(Call(int(at), action, int(argc), path, hostlist))
        return out

    def wait_for_call(self, action: str, *, after: int, timeout_s: float) -> Call:
        """The first ``action`` call past the first ``after`` calls."""
        found: list[Call] = []

        def called() -> bool:
            found[:] = [c for c in self.calls()[after:] if c.action == action]
            return bool(found)

        self.lab.wait_until(
            called, timeout_s=timeout_s, what=f"slurmctld running the {action} program"
        )
        return found[0]

    def env(self) -> dict[str, str]:
        path = f"/usr/sbin:/usr/bin:/sbin:/bin:{os.environ.get('PATH', '')}"
        return {**os.environ, "PATH": path, **self.lab.env()}


@pytest.fixture(scope="module")
def power(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PowerLab]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"needs a real Slurm; missing {', '.join(missing)}. {INSTALL_HINT}")
    calls = tmp_path_factory.mktemp("power-calls")
    for action in ("resume", "suspend"):
        program = calls / action
        program.write_text(RECORDER.format(calls=calls))
        program.chmod(0o755)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    base = free_port_base(nodes=3 + 2, stripe=(int(worker.removeprefix("gw")), workers))
    lab = SlurmLab(
        dir=Path(tempfile.mkdtemp(prefix="gpufleet-slurm-power-", dir="/tmp")),
        port_base=base,
        first_job_id=(base // 200) * 1000 + 1,
        cloud=CloudNodes(
            count=2,
            resume_program=calls / "resume",
            suspend_program=calls / "suspend",
            resume_timeout_s=RESUME_TIMEOUT_S,
            suspend_time_s=SUSPEND_TIME_S,
            suspend_timeout_s=SUSPEND_TIMEOUT_S,
        ),
    )
    try:
        lab.up()
    except SlurmLabError as exc:
        with contextlib.suppress(SlurmLabError):
            lab.down()
        pytest.fail(f"the power-saving lab did not start (kept at {lab.dir}):\n{exc}")
    print(f"power-saving lab up in {lab.startup_s:.1f} s at {lab.dir}")
    power = PowerLab(lab, calls)
    yield power
    if power.failed:
        lab.down()
        print(f"a test failed: lab kept at {lab.dir}, the programs' calls in {calls}")
    else:
        lab.purge()


@pytest.fixture(autouse=True)
def _note_failures(request: pytest.FixtureRequest, power: PowerLab) -> Iterator[None]:
    before = request.session.testsfailed
    yield
    if request.session.testsfailed > before:  # this test's call failed (reported by now)
        power.failed = True


def test_cloud_nodes_start_powered_down_in_their_own_partition(power: PowerLab) -> None:
    lab = power.lab
    assert lab.cloud_node_names == ("cloud1", "cloud2")
    states = lab.node_states()
    assert {n: states[n] for n in lab.cloud_node_names} == {"cloud1": "idle~", "cloud2": "idle~"}
    assert all(states[n] == "idle" for n in lab.node_names)
    gpu = lab.run("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N").stdout.split()
    assert sorted(gpu) == list(lab.node_names)  # the default partition: no cloud node
    conf = lab.run("scontrol", "show", "config").stdout
    assert "SuspendTime             = INFINITE" in conf  # the lab nodes never power down
    assert f"ResumeProgram           = {power.calls_dir / 'resume'}" in conf
    part = lab.run("scontrol", "-o", "show", "partition", "cloud").stdout
    assert "Default=NO " in part and "Nodes=cloud[1-2] " in part
    assert f"ResumeTimeout={RESUME_TIMEOUT_S} " in part
    assert f"SuspendTimeout={SUSPEND_TIMEOUT_S} SuspendTime={SUSPEND_TIME_S}" in part


def test_a_job_resumes_a_node_that_registers_runs_it_and_the_idle_node_is_suspended(
    power: PowerLab,
) -> None:
    lab = power.lab
    before = len(power.calls())
    t0 = time.monotonic()
    srun = subprocess.Popen(
        ["srun", "-p", "cloud", "-N1", "--gres=gpu:2", "--chdir=/tmp", "bash", "-c",
         "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_JOB_ID"],
        env=power.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        call = power.wait_for_call("resume", after=before, timeout_s=15)
        resumed_s = time.monotonic() - t0
        assert call.argc == 1  # the hostlist is the only argument
        nodes = expand_nodes(call.hostlist)
        assert len(nodes) == 1 and nodes[0] in lab.cloud_node_names
        [node] = nodes
        assert lab.node_states()[node] in ("mix~", "mix#", "alloc~", "alloc#")  # powering up
        # the resume file: 22.05's format, the job waiting for the node
        assert call.resume_file is not None
        raw = call.resume_file.read_bytes()
        print(f"SLURM_RESUME_FILE: {raw.decode()}")
        live, recorded = json.loads(raw), json.loads(FIXTURE.read_bytes())
        assert set(live) == set(recorded) == {"jobs", "all_nodes"}
        assert {k for j in live["jobs"] for k in j} == {k for j in recorded["jobs"] for k in j}
        resume = parse_resume_file(raw)
        assert resume.nodes == (node,)
        [job] = resume.jobs
        assert job.nodes_alloc == job.nodes_resume == (node,)
        queued = lab.run("squeue", "-h", "-p", "cloud", "-o", "%A").stdout.split()
        assert queued == [job.job_id]

        lab.start_slurmd(node)  # gpufleet's part: the machine boots, its slurmd registers
        out, err = srun.communicate(timeout=30)
        ran_s = time.monotonic() - t0
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait(timeout=10)
    assert srun.returncode == 0, err
    assert out.split() == [node, "0,1", job.job_id]

    suspend = power.wait_for_call("suspend", after=before, timeout_s=SUSPEND_TIME_S + 20)
    suspended_s = time.monotonic() - t0
    assert suspend.argc == 1 and suspend.resume_file is None
    assert expand_nodes(suspend.hostlist) == (node,)
    lab.stop_slurmd(node)  # gpufleet's part: the machine goes
    lab.wait_for_node_state(node, "idle~", timeout_s=SUSPEND_TIMEOUT_S + 15)
    down_s = time.monotonic() - t0
    print(
        f"resume program called after {resumed_s:.1f} s, job ran by {ran_s:.1f} s, suspend "
        f"program after {suspended_s:.1f} s (SuspendTime {SUSPEND_TIME_S} s), powered down "
        f"by {down_s:.1f} s"
    )
    env = sorted((power.calls_dir).glob("env-resume-*.txt"))[-1].read_text()
    print(
        "the programs' environment: "
        + " ".join(sorted(line.split("=")[0] for line in env.splitlines() if "=" in line))
    )


def test_a_node_not_registered_within_resume_timeout_goes_down_and_its_job_requeues(
    power: PowerLab,
) -> None:
    lab = power.lab
    before = len(power.calls())
    job = lab.run(
        "sbatch", "--parsable", "-p", "cloud", "-w", "cloud2", "--gres=gpu:1",
        "--chdir=/tmp", "--output=/dev/null", "--wrap", "true",
    ).stdout.strip()  # fmt: skip
    try:
        call = power.wait_for_call("resume", after=before, timeout_s=15)
        resumed = time.monotonic()
        assert expand_nodes(call.hostlist) == ("cloud2",)
        assert call.resume_file is not None
        assert [j.job_id for j in parse_resume_file(call.resume_file.read_bytes()).jobs] == [job]
        # nobody starts cloud2's slurmd
        lab.wait_for_node_state("cloud2", "down~", timeout_s=RESUME_TIMEOUT_S + 15)
        waited_s = time.monotonic() - resumed
        assert RESUME_TIMEOUT_S - 2 <= waited_s <= RESUME_TIMEOUT_S + 12
        reason = lab.run("sinfo", "-h", "-n", "cloud2", "-o", "%E").stdout.strip()
        assert reason == "ResumeTimeout reached"
        shown = lab.run("scontrol", "-o", "show", "job", job).stdout
        assert "JobState=PENDING" in shown and "Restarts=1" in shown  # requeued
        print(f"cloud2 DOWN {waited_s:.1f} s after the resume call (ResumeTimeout "
              f"{RESUME_TIMEOUT_S} s): {reason!r}; job {job} requeued")  # fmt: skip
    finally:
        lab.run("scancel", job, check=False)
        lab.run("scontrol", "update", "nodename=cloud2", "state=resume", check=False)


@dataclass
class Gpufleet:
    """A real ``gpufleet server`` process whose Slurm cluster ``hpc`` (sim provider) is in
    autoscaling mode slurm, accepting every new machine with a quick suite."""

    api: httpx.Client
    url: str
    token: str
    cluster_id: str
    log: Path  # the programs' --log-file
    setup_s: float

    def hand_on(self, power: PowerLab, action: str, tmp_path: Path) -> None:
        """Make the recording program hand ``action`` on to ``gpufleet slurm ACTION``
        through a one-line wrapper that names the cluster, server and token (slurmctld
        gives its programs no PATH, no HOME, nothing of ours)."""
        gpufleet = Path(sys.executable).parent / "gpufleet"  # the venv's entry point
        wrapper = power.calls_dir / f"then-{action}"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"GPUFLEET_CLUSTER=hpc GPUFLEET_URL={self.url} GPUFLEET_TOKEN={self.token} "
            f'exec {gpufleet} slurm {action} --log-file {self.log} "$@" 2>>{tmp_path}/stderr\n'
        )
        wrapper.chmod(0o700)

    def node_in(self, node: str, state: str) -> bool:
        listed = self.api.get("/api/v1/nodes", params={"cluster": self.cluster_id, "state": state})
        return node in {n["name"] for n in listed.json()["items"]}

    def actions(self) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.api.get(
            f"/api/v1/clusters/{self.cluster_id}/autoscale/actions"
        ).json()["items"]
        return got

    def story(self, node: str) -> list[str]:
        """The cluster's timeline about autoscaling, acceptance and ``node``, oldest first."""
        events = self.api.get(
            "/api/v1/events", params={"cluster": self.cluster_id, "limit": 200}
        ).json()["items"]
        return [
            e["message"] for e in reversed(events)
            if e["kind"].startswith(("autoscale.", "acceptance.finished", "check.status"))
            or (e["kind"] == "node.state" and node in e["message"])
        ]  # fmt: skip


def _in_order(story: list[str], expected: list[str]) -> None:
    at = 0
    for want in expected:
        found = next((i for i in range(at, len(story)) if want in story[i]), None)
        assert found is not None, f"{want!r} not in the story after line {at}:\n" + "\n".join(story)
        at = found + 1


@pytest.fixture
def gpufleet(power: PowerLab, tmp_path: Path) -> Iterator[Gpufleet]:
    lab = power.lab
    port = free_port()
    env = {
        **fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=tmp_path / "tok"),
        "GPUFLEET_SLURM_CONF": str(lab.slurm_conf),
        # the check tools at 1/500 of their real time: the acceptance suite of a resumed
        # node (DCGM level 3 is 15 min on a real node) fits the lab's short ResumeTimeout
        "GPUFLEET_SIM_PROGRAM_TIME_SCALE": "0.002",
    }
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    server.start()
    try:
        t0 = time.monotonic()
        server.wait_ready(url)
        token = (tmp_path / "tok").read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=20)
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        created = api.post("/api/v1/clusters", json={
            "project": "ml", "name": "hpc", "scheduler": "slurm", "provider": "sim", "size": 1,
            "acceptance_tests": False,  # hpc-000, the cluster's first node, is no lab node
        })  # fmt: skip
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        lab.wait_until(
            lambda: api.get(f"/api/v1/clusters/{cluster_id}/status").json()["status"] == "ready",
            timeout_s=30,
            what="the gpufleet cluster ready",
        )
        mode = api.put(
            f"/api/v1/clusters/{cluster_id}/autoscale",
            json={"mode": "slurm", "min_nodes": 0, "max_nodes": 4},
        )
        assert mode.status_code == 200, mode.text
        # From now on every new machine is accepted before it takes work, with a suite
        # quick enough for ResumeTimeout (which must cover boot and acceptance).
        accept = api.patch(f"/api/v1/clusters/{cluster_id}", json={
            "acceptance_tests": True,
            "acceptance_suite": {"checks": [
                {"kind": "dcgm-diag", "params": {"level": 2}}, {"kind": "nccl"},
            ]},
        })  # fmt: skip
        assert accept.status_code == 200, accept.text
        yield Gpufleet(
            api, url, token, cluster_id, tmp_path / "slurm-power.log", time.monotonic() - t0
        )
    finally:
        for action in ("resume", "suspend"):
            (power.calls_dir / f"then-{action}").unlink(missing_ok=True)
        server.stop()


def test_gpufleet_slurm_resume_as_the_resume_program_of_a_real_slurmctld(
    power: PowerLab, gpufleet: Gpufleet, tmp_path: Path
) -> None:
    """The shim as slurmctld runs it, against a real ``gpufleet server`` process: the
    resumed node is accepted before its job runs, and given back once idle."""
    lab, api, cluster_id, log = power.lab, gpufleet.api, gpufleet.cluster_id, gpufleet.log
    gpufleet.hand_on(power, "resume", tmp_path)
    srun: subprocess.Popen[str] | None = None
    try:
        before = len(power.calls())
        t1 = time.monotonic()
        srun = subprocess.Popen(
            ["srun", "-p", "cloud", "-N1", "--gres=gpu:1", "--chdir=/tmp", "hostname"],
            env=power.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        call = power.wait_for_call("resume", after=before, timeout_s=15)
        [node] = expand_nodes(call.hostlist)
        lab.wait_until(log.exists, timeout_s=20, what="gpufleet slurm resume logging its call")
        answered_s = time.monotonic() - t1
        [line, *_] = log.read_text().splitlines()
        print(f"gpufleet's log line: {line}")
        assert gpufleet.token not in line
        [action] = api.get(f"/api/v1/clusters/{cluster_id}/autoscale/actions").json()["items"]
        [job] = lab.run("squeue", "-h", "-p", "cloud", "-o", "%A").stdout.split()
        assert f" resume cluster=hpc hostlist={node} nodes=1 jobs={job} exit=0 " in line
        assert line.endswith(f" action={action['id']}")
        assert (action["source"], action["nodes"]) == ("slurm", [node])
        assert action["reasons"] == [f"Slurm resumes {node}", f"for job(s) {job}"]

        # The test plays the machine's boot: gpufleet accepts the machine through its
        # agent (slurmd not started: the job waits, allocated to the node); once the node
        # is in service, its slurmd starts and registers, and the job runs.
        lab.wait_until(
            lambda: gpufleet.node_in(node, "in_service"), timeout_s=RESUME_TIMEOUT_S,
            what=f"gpufleet's machine for {node} accepted",
        )  # fmt: skip
        listed = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        assert sorted(n["name"] for n in listed) == sorted(["hpc-000", node])  # no hpc-001
        waiting = lab.run("squeue", "-h", "-j", job, "-o", "%T %N").stdout.split()
        assert waiting == ["CONFIGURING", node], waiting  # not run before acceptance
        assert lab.node_states()[node] in ("mix#", "alloc#")
        lab.start_slurmd(node)
        out, err = srun.communicate(timeout=30)
        assert srun.returncode == 0, err
        assert out.strip()  # hostname, run on the node gpufleet resumed
        ran_s = time.monotonic() - t1

        # The autoscaler's next pass sees the node in service: the step up succeeded.
        lab.wait_until(
            lambda: [a["status"] for a in gpufleet.actions()] == ["succeeded"], timeout_s=20,
            what="the step up succeeded",
        )  # fmt: skip

        # Idle past SuspendTime: slurmctld runs the suspend program, gpufleet gives the
        # machine back; the test plays the machine going away (its slurmd stops).
        gpufleet.hand_on(power, "suspend", tmp_path)
        before = len(power.calls())
        power.wait_for_call("suspend", after=before, timeout_s=SUSPEND_TIME_S + 20)
        lab.wait_until(
            lambda: gpufleet.node_in(node, "removed"),
            timeout_s=30,
            what=f"gpufleet removing {node}",
        )
        lab.stop_slurmd(node)
        down, _up = gpufleet.actions()
        assert (down["kind"], down["source"], down["nodes"]) == ("scale_down", "slurm", [node])
        lab.wait_until(
            lambda: [a["status"] for a in gpufleet.actions()] == ["succeeded", "succeeded"],
            timeout_s=20, what="the step down succeeded",
        )  # fmt: skip
        assert "drain" not in lab.node_states()[node]  # no hold of gpufleet's left behind

        # The events tell the story, in order.
        story = gpufleet.story(node)
        print("\n".join(story))
        _in_order(story, [
            f"adding 1 node(s) ({node}) for slurm: Slurm resumes {node}",
            f"node {node}: provisioning → acceptance",
            f"started through agent (Slurm powers up {node}: checked before slurmd) on {node}",
            "acceptance (provisioning) passed",
            f"node {node}: acceptance → in_service",
            "→ succeeded",
            f"removing 1 node(s) ({node}) for slurm: Slurm powers down {node}",
            f"node {node}: in_service → removing",
            f"node {node}: removing → removed",
        ])  # fmt: skip
        print(
            f"server up and cluster ready in {gpufleet.setup_s:.1f} s; slurmctld ran the "
            f"wrapper and gpufleet's server took the resume {answered_s:.1f} s after srun; the "
            f"job ran by {ran_s:.1f} s; suspended and given back by {time.monotonic() - t1:.1f} s"
        )
    finally:
        if srun is not None and srun.poll() is None:
            srun.kill()
            srun.wait(timeout=10)


def test_a_resumed_node_that_fails_acceptance_hands_its_job_back(
    power: PowerLab, gpufleet: Gpufleet, tmp_path: Path
) -> None:
    """A machine that fails acceptance never runs the job: gpufleet cordons the node and
    drains it, and Slurm requeues the job at once, not at ResumeTimeout."""
    lab, api = power.lab, gpufleet.api
    gpufleet.hand_on(power, "resume", tmp_path)
    before = len(power.calls())
    job = lab.run(
        "sbatch", "--parsable", "-p", "cloud", "-N1", "--gres=gpu:1", "--chdir=/tmp",
        "--output=/dev/null", "--wrap", "true",
    ).stdout.strip()  # fmt: skip
    node = ""
    try:
        call = power.wait_for_call("resume", after=before, timeout_s=15)
        resumed = time.monotonic()
        [node] = expand_nodes(call.hostlist)

        def broken() -> bool:  # a double-bit ECC error on the new machine, before its tests
            listed = api.get("/api/v1/nodes", params={"cluster": gpufleet.cluster_id})
            ids = {n["name"]: n["id"] for n in listed.json()["items"]}
            if node not in ids:
                return False
            injected = api.post(
                f"/api/v1/nodes/{ids[node]}/faults", json={"signature": "xid-48", "gpu_index": 0}
            )
            return injected.status_code == 202

        lab.wait_until(broken, timeout_s=10, what=f"a fault injected on {node}'s machine")
        lab.wait_until(
            lambda: gpufleet.node_in(node, "cordoned"), timeout_s=RESUME_TIMEOUT_S,
            what=f"{node} failing acceptance",
        )  # fmt: skip
        lab.wait_until(
            lambda: "Restarts=1" in lab.run("scontrol", "-o", "show", "job", job).stdout,
            timeout_s=10, what=f"job {job} requeued",
        )  # fmt: skip
        requeued_s = time.monotonic() - resumed
        assert requeued_s < RESUME_TIMEOUT_S  # gpufleet's drain, not Slurm's timeout
        states = lab.node_states()
        assert states[node].startswith("drain"), states  # never took the job
        reason = lab.run("sinfo", "-h", "-n", node, "-o", "%E").stdout.strip()
        assert reason.startswith("gpufleet: "), reason
        story = gpufleet.story(node)
        print("\n".join(story))
        _in_order(story, [
            f"node {node}: provisioning → acceptance",
            "acceptance (provisioning) failed",
            f"node {node}: acceptance → cordoned",
        ])  # fmt: skip
        print(f"{node} failed acceptance; job {job} requeued {requeued_s:.1f} s after the "
              f"resume call (ResumeTimeout {RESUME_TIMEOUT_S} s); Slurm says {states[node]}: "
              f"{reason!r}")  # fmt: skip
    finally:
        lab.run("scancel", job, check=False)
        if node:
            lab.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
