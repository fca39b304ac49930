"""Pending work from Slurm: the pure parser on recorded ``squeue --json`` output of the lab
(``squeue-pending-22.05.json``, and the same moment as ``scontrol -o show job`` text) and
on variants of newer schemas, and the driver's read path against stand-in commands.
The lab itself is in ``test_lab_pending.py``."""

from __future__ import annotations

import copy
import datetime as dt
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from gpufleet.core.autoscale import PendingWork
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SupportsPendingWork
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.schedulers.slurm.parsing import (
    MAX_ARRAY_ITEMS,
    WAITING_FOR_NODES,
    array_task_ids,
    parse_jobs_json,
    parse_scontrol_jobs,
    pending_gpu_demand,
    pending_work,
    reason_word,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
PENDING_JSON = FIXTURES / "squeue-pending-22.05.json"
PENDING_TEXT = FIXTURES / "scontrol-show-job-pending-22.05.txt"
NOW = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)  # the fallback; never used by a recorded job
SUBMITTED = dt.datetime(2026, 12, 4, 16, 41, 13, tzinfo=dt.UTC)  # every pending job's

# What the recorded lab moment waits for (README.md, squeue-pending-22.05.json): three
# jobs fill the nodes (8, 6, 6 of 8 GPUs), lab-003 is then drained.
EXPECTED = [
    PendingWork("700018", 4, SUBMITTED),  # --gres=gpu:4, Resources
    PendingWork("700019", 16, SUBMITTED),  # -N 2 --gres=gpu:8, user nobody, Priority
    PendingWork("700020", 3, SUBMITTED),  # --gpus=3 (tres_per_job)
    PendingWork("700021", 6, SUBMITTED),  # --gpus-per-node=h100:2 -N 3
    PendingWork("700022_0", 4, SUBMITTED),  # --array=0-5%2 --gres=gpu:4: two at once
    PendingWork("700022_1", 4, SUBMITTED),
    PendingWork("700023", 3, SUBMITTED),  # --gpus-per-task=1 -n 3
    PendingWork("700030", 3, SUBMITTED),  # -N 3, ReqNodeNotAvail (lab-003 draining)
]
NOT_COUNTED = {
    "700024": "JobHeldUser",  # -H
    "700025": "BeginTime",  # --begin=now+3600
    "700026": "Dependency",  # --dependency=afterok:<running job>
    "700027": "Priority",  # -w lab-001: pinned to a busy node
    "700028": "Priority",  # no GPU asked for
    "700029": "ReqNodeNotAvail",  # --reservation=maint-3
}


def fixture_jobs() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(PENDING_JSON.read_text())
    return doc


def one_job(**fields: Any) -> str:
    """The recorded 700018 (PENDING, Resources, --gres=gpu:4) with ``fields`` changed
    (None: removed), as a whole ``squeue --json`` answer."""
    doc = fixture_jobs()
    job = copy.deepcopy(next(j for j in doc["jobs"] if j["job_id"] == 700018))
    for key, value in fields.items():
        if value is None:
            job.pop(key, None)
        else:
            job[key] = value
    doc["jobs"] = [job]
    return json.dumps(doc)


def number(value: int, *, is_set: bool = True) -> dict[str, Any]:
    """23.02+'s (data_parser) shape of a number or a time."""
    return {"set": is_set, "infinite": False, "number": value}


# ------------------------------------------------------------ recorded (22.05)


def test_recorded_pending_jobs_of_the_lab() -> None:
    jobs = parse_jobs_json(PENDING_JSON.read_text())
    assert pending_work(jobs, now=NOW) == EXPECTED
    assert pending_gpu_demand(jobs) == sum(w.gpus for w in EXPECTED) == 43
    by_id = {j.job_id: j for j in jobs}
    for job_id, reason in NOT_COUNTED.items():
        job = by_id[job_id]
        assert (job.state, job.state_reason, job.waits_for_nodes) == ("PENDING", reason, False)
    assert by_id["700027"].required_nodes == ("lab-001",)
    assert by_id["700028"].gpus == 0
    assert by_id["700029"].reservation == "maint-3"
    assert by_id["700025"].eligible_at == SUBMITTED + dt.timedelta(hours=1)
    assert by_id["700024"].eligible_at is None  # held: not eligible at all
    # 22.05 ignores --states=PENDING: the running and the finished jobs are there too.
    assert {j.state for j in jobs} == {"CANCELLED", "RUNNING", "PENDING"}


def test_recorded_text_gives_the_same_work() -> None:
    """``scontrol -o show job`` of the same moment (old Slurm, no JSON): its reason reads
    ``ReqNodeNotAvail,_UnavailableNodes:lab-003`` and still counts."""
    jobs = parse_scontrol_jobs(PENDING_TEXT.read_text())
    assert pending_work(jobs, now=NOW) == EXPECTED
    by_id = {j.job_id: j for j in jobs}
    assert by_id["700030"].state_reason == "ReqNodeNotAvail,_UnavailableNodes:lab-003"
    assert by_id["700027"].required_nodes == ("lab-001",)
    assert by_id["700029"].reservation == "maint-3"


def test_older_recordings_wait_since_their_eligible_time() -> None:
    jobs = parse_jobs_json((FIXTURES / "squeue-22.05.json").read_text())
    at = dt.datetime.fromtimestamp
    assert pending_work(jobs, now=NOW) == [
        PendingWork("5007", 16, at(1796245681, dt.UTC)),
        PendingWork("5008_0", 8, at(1796245682, dt.UTC)),  # eligible a second after submit
        PendingWork("5008_1", 8, at(1796245682, dt.UTC)),
    ]
    rest = parse_jobs_json((FIXTURES / "rest-jobs-22.05.json").read_text())
    assert [(w.id, w.gpus) for w in pending_work(rest, now=NOW)] == [
        ("151003", 16),
        ("151004_0", 8),
        ("151004_1", 8),
    ]


def test_23_02_reference_numbers_are_objects() -> None:
    jobs = parse_jobs_json((FIXTURES / "squeue-23.02-ref.json").read_text())
    # 526: Resources, tres_per_job gres/gpu:8; 527: requeued, BeginTime: not counted.
    assert pending_work(jobs, now=NOW) == [
        PendingWork("526", 8, dt.datetime.fromtimestamp(1755290350, dt.UTC))
    ]


# --------------------------------------------------------------------- variants


@pytest.mark.parametrize(
    ("fields", "gpus"),
    [
        ({"tres_req_str": None, "tres_per_node": "gres:gpu:4"}, 4),
        ({"tres_req_str": None, "tres_per_node": "gres/gpu:h100:2", "node_count": number(3)}, 6),
        ({"tres_req_str": None, "tres_per_node": "gpu:8", "node_count": 2}, 16),
        ({"tres_req_str": None, "tres_per_node": None, "tres_per_job": "gres:gpu:3"}, 3),
        ({"tres_req_str": None, "tres_per_node": "", "tres_per_job": "gres/gpu:a100:5"}, 5),
        (
            {"tres_req_str": None, "tres_per_node": None, "tres_per_task": "gres/gpu:1"}
            | {"tasks": number(4)},
            4,
        ),
        ({"tres_req_str": "cpu=2,node=2,gres/gpu:h100=12", "tres_per_node": None}, 12),
        ({"tres_req_str": None, "tres_per_node": None}, 0),  # no GPU: not work for GPUs
    ],
)
def test_gpus_asked_for_in_every_spelling(fields: dict[str, Any], gpus: int) -> None:
    jobs = parse_jobs_json(one_job(**fields))
    assert [w.gpus for w in pending_work(jobs, now=NOW)] == ([gpus] if gpus else [])


def test_newer_schema_numbers_times_and_state_lists() -> None:
    text = one_job(
        job_id=number(42),
        job_state=["PENDING", "REQUEUED"],
        submit_time=number(1796402000),
        eligible_time=number(1796402100),
        node_count=number(1),
        required_nodes=None,
        resv_name=None,
    )
    assert pending_work(parse_jobs_json(text), now=NOW) == [
        PendingWork("42", 4, dt.datetime.fromtimestamp(1796402100, dt.UTC))
    ]
    unset = one_job(submit_time=number(1796402000), eligible_time=number(0, is_set=False))
    (work,) = pending_work(parse_jobs_json(unset), now=NOW)
    assert work.since == dt.datetime.fromtimestamp(1796402000, dt.UTC)


def test_missing_fields_are_empty_and_no_time_at_all_is_now() -> None:
    bare = {"job_id": 9, "job_state": "PENDING", "tres_per_node": "gres:gpu:2"}
    text = json.dumps({"jobs": [bare], "errors": []})
    (job,) = parse_jobs_json(text)
    assert (job.state_reason, job.submitted_at, job.eligible_at, job.required_nodes) == (
        "None",
        None,
        None,
        (),
    )
    assert pending_work([job], now=NOW) == [PendingWork("9", 2, NOW)]


@pytest.mark.parametrize(
    "reason", ["None", "Resources", "Priority", "ReqNodeNotAvail", "ReqNodeNotAvail, x"]
)
def test_reasons_more_nodes_would_cure(reason: str) -> None:
    assert pending_work(parse_jobs_json(one_job(state_reason=reason)), now=NOW) != []


@pytest.mark.parametrize(
    "reason",
    [
        "JobHeldUser",
        "JobHeldAdmin",
        "launch failed requeued held",
        "Dependency",
        "DependencyNeverSatisfied",
        "BeginTime",
        "QOSMaxGRESPerUser",
        "QOSGrpGRES",
        "AssocGrpGRES",
        "AssocMaxJobsLimit",
        "AccountingPolicy",
        "Licenses",
        "JobArrayTaskLimit",
        "Reservation",
        "PartitionDown",
        "PartitionInactive",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidQOS",
        "Cleaning",
        "PowerUpNode",
    ],
)
def test_reasons_more_nodes_would_not_cure(reason: str) -> None:
    assert reason_word(reason) not in WAITING_FOR_NODES
    assert pending_work(parse_jobs_json(one_job(state_reason=reason)), now=NOW) == []


def test_pinned_reserved_and_not_pending_jobs_do_not_count() -> None:
    for fields in (
        {"required_nodes": "lab-[001-002]"},
        {"resv_name": "maint-3"},
        {"job_state": "RUNNING", "nodes": "lab-001"},
        {"job_state": "COMPLETING"},
    ):
        assert pending_work(parse_jobs_json(one_job(**fields)), now=NOW) == [], fields


def test_arrays_give_one_item_per_task_that_could_start() -> None:
    throttled = one_job(array_job_id=7, array_task_string="3,5-9:2%2")
    assert [w.id for w in pending_work(parse_jobs_json(throttled), now=NOW)] == [
        "700018_3",
        "700018_5",
    ]
    free = one_job(array_task_string="0-15:4")
    assert [w.id for w in pending_work(parse_jobs_json(free), now=NOW)] == [
        f"700018_{t}" for t in (0, 4, 8, 12)
    ]
    huge = parse_jobs_json(one_job(array_task_string="0-99999"))
    assert len(pending_work(huge, now=NOW)) == MAX_ARRAY_ITEMS
    assert pending_gpu_demand(huge) == 4 * 100_000  # the total is not capped


def test_array_task_ids() -> None:
    assert array_task_ids("0-9%2", limit=2) == ["0", "1"]
    assert array_task_ids("1,3,5-7", limit=10) == ["1", "3", "5", "6", "7"]
    assert array_task_ids("0-15:4", limit=10) == ["0", "4", "8", "12"]
    for bad in ("5-1", "x", "1-", "0-9:0", "0-9:x"):
        with pytest.raises(ValueError, match="array"):
            array_task_ids(bad, limit=10)


def test_a_bad_array_string_names_the_job() -> None:
    with pytest.raises(ValueError, match=r"^job 700018: array '1-x'"):
        parse_jobs_json(one_job(array_task_string="1-x"))


# ------------------------------------------------- the driver, stand-in commands


def fake_bin(tmp_path: Path, **scripts: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


VERSION = 'if [ "$1" = --version ]; then echo "slurm $FAKE_VERSION"; exit 0; fi'


def scheduler(bin_dir: Path, version: str) -> SlurmScheduler:
    return SlurmScheduler(SlurmConfig(bin_dir=str(bin_dir), env={"FAKE_VERSION": version}))


async def test_driver_reads_squeue_pending_json(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    bin_dir = fake_bin(tmp_path, sinfo=VERSION, squeue=f'echo "$*" >> {calls}\ncat {PENDING_JSON}')
    sched = scheduler(bin_dir, "22.05.8")
    assert isinstance(sched, SupportsPendingWork)
    assert await sched.pending_work() == EXPECTED
    assert calls.read_text() == "--all --json --states=PENDING\n"


async def test_driver_reads_scontrol_text_on_old_slurm(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path, sinfo=VERSION, scontrol=f"cat {PENDING_TEXT}")
    assert await scheduler(bin_dir, "20.11.9").pending_work() == EXPECTED


async def test_driver_raises_when_the_queue_cannot_be_read(tmp_path: Path) -> None:
    down = 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1'
    bin_dir = fake_bin(tmp_path, sinfo=VERSION, squeue=down)
    with pytest.raises(DriverError) as caught:
        await scheduler(bin_dir, "22.05.8").pending_work()
    assert caught.value.message == (
        "slurm: `squeue --all --json --states=PENDING` exited 1: "
        "slurm_load_jobs error: Unable to contact slurm controller"
    )
    body = '{"errors": [{"error": "Unable to contact slurm controller", "errno": 1}], "jobs": []}'
    bin_dir = fake_bin(tmp_path, squeue=f"echo '{body}'")
    with pytest.raises(DriverError, match="reported errors: Unable to contact slurm controller"):
        await scheduler(bin_dir, "22.05.8").pending_work()
    bin_dir = fake_bin(tmp_path, squeue="echo 'squeue: oops'")
    with pytest.raises(DriverError, match="could not read its output"):
        await scheduler(bin_dir, "22.05.8").pending_work()
