"""``SlurmScheduler`` against the real Slurm lab (``slurm_lab``: slurmctld, 3 slurmd with
fake GPUs, slurmdbd), and its client against stand-in commands for what the lab cannot
be made to do on cue (hang, answer a JSON error body with exit code 0)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import (
    SchedJob,
    SchedNodeState,
    Scheduler,
    SupportsDown,
    SupportsDrain,
    SupportsJobsOnNodes,
    SupportsRequeue,
)
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.testing.slurm_lab import SlurmLab

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


# ------------------------------------------------------- stand-in commands (no lab)


def fake_bin(tmp_path: Path, **scripts: str) -> Path:
    """A folder of shell scripts named like Slurm commands, for ``SlurmConfig.bin_dir``."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


VERSION = 'if [ "$1" = --version ]; then echo "slurm $FAKE_VERSION"; exit 0; fi'


def test_implements_every_protocol() -> None:
    sched = SlurmScheduler()
    assert sched.kind == "slurm"
    for proto in (Scheduler, SupportsDrain, SupportsDown, SupportsRequeue, SupportsJobsOnNodes):
        assert isinstance(sched, proto)


async def test_version_is_detected_once_with_the_configured_env(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    bin_dir = fake_bin(tmp_path, sinfo=f'echo "$TZ $*" >> {calls}\n{VERSION}')
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": "22.05.8"}))
    assert str(await sched.version()) == "22.05.8"
    assert str(await sched.version()) == "22.05.8"
    assert calls.read_text() == "UTC --version\n"  # asked once; TZ forced to UTC


async def test_json_error_body_with_exit_0_raises(tmp_path: Path) -> None:
    body = '{"meta": {}, "errors": [{"error": "Unable to contact slurm controller", "errno": 1}]}'
    bin_dir = fake_bin(
        tmp_path,
        sinfo=f"{VERSION}\necho '{body}'",
        squeue=f"echo '{body}'",
    )
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": "22.05.8"}))
    with pytest.raises(DriverError, match=r"`sinfo --all --json` reported errors: Unable to"):
        await sched.list_nodes()
    with pytest.raises(DriverError, match=r"`squeue --all --json` reported errors"):
        await sched.pending_gpu_demand()


async def test_garbage_output_raises(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path, sinfo=f"{VERSION}\necho 'sinfo: oops'", squeue="echo '{}'")
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": "22.05.8"}))
    with pytest.raises(DriverError, match="could not read its output"):
        await sched.list_nodes()


async def test_hung_command_is_killed_and_raises(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path, sinfo="exec sleep 30")
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), timeout_s=0.3))
    with pytest.raises(DriverError, match=r"`sinfo --version` did not answer within 0.3 s"):
        await sched.list_nodes()


async def test_missing_command_raises(tmp_path: Path) -> None:
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(tmp_path / "nowhere")))
    with pytest.raises(DriverError, match=r"`sinfo --version` could not start"):
        await sched.pending_gpu_demand()


async def test_nonzero_exit_names_node_command_and_stderr(tmp_path: Path) -> None:
    bin_dir = fake_bin(
        tmp_path,
        sinfo=VERSION,
        scontrol='echo "slurm_load_node error: Invalid node name specified" >&2; exit 1',
        squeue=f"cat {FIXTURES / 'squeue-22.05-ref.json'}",
    )
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": "22.05.8"}))
    with pytest.raises(DriverError) as caught:
        await sched.jobs_on_node("nosuch")
    assert caught.value.message == (
        "slurm: node nosuch: `scontrol --oneliner show node nosuch` exited 1: "
        "slurm_load_node error: Invalid node name specified"
    )


async def test_a_reservation_ahead_sends_its_start_in_utc(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    bin_dir = fake_bin(tmp_path, scontrol=f'echo "$TZ $*" >> {calls}')
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir)))
    start = dt.datetime(2026, 12, 5, 9, 30, 15, 400, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    await sched.create_reservation(
        "maint", nodes=("n1", "n2"), duration_s=90, users=("root",), start=start
    )
    await sched.create_reservation("now", nodes=("n1",), duration_s=60, users=("root",))
    first, second = calls.read_text().splitlines()
    # scontrol reads StartTime in its own zone, which the driver pins to UTC.
    assert first == (
        "UTC create reservation ReservationName=maint Nodes=n1,n2 "
        "StartTime=2026-12-05T07:30:15 Duration=2 Users=root Flags=MAINT"
    )
    assert "StartTime=now Duration=1 " in second
    with pytest.raises(ValueError, match="must be aware"):
        await sched.create_reservation(
            "x", nodes=("n1",), duration_s=60, users=("root",), start=dt.datetime(2026, 12, 5)
        )


async def test_text_dialect_for_old_slurm(tmp_path: Path) -> None:
    """Before 21.08 there is no --json: nodes and jobs come from scontrol -o show."""
    nodes = FIXTURES / "scontrol-show-node-22.05-ref.txt"
    job = (
        "JobId=7 JobName=x UserId=alice(1000) Account=research JobState=RUNNING Reason=None "
        "NodeList=gpu1 NumNodes=1 TRES=cpu=1,node=1,gres/gpu=2 BatchFlag=1 Requeue=1"
    )
    bin_dir = fake_bin(
        tmp_path,
        sinfo=VERSION,
        scontrol=f'if [ "$3" = node ]; then cat {nodes}; else echo "{job}"; fi',
    )
    sched = SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": "20.11.9"}))
    listed = {n.name: n for n in await sched.list_nodes()}
    assert listed["gpu1"].job_ids == ("7",)
    assert listed["gpu1"].reason == "gpufleet: xid 79 on GPU3"
    assert listed["gpu2"].job_ids == ()


# ------------------------------------------- the rules, over stand-in scontrol/squeue

NODE_LINE = (
    "NodeName={name} Arch=x86_64 Gres=gpu:h100:8(S:0) State={state} Partitions=gpu "
    "CfgTRES=cpu=8,gres/gpu=8 AllocTRES={alloc}{reason}"
)


class StandIn:
    """scontrol and squeue that serve node lines and a job list from files and log every
    other call (``update``, ``requeue``) instead of acting."""

    def __init__(self, tmp_path: Path) -> None:
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.calls = tmp_path / "calls"
        self.calls.touch()
        self.set_jobs([])
        bin_dir = fake_bin(
            tmp_path,
            sinfo=VERSION,
            squeue=f"cat {self.state}/squeue.json",
            scontrol=(
                'if [ "$1 $2 $3" = "--oneliner show node" ]; then\n'
                f'  cat "{self.state}/node-$4" 2>/dev/null && exit 0\n'
                '  echo "Node $4 not found" >&2; exit 1\n'
                "fi\n"
                f"printf '%s|' \"$@\" >> {self.calls}; echo >> {self.calls}"
            ),
        )
        config = SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": "22.05.8"})
        self.sched = SlurmScheduler(config)

    def set_node(self, name: str, state: str, reason: str | None = None, alloc: str = "") -> None:
        suffix = f" Reason={reason} [root@2026-12-02T13:54:28]" if reason else ""
        line = NODE_LINE.format(name=name, state=state, alloc=alloc, reason=suffix)
        (self.state / f"node-{name}").write_text(line + "\n")

    def set_jobs(self, jobs: list[dict[str, object]]) -> None:
        (self.state / "squeue.json").write_text(json.dumps({"errors": [], "jobs": jobs}))

    def logged(self) -> list[list[str]]:
        return [line.rstrip("|").split("|") for line in self.calls.read_text().splitlines()]


@pytest.fixture
def standin(tmp_path: Path) -> StandIn:
    return StandIn(tmp_path)


async def test_drain_holds_with_drain_never_down(standin: StandIn) -> None:
    standin.set_node("n1", "MIXED", alloc="cpu=1,gres/gpu=2")
    await standin.sched.drain("n1", reason="gpufleet: xid 79")
    assert standin.logged() == [["update", "nodename=n1", "state=drain", "reason=gpufleet: xid 79"]]


async def test_drain_keeps_an_existing_reason(standin: StandIn) -> None:
    standin.set_node("n1", "IDLE+DRAIN", reason="hc: ECC errors")
    await standin.sched.drain("n1", reason="gpufleet: xid 79")
    assert standin.logged() == []  # already drained: left as it is, with its reason
    standin.set_node("n2", "DOWN+NOT_RESPONDING", reason="Not responding")
    await standin.sched.drain("n2", reason="gpufleet: xid 79")
    assert standin.logged() == [["update", "nodename=n2", "state=drain", "reason=Not responding"]]


async def test_drain_needs_a_reason(standin: StandIn) -> None:
    standin.set_node("n1", "IDLE")
    with pytest.raises(DriverError, match="node n1: a drain needs a reason"):
        await standin.sched.drain("n1", reason=" ")


async def test_resume_of_an_idle_node_succeeds(standin: StandIn) -> None:
    standin.set_node("n1", "IDLE")
    await standin.sched.resume("n1")
    assert standin.logged() == []


async def test_resume_refuses_a_foreign_drain(standin: StandIn) -> None:
    standin.set_node("n1", "IDLE+DRAIN", reason="admin: bad fan")
    with pytest.raises(DriverError) as caught:
        await standin.sched.resume("n1")
    assert "refusing to resume node n1: its reason 'admin: bad fan'" in caught.value.message
    assert standin.logged() == []


async def test_resume_clears_our_drain(standin: StandIn) -> None:
    standin.set_node("n1", "MIXED+DRAIN", reason="gpufleet: xid 79", alloc="gres/gpu=1")
    await standin.sched.resume("n1")
    assert standin.logged() == [["update", "nodename=n1", "state=resume"]]


async def test_down_drains_first_so_return_to_service_keeps_it_out(standin: StandIn) -> None:
    standin.set_node("n1", "ALLOCATED", alloc="gres/gpu=8")
    await standin.sched.down("n1", reason="gpufleet: repair")
    assert standin.logged() == [
        ["update", "nodename=n1", "state=drain", "reason=gpufleet: repair"],
        ["update", "nodename=n1", "state=down", "reason=gpufleet: repair"],
    ]


def job(job_id: int, nodes: str, **fields: object) -> dict[str, object]:
    return {
        "job_id": job_id,
        "job_state": "RUNNING",
        "nodes": nodes,
        "user_name": "alice",
        "tres_alloc_str": "cpu=1,gres/gpu=1",
        "batch_flag": True,
        "requeue": True,
        **fields,
    }


async def test_requeue_jobs(standin: StandIn) -> None:
    standin.set_node("n1", "MIXED", alloc="gres/gpu=2")
    standin.set_jobs(
        [job(11, "n1"), job(12, "n[1-2]"), job(13, "n2"), job(14, "n1", job_state="PENDING")]
    )
    assert await standin.sched.requeue_jobs("n1") == ["11", "12"]
    assert standin.logged() == [["requeue", "11,12"]]


async def test_requeue_refuses_all_when_one_cannot_be(standin: StandIn) -> None:
    standin.set_node("n1", "MIXED", alloc="gres/gpu=2")
    standin.set_jobs([job(11, "n1"), job(12, "n1", requeue=False)])
    with pytest.raises(DriverError, match=r"node n1: cannot requeue job 12: .*--no-requeue"):
        await standin.sched.requeue_jobs("n1")
    standin.set_jobs([job(11, "n1"), job(15, "n1", batch_flag=False)])
    with pytest.raises(DriverError, match="job 15: it is not a batch job"):
        await standin.sched.requeue_jobs("n1")
    assert standin.logged() == []


async def test_unknown_node_raises_never_an_empty_list(standin: StandIn) -> None:
    with pytest.raises(DriverError, match=r"node nosuch: .* exited 1: Node nosuch not found"):
        await standin.sched.jobs_on_node("nosuch")
    with pytest.raises(DriverError, match="node nosuch"):
        await standin.sched.requeue_jobs("nosuch")


# --------------------------------------------------------------- the real lab (22.05)

ACCOUNTING_S = 40.0  # sacct sees a job some seconds after it ends; users settle in 1-4 s


class Lab:
    """The session's lab plus what one test needs: a scheduler on it, sbatch, and a
    teardown that cancels every job and resumes every node, so tests do not leak."""

    def __init__(self, lab: SlurmLab, *, use_json: bool | None = None) -> None:
        self.lab = lab
        self.sched = SlurmScheduler(SlurmConfig(env=lab.env(), use_json=use_json))

    def sbatch(self, *args: str) -> str:
        out = self.lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args)
        return out.stdout.strip().split(";")[0]

    def wait_running(self, job_id: str) -> None:
        def running() -> bool:
            out = self.lab.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
            return out.stdout.strip() == "RUNNING"

        self.lab.wait_until(running, timeout_s=20, what=f"job {job_id} RUNNING")

    def job_state(self, job_id: str) -> str:
        return self.lab.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()

    def scontrol_state(self, node: str) -> str:
        line = self.lab.run("scontrol", "-o", "show", "node", node).stdout
        return line.split(" State=", 1)[1].split()[0]

    def clean(self) -> None:
        self.lab.reset()


@pytest.fixture(params=[None, False], ids=["json", "text"])
def lab_any(slurm_lab: SlurmLab, request: pytest.FixtureRequest) -> Iterator[Lab]:
    """The lab, read through JSON (22.05 has it) and through scontrol text."""
    lab = Lab(slurm_lab, use_json=request.param)
    yield lab
    lab.clean()


@pytest.fixture
def lab(slurm_lab: SlurmLab) -> Iterator[Lab]:
    lab = Lab(slurm_lab)
    yield lab
    lab.clean()


@pytest.mark.slow
async def test_lab_nodes_with_gres(lab_any: Lab) -> None:
    assert str(await lab_any.sched.version()) == lab_any.lab.version
    nodes = await lab_any.sched.list_nodes()
    assert [(n.name, n.state, n.reason, n.gpus, n.gpus_allocated, n.job_ids) for n in nodes] == [
        (name, SchedNodeState.IDLE, None, 8, 0, ()) for name in lab_any.lab.node_names
    ]


@pytest.mark.slow
async def test_lab_drain_resume_round_trip(lab: Lab) -> None:
    await lab.sched.drain("lab-001", reason="gpufleet: xid 79 on GPU3")
    assert lab.scontrol_state("lab-001") == "IDLE+DRAIN"  # held by DRAIN, not DOWN
    reasons = lab.lab.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout.splitlines()
    assert reasons == ["lab-001|gpufleet: xid 79 on GPU3"]
    await lab.sched.drain("lab-001", reason="gpufleet: again")  # idempotent, reason kept
    (node,) = [n for n in await lab.sched.list_nodes() if n.name == "lab-001"]
    assert (node.state, node.reason) == (SchedNodeState.DRAINED, "gpufleet: xid 79 on GPU3")
    await lab.sched.resume("lab-001")
    assert lab.lab.wait_for_node_state("lab-001", "idle", timeout_s=20) == "idle"
    (node,) = [n for n in await lab.sched.list_nodes() if n.name == "lab-001"]
    assert (node.state, node.reason) == (SchedNodeState.IDLE, None)


@pytest.mark.slow
async def test_lab_resume_of_an_idle_node_succeeds(lab: Lab) -> None:
    await lab.sched.resume("lab-002")  # scontrol itself would refuse: "Invalid node state"
    assert lab.scontrol_state("lab-002") == "IDLE"


@pytest.mark.slow
async def test_lab_foreign_drain_is_refused_and_kept(lab: Lab) -> None:
    lab.lab.run("scontrol", "update", "nodename=lab-003", "state=drain", "reason=admin: bad fan")
    with pytest.raises(DriverError) as caught:
        await lab.sched.resume("lab-003")
    assert "refusing to resume node lab-003: its reason 'admin: bad fan'" in caught.value.message
    await lab.sched.drain("lab-003", reason="gpufleet: xid 79")
    (node,) = [n for n in await lab.sched.list_nodes() if n.name == "lab-003"]
    assert (node.state, node.reason) == (SchedNodeState.DRAINED, "admin: bad fan")


@pytest.mark.slow
async def test_lab_jobs_on_node(lab_any: Lab) -> None:
    job_id = lab_any.sbatch("--uid=nobody", "--gres=gpu:1", "-w", "lab-002", "--wrap=sleep 30")
    lab_any.wait_running(job_id)
    (job,) = await lab_any.sched.jobs_on_node("lab-002")
    assert (job.job_id, job.user, job.state, job.nodes, job.gpus) == (
        job_id,
        "nobody",
        "RUNNING",
        ("lab-002",),
        1,
    )
    assert job.started_at is not None and job.extra["partition"] == "gpu"
    assert await lab_any.sched.jobs_on_node("lab-001") == []
    # Many nodes in one read (Cluster Autoscaler's DeleteNodes): the same answers.
    assert await lab_any.sched.jobs_on_nodes(["lab-002", "lab-001", "nosuch"]) == {
        "lab-002": [job],
        "lab-001": [],
        "nosuch": None,
    }
    nodes = {n.name: n for n in await lab_any.sched.list_nodes()}
    assert nodes["lab-002"].job_ids == (job_id,)
    assert nodes["lab-002"].gpus_allocated == 1
    assert nodes["lab-002"].state is SchedNodeState.MIXED
    await lab_any.sched.drain("lab-002", reason="gpufleet: test")
    nodes = {n.name: n for n in await lab_any.sched.list_nodes()}
    assert nodes["lab-002"].state is SchedNodeState.DRAINING  # its job goes on
    assert lab_any.job_state(job_id) == "RUNNING"


@pytest.mark.slow
async def test_lab_pending_gpu_demand(lab_any: Lab) -> None:
    assert await lab_any.sched.pending_gpu_demand() == 0
    blocker = lab_any.sbatch("--gres=gpu:8", "-w", "lab-003", "--wrap=sleep 60")
    lab_any.wait_running(blocker)
    lab_any.sbatch("--uid=nobody", "-N", "3", "--gres=gpu:8", "--wrap=true")  # waits: Resources
    lab_any.sbatch("-H", "--gres=gpu:4", "--wrap=true")  # held: no demand
    assert await lab_any.sched.pending_gpu_demand() == 24


@pytest.mark.slow
async def test_lab_accounting_since(lab: Lab) -> None:
    before = lab.sbatch("--wrap=true")
    lab.lab.wait_until(lambda: lab.job_state(before) == "", timeout_s=20, what="first job ends")
    await asyncio.sleep(1.1)  # sacct times are whole seconds
    since = dt.datetime.now(dt.UTC)
    ok = lab.sbatch("--uid=nobody", "--gres=gpu:2", "-N", "2", "--wrap=srun true")
    failed = lab.sbatch("--uid=daemon", "--gres=gpu:h100:1", "--wrap=exit 3")
    found: dict[str, SchedJob] = {}

    async def recorded() -> bool:
        found.clear()
        found.update({j.job_id: j for j in await lab.sched.accounting_since(since)})
        users = {found[i].user for i in (ok, failed) if i in found}
        return users == {"nobody", "daemon"}  # 22.05 records uid 0 for a moment

    deadline = asyncio.get_running_loop().time() + ACCOUNTING_S
    while not await recorded():
        assert asyncio.get_running_loop().time() < deadline, f"sacct did not show them: {found}"
        await asyncio.sleep(0.5)
    assert before not in found  # ended before ``since``
    assert (found[ok].state, found[ok].exit_code, found[ok].gpus) == ("COMPLETED", 0, 4)  # 2 × 2
    assert len(found[ok].nodes) == 2 and found[ok].user == "nobody"
    assert "0" in found[ok].extra["steps"].split(",")  # the srun step, folded in
    assert (found[failed].state, found[failed].exit_code, found[failed].gpus) == ("FAILED", 3, 1)
    ends = [j.ended_at or since for j in await lab.sched.accounting_since(since)]
    assert ends == sorted(ends)  # oldest first


@pytest.mark.slow
async def test_lab_down_kills_jobs_and_the_node_stays_held(lab: Lab) -> None:
    job_id = lab.sbatch("--gres=gpu:1", "-w", "lab-001", "--wrap=sleep 60")
    lab.wait_running(job_id)
    await lab.sched.down("lab-001", reason="gpufleet: repair")
    # ReturnToService=2 brings it back from DOWN at once: the drain keeps it out.
    lab.lab.wait_until(
        lambda: lab.scontrol_state("lab-001") == "IDLE+DRAIN", timeout_s=20, what="back, held"
    )
    assert lab.job_state(job_id) in {"PENDING", "COMPLETING"}  # killed, requeued by Slurm
    assert await lab.sched.jobs_on_node("lab-001") == []
    await lab.sched.resume("lab-001")
    assert lab.lab.wait_for_node_state("lab-001", "idle", timeout_s=20) == "idle"


@pytest.mark.slow
async def test_lab_requeue_jobs(lab: Lab) -> None:
    job_id = lab.sbatch("--gres=gpu:1", "-w", "lab-001", "--wrap=sleep 60")
    lab.wait_running(job_id)
    assert await lab.sched.requeue_jobs("lab-001") == [job_id]
    requeued = "job back in the queue (COMPLETING, then PENDING)"
    lab.lab.wait_until(lambda: lab.job_state(job_id) == "PENDING", timeout_s=20, what=requeued)
    assert await lab.sched.requeue_jobs("lab-001") == []


@pytest.mark.slow
async def test_lab_requeue_refuses_a_no_requeue_job(lab: Lab) -> None:
    job_id = lab.sbatch("--no-requeue", "--gres=gpu:1", "-w", "lab-002", "--wrap=sleep 60")
    lab.wait_running(job_id)
    with pytest.raises(DriverError, match=f"node lab-002: cannot requeue job {job_id}"):
        await lab.sched.requeue_jobs("lab-002")
    assert lab.job_state(job_id) == "RUNNING"


@pytest.mark.slow
async def test_lab_failing_commands_raise(lab: Lab) -> None:
    with pytest.raises(DriverError) as caught:
        await lab.sched.drain("nosuch", reason="gpufleet: x")
    assert caught.value.message == (
        "slurm: node nosuch: `scontrol --oneliner show node nosuch` exited 1: Node nosuch not found"
    )
    with pytest.raises(DriverError, match="node nosuch"):
        await lab.sched.jobs_on_node("nosuch")
    with pytest.raises(DriverError, match="node nosuch"):
        await lab.sched.resume("nosuch")
