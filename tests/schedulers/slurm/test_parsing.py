"""The Slurm parsers on recorded output (``*-22.05.*``: the lab, Slurm 22.05.8) and on
samples derived from the reference notes and published outputs (``*-ref.*``)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from gpufleet.schedulers.base import SchedNodeState
from gpufleet.schedulers.slurm.parsing import (
    SlurmReportedError,
    json_errors,
    map_node_state,
    parse_jobs_json,
    parse_key_values,
    parse_nodes_json,
    parse_sacct,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    pending_gpu_demand,
    split_node_state,
)
from gpufleet.schedulers.slurm.values import (
    SlurmVersion,
    count_array_tasks,
    expand_hostlist,
    format_time,
    parse_exit_code,
    parse_gres_gpus,
    parse_time,
    parse_tres_gpus,
    parse_version,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


S = SchedNodeState


# ------------------------------------------------------------------------ values


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm 22.05.8", SlurmVersion(22, 5, 8)),
        ("slurm-wlm 22.05.8\n", SlurmVersion(22, 5, 8)),
        ("slurm 24.05.0-0rc1", SlurmVersion(24, 5, 0)),
        ("slurm 23.11", SlurmVersion(23, 11, 0)),
    ],
)
def test_parse_version(text: str, expected: SlurmVersion) -> None:
    assert parse_version(text) == expected


def test_version_features() -> None:
    assert parse_version("slurm 22.05.8").has_json
    assert not parse_version("slurm 22.05.8").has_data_parser
    assert parse_version("slurm 23.02.0").has_data_parser
    assert not parse_version("slurm 20.11.9").has_json
    assert str(SlurmVersion(22, 5, 8)) == "22.05.8"


@pytest.mark.parametrize("text", ["", "sinfo: command not found", "slurm x.y"])
def test_parse_version_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm version"):
        parse_version(text)


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:h100:8", 8),
        ("gpu:8(S:0-1)", 8),
        ("gpu:h100:8(IDX:0-7)", 8),
        ("gpu:h100:3(IDX:0,2-3)", 3),
        ("gpu:h100:0(IDX:N/A)", 0),
        ("gpu:a100:4,gpu:v100:2", 6),
        ("tmpsize:7T,gpu:l40s:4(S:0-1)", 4),
        ("gpu:l40s:1(IDX:0),tmpsize:10737418240", 1),
        ("mps:200", 0),
        ("gres:gpu:1", 1),  # 22.05 tres_per_node
        ("gres/gpu:2", 2),  # 23.02+ tres_per_node
        ("gres/gpu:h100:2", 2),
        ("gres/gpu=3", 3),
        ("gpu", 1),
        ("gpu:h100", 1),
        ("(null)", 0),
        ("", 0),
        ("N/A", 0),
        (None, 0),
    ],
)
def test_parse_gres_gpus(gres: str | None, gpus: int) -> None:
    assert parse_gres_gpus(gres) == gpus


@pytest.mark.parametrize("gres", ["gpu:h100:x8", "gpu:8(S:0", "gpu:8)"])
def test_parse_gres_rejects_garbage(gres: str) -> None:
    with pytest.raises(ValueError, match=r"GRES|brackets"):
        parse_gres_gpus(gres)


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("billing=1,cpu=1,gres/gpu:h100=2,gres/gpu=2,mem=1000M,node=1", 2),
        ("cpu=2,mem=4G,gres/gpu=1,gres/gpu:l40s=1,gres/tmpsize=10737418240", 1),
        ("cpu=1,gres/gpu:a100=2,gres/gpu:v100=1", 3),  # only typed: summed
        ("billing=1,cpu=1,node=1", 0),
        ("", 0),
        (None, 0),
    ],
)
def test_parse_tres_gpus(tres: str | None, gpus: int) -> None:
    assert parse_tres_gpus(tres) == gpus


@pytest.mark.parametrize("tres", ["cpu=1,gres/gpu=two", "cpu"])
def test_parse_tres_rejects_garbage(tres: str) -> None:
    with pytest.raises(ValueError, match="TRES"):
        parse_tres_gpus(tres)


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("lab-002", ("lab-002",)),
        ("lab-[001-003]", ("lab-001", "lab-002", "lab-003")),
        ("gpu[1-2,5],login1", ("gpu1", "gpu2", "gpu5", "login1")),
        ("r[1-2]n[08-09]", ("r1n08", "r1n09", "r2n08", "r2n09")),
        ("n[9-11]", ("n9", "n10", "n11")),
        ("", ()),
        ("None assigned", ()),
        ("(null)", ()),
    ],
)
def test_expand_hostlist(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(hostlist) == names


@pytest.mark.parametrize("hostlist", ["n[1-", "n[3-1]", "n[a-b]", "n]1["])
def test_expand_hostlist_rejects_garbage(hostlist: str) -> None:
    with pytest.raises(ValueError, match=r"hostlist|brackets"):
        expand_hostlist(hostlist)


def test_count_array_tasks() -> None:
    assert count_array_tasks("0-9%2") == (10, 2)
    assert count_array_tasks("1,3,5-7") == (5, None)
    assert count_array_tasks("0-15:4") == (4, None)
    assert count_array_tasks("") == (1, None)
    with pytest.raises(ValueError, match="array"):
        count_array_tasks("5-1")


def test_parse_time_forms() -> None:
    t = dt.datetime(2026, 12, 2, 13, 54, 54, tzinfo=dt.UTC)
    assert parse_time("2026-12-02T13:54:54") == t
    assert parse_time(int(t.timestamp())) == t
    assert parse_time(str(int(t.timestamp()))) == t
    assert parse_time({"set": True, "infinite": False, "number": int(t.timestamp())}) == t
    for unset in ("Unknown", "None", "", 0, None, {"set": False, "number": 5}):
        assert parse_time(unset) is None
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")
    assert format_time(t) == "2026-12-02T13:54:54"
    assert format_time(t.astimezone(dt.timezone(dt.timedelta(hours=2)))) == "2026-12-02T13:54:54"


def test_parse_exit_code() -> None:
    assert parse_exit_code("0:0") == (0, 0)
    assert parse_exit_code("3:0") == (3, 0)
    assert parse_exit_code("0:9") == (137, 9)
    assert parse_exit_code("") == (None, 0)
    with pytest.raises(ValueError, match="ExitCode"):
        parse_exit_code("x:0")


# ------------------------------------------------------------------- node states


@pytest.mark.parametrize(
    ("state", "flags", "expected"),
    [
        ("idle", [], S.IDLE),
        ("allocated", [], S.ALLOCATED),
        ("mixed", [], S.MIXED),
        ("mixed", ["DRAIN"], S.DRAINING),
        ("allocated", ["DRAIN"], S.DRAINING),
        ("idle", ["DRAIN"], S.DRAINED),
        ("idle", ["DRAIN", "COMPLETING"], S.DRAINING),
        ("idle", ["COMPLETING"], S.ALLOCATED),
        ("down", ["DRAIN"], S.DOWN),
        ("down", ["NOT_RESPONDING"], S.DOWN),
        ("idle", ["NOT_RESPONDING"], S.UNKNOWN),
        ("mixed", ["CLOUD", "NOT_RESPONDING", "POWERING_UP"], S.UNKNOWN),
        ("idle", ["CLOUD", "POWERED_DOWN"], S.IDLE),
        ("future", [], S.UNKNOWN),
        ("unknown", [], S.UNKNOWN),
        (["IDLE", "DRAIN"], None, S.DRAINED),
        (["MIXED", "DRAIN"], None, S.DRAINING),
        (["DOWN", "DYNAMIC_NORM"], None, S.DOWN),
        (["ALLOCATED", "PLANNED", "SOME_NEW_FLAG"], None, S.ALLOCATED),
        ("IDLE+DRAIN", None, S.DRAINED),
        ("MIXED+DRAIN+NOT_RESPONDING", None, S.DRAINING),
        ("IDLE+INVALID_REG", None, S.DOWN),
        ("idle*", None, S.UNKNOWN),
        ("down*", None, S.DOWN),
        ("drng", None, S.DRAINING),
        ("idle~", None, S.IDLE),
        (["DRAIN"], None, S.DRAINED),  # flags only: base unknown, still drained
    ],
)
def test_node_state_mapping(state: object, flags: object, expected: SchedNodeState) -> None:
    base, found = split_node_state(state, flags)
    assert map_node_state(base, found) is expected


@pytest.mark.parametrize(("state", "flags"), [(None, None), (7, None), ("", None), ("idle", "x")])
def test_node_state_rejects_garbage(state: object, flags: object) -> None:
    with pytest.raises(ValueError, match="node state"):
        split_node_state(state, flags)


# ------------------------------------------------------------------- JSON answers


def test_sinfo_22_05_reference() -> None:
    nodes = {n.name: n for n in parse_nodes_json(fixture("sinfo-22.05-ref.json"))}
    assert nodes["gpu1"].state is S.DRAINING
    assert nodes["gpu1"].reason == "gpufleet: xid 79 on GPU3"
    assert (nodes["gpu1"].gpus, nodes["gpu1"].gpus_allocated) == (8, 2)
    assert nodes["gpu1"].drain and not nodes["gpu1"].down
    assert (nodes["gpu2"].state, nodes["gpu2"].reason, nodes["gpu2"].gpus_allocated) == (
        S.IDLE,
        None,
        0,
    )
    assert nodes["gpu3"].state is S.DOWN and nodes["gpu3"].down
    assert nodes["cloud1"].state is S.UNKNOWN
    assert nodes["cloud1"].partitions == ("cloud",)


def test_scontrol_json_23_02_reference() -> None:
    nodes = {n.name: n for n in parse_nodes_json(fixture("scontrol-show-node-23.02-ref.json"))}
    assert [n.state for n in nodes.values()] == [S.DRAINING, S.DRAINED, S.DOWN, S.ALLOCATED, S.IDLE]
    assert (nodes["gpu-001"].gpus, nodes["gpu-001"].gpus_allocated) == (8, 3)
    assert nodes["gpu-001"].partitions == ("gpu", "all")
    assert nodes["gpu-002"].reason == "hc: ECC errors"
    assert nodes["gpu-003"].gpus == 4  # no GRES string: from the TRES
    assert (nodes["gpu-004"].gpus, nodes["gpu-004"].gpus_allocated) == (8, 8)
    assert nodes["gpu-005"].reason is None


def test_sinfo_24_11_rows_reference() -> None:
    nodes = parse_nodes_json(fixture("sinfo-24.11-ref.json"))
    assert [(n.name, n.state, n.gpus, n.gpus_allocated) for n in nodes] == [
        ("gpu001", S.DRAINED, 4, 0),
        ("gpu002", S.MIXED, 4, 1),
    ]
    assert nodes[0].partitions == ("gpu", "all")
    assert nodes[0].reason == "gpufleet: nvlink down"


def test_json_error_body_raises() -> None:
    body = {
        "meta": {},
        "errors": [{"error": "Failure to query node bad-node-name", "error_number": 2017}],
        "nodes": [],
    }
    with pytest.raises(SlurmReportedError, match="bad-node-name") as caught:
        parse_nodes_json(json.dumps(body))
    assert caught.value.errors == ("Failure to query node bad-node-name (error 2017)",)
    newer = {"errors": [{"description": "Unable to query", "source": "slurm_load_node"}]}
    assert json_errors(newer) == ["slurm_load_node: Unable to query"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"meta": {}}', "no 'nodes'"),
        ('{"nodes": {"a": 1}}', "list of objects"),
        ('{"nodes": [{"state": "idle"}]}', "without a name"),
        ('{"nodes": [{"name": "n1", "state": 3}]}', "node n1: node state"),
        ('{"nodes": [{"name": "n1", "state": "idle", "gres": "gpu:x:y"}]}', "node n1: GRES"),
    ],
)
def test_nodes_json_rejects_garbage(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_nodes_json(text)


def test_nodes_json_accepts_minimal_and_extra_fields() -> None:
    text = json.dumps({"nodes": [{"name": "n1", "state": "idle", "new": {"x": [1]}}]})
    (node,) = parse_nodes_json(text)
    assert (node.name, node.state, node.reason, node.gpus, node.partitions) == (
        "n1",
        S.IDLE,
        None,
        0,
        (),
    )


def test_squeue_22_05_reference() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(fixture("squeue-22.05-ref.json"))}
    running = jobs["1"]
    assert (running.state, running.user, running.account, running.nodes, running.gpus) == (
        "RUNNING",
        "alice",
        "research",
        ("gpu1",),
        2,
    )
    assert running.active and running.requeueable and running.batch
    assert running.started_at == dt.datetime.fromtimestamp(1796219661, dt.UTC)
    assert jobs["2"].gpus == 16  # gres:gpu:8 per node × 2 nodes
    assert jobs["3"].pending_gpus == 2  # 10 array tasks, at most 2 at once
    assert jobs["4"].pending_gpus == 0  # held
    assert jobs["5"].nodes == ("gpu1", "gpu2") and not jobs["5"].batch
    assert not jobs["6"].active
    assert pending_gpu_demand(jobs.values()) == 18
    sched = running.to_sched_job()
    assert (sched.job_id, sched.extra["partition"], sched.ended_at) == ("1", "debug", None)


def test_squeue_23_02_reference() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(fixture("squeue-23.02-ref.json"))}
    assert jobs["525"].state == "RUNNING"
    assert jobs["525"].nodes == ("gpu-001", "gpu-004")
    assert jobs["525"].gpus == 4
    assert jobs["525"].restarts == 1
    assert jobs["526"].gpus == 8 and jobs["526"].pending_gpus == 8
    assert jobs["526"].started_at is None
    assert jobs["527"].state == "PENDING" and jobs["527"].pending_gpus == 0  # BeginTime
    assert pending_gpu_demand(jobs.values()) == 8


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"jobs": [{"name": "x"}]}', "without a job_id"),
        ('{"jobs": [{"job_id": 1, "job_state": 5}]}', "job 1: job_state"),
        ('{"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "n[1-"}]}', "job 1: "),
        ('{"errors": ["slurm_load_jobs error: Unable to contact slurm controller"]}', "contact"),
    ],
)
def test_jobs_json_rejects_garbage(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_jobs_json(text)


# -------------------------------------------------------------- scontrol text


def test_key_values_keep_spaces_and_reason() -> None:
    kv = parse_key_values(
        "NodeName=n1 CoresPerSocket=1  OS=Linux 6.1 #1 SMP @0  RealMemory=1000 "
        "State=IDLE+DRAIN Reason=gpufleet: xid=79 on GPU3 [root@2026-12-02T13:54:28] Comment=x"
    )
    assert kv["OS"] == "Linux 6.1 #1 SMP @0"
    assert kv["Reason"] == "gpufleet: xid=79 on GPU3"
    assert kv["ReasonUser"] == "root"
    assert kv["Comment"] == "x"
    with pytest.raises(ValueError, match="Key=Value"):
        parse_key_values("garbage NodeName=n1")


def test_scontrol_nodes_22_05_reference() -> None:
    nodes = {n.name: n for n in parse_scontrol_nodes(fixture("scontrol-show-node-22.05-ref.txt"))}
    assert nodes["gpu1"].state is S.DRAINING
    assert nodes["gpu1"].reason == "gpufleet: xid 79 on GPU3"
    assert (nodes["gpu1"].gpus, nodes["gpu1"].gpus_allocated) == (8, 2)
    assert nodes["gpu2"].state is S.DRAINED
    assert nodes["gpu2"].reason == "hc: temp=97C on GPU0"
    assert (nodes["gpu3"].state, nodes["gpu3"].reason) == (S.IDLE, None)
    assert nodes["gpu3"].partitions == ("debug",)


def test_scontrol_nodes_multiline_and_empty() -> None:
    text = "NodeName=n1 Arch=x86_64\n   State=IDLE Gres=gpu:2\n\nNodeName=n2 State=DOWN\n"
    assert [(n.name, n.state, n.gpus) for n in parse_scontrol_nodes(text)] == [
        ("n1", S.IDLE, 2),
        ("n2", S.DOWN, 0),
    ]
    assert parse_scontrol_nodes("No nodes in the system\n") == []
    with pytest.raises(ValueError, match="NodeName="):
        parse_scontrol_nodes("slurm_load_node error: Unable to contact slurm controller\n")
    with pytest.raises(ValueError, match="node n1: no State="):
        parse_scontrol_nodes("NodeName=n1 Arch=x86_64\n")


def test_scontrol_jobs_text() -> None:
    text = (
        "JobId=7 JobName=train it UserId=alice(1000) GroupId=alice(1000) Account=research "
        "JobState=RUNNING Reason=None Requeue=1 Restarts=2 BatchFlag=1 "
        "SubmitTime=2026-12-02T13:54:50 StartTime=2026-12-02T13:54:54 Partition=gpu "
        "NodeList=lab-[001-002] NumNodes=2-2 TRES=cpu=2,mem=2000M,node=2,gres/gpu=4 "
        "TresPerNode=gres:gpu:2\n"
        "JobId=8 ArrayJobId=8 ArrayTaskId=0-3 JobName=sweep UserId=bob(1001) Account=(null) "
        "JobState=PENDING Reason=Resources Requeue=0 BatchFlag=1 Partition=gpu NodeList=(null) "
        "NumNodes=1 TRES=cpu=1,mem=1000M,node=1 TresPerNode=gres:gpu:1\n"
    )
    running, pending = parse_scontrol_jobs(text)
    assert (running.job_id, running.name, running.user, running.nodes, running.gpus) == (
        "7",
        "train it",
        "alice",
        ("lab-001", "lab-002"),
        4,
    )
    assert running.restarts == 2
    assert running.started_at == dt.datetime(2026, 12, 2, 13, 54, 54, tzinfo=dt.UTC)
    assert (pending.account, pending.nodes, pending.pending_gpus) == ("", (), 4)
    assert not pending.requeueable
    assert parse_scontrol_jobs("No jobs in the system\n") == []


# ------------------------------------------------------------------------ sacct


def test_sacct_reference_folds_steps() -> None:
    jobs = parse_sacct(fixture("sacct-22.05-ref.txt"))
    assert [j.job_id for j in jobs] == ["2", "4", "5", "6"]
    done, failed, killed, never = jobs
    assert (done.state, done.exit_code, done.gpus, done.extra["steps"]) == (
        "COMPLETED",
        0,
        0,
        "batch,extern",
    )
    assert (failed.user, failed.account, failed.exit_code, failed.gpus, failed.nodes) == (
        "alice",
        "research",
        3,
        4,
        ("gpu1", "gpu2"),
    )
    assert failed.ended_at == dt.datetime(2026, 12, 2, 13, 55, 12, tzinfo=dt.UTC)
    assert (killed.state, killed.exit_code, killed.extra["signal"]) == ("CANCELLED", 143, "15")
    assert killed.extra["cancelled_by"] == "0"
    assert killed.name == "name|with|pipes"
    assert (never.started_at, never.nodes, never.gpus) == (None, (), 0)


def test_sacct_header_and_unknown_steps() -> None:
    text = (
        "JobID|User|Account|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Partition|JobName\n"
        "9.batch|||COMPLETED|0:0|||2026-12-02T13:00:00|n1|||batch\n"
        "10|u|a|TIMEOUT|0:0|Unknown|Unknown|Unknown|n1||p|x\n"
    )
    (job,) = parse_sacct(text)  # a step without its job line is not a job
    assert (job.job_id, job.state, job.ended_at) == ("10", "TIMEOUT", None)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1|u|a|COMPLETED\n", "expected 12"),
        ("1|u|a|COMPLETED|x:y|||||||n\n", "job 1.*ExitCode"),
        ("1|u|a|COMPLETED|0:0|someday||||||n\n", "job 1.*not a time"),
        ("1|u|a||0:0|||||||n\n", "empty State"),
    ],
)
def test_sacct_rejects_garbage(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_sacct(text)


# -------------------------------------- recorded from the lab (Slurm 22.05.8, Debian)
# The lab at recording time: lab-001 draining (gpufleet's reason, job 5005 on 2 GPUs),
# lab-002 mixed (job 5006 of user nobody, 1 GPU), lab-003 drained by a health check;
# pending: 5007 (2 nodes × 8 GPUs, Resources), array 5008 (0-9%2 × 8 GPUs, Priority),
# 5009 (held, 4 GPUs); finished: 5001-5004 (root and nobody).


def test_recorded_version() -> None:
    assert parse_version(fixture("sinfo-version-22.05.txt")) == SlurmVersion(22, 5, 8)


def test_recorded_sinfo_json() -> None:
    nodes = parse_nodes_json(fixture("sinfo-22.05.json"))
    assert [(n.name, n.state, n.reason, n.gpus, n.gpus_allocated) for n in nodes] == [
        ("lab-001", S.DRAINING, "gpufleet: xid 79 on GPU3", 8, 2),
        ("lab-002", S.MIXED, None, 8, 1),
        ("lab-003", S.DRAINED, "hc: ECC errors on GPU5", 8, 0),
    ]
    assert nodes[0].partitions == ("gpu",)


def test_recorded_scontrol_nodes_match_sinfo_json() -> None:
    text = parse_scontrol_nodes(fixture("scontrol-show-node-22.05.txt"))
    assert text == parse_nodes_json(fixture("sinfo-22.05.json"))


def test_recorded_powering_up_cloud_node_is_powered_down_until_slurmd_registers() -> None:
    """Power saving (22.05, the lab): Slurm resumed cloud1 for a job, allocated it, and
    waits for its slurmd; cloud2 is powered down. Both dialects say so alike."""
    text = parse_scontrol_nodes(fixture("scontrol-show-node-22.05-powering-up.txt"))
    assert text == parse_nodes_json(fixture("sinfo-22.05-powering-up.json"))
    nodes = {n.name: n.to_sched_node() for n in text}
    cloud1, cloud2 = nodes["cloud1"], nodes["cloud2"]
    assert (cloud1.powered_down, cloud1.gpus_allocated) == (True, 1)
    assert cloud1.state is SchedNodeState.UNKNOWN  # NOT_RESPONDING: no slurmd yet
    assert (cloud2.powered_down, cloud2.gpus_allocated, cloud2.state) == (
        True, 0, SchedNodeState.IDLE,
    )  # fmt: skip
    assert not any(nodes[n].powered_down for n in ("lab-001", "lab-002", "lab-003"))


def test_recorded_squeue_json() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(fixture("squeue-22.05.json"))}
    assert [j for j in jobs if jobs[j].active] == ["5005", "5006"]
    train, infer = jobs["5005"], jobs["5006"]
    assert (train.user, train.account, train.nodes, train.gpus) == ("root", "root", ("lab-001",), 2)
    assert (infer.user, infer.account, infer.nodes, infer.gpus) == ("nobody", "", ("lab-002",), 1)
    assert train.started_at == dt.datetime(2026, 12, 2, 21, 7, 59, tzinfo=dt.UTC)
    assert (jobs["5007"].state_reason, jobs["5007"].pending_gpus) == ("Resources", 16)
    assert (jobs["5008"].array_tasks, jobs["5008"].pending_gpus) == (10, 16)
    assert (jobs["5009"].state_reason, jobs["5009"].pending_gpus) == ("JobHeldUser", 0)
    assert pending_gpu_demand(jobs.values()) == 32
    assert jobs["5004"].state == "CANCELLED" and not jobs["5004"].active


def test_recorded_scontrol_jobs_match_squeue_json() -> None:
    def key(job: object) -> object:
        assert hasattr(job, "job_id")
        return {
            f: getattr(job, f)
            for f in ("job_id", "name", "user", "state", "nodes", "gpus", "pending_gpus")
        }

    from_text = [key(j) for j in parse_scontrol_jobs(fixture("scontrol-show-job-22.05.txt"))]
    from_json = [key(j) for j in parse_jobs_json(fixture("squeue-22.05.json"))]
    assert sorted(from_text, key=str) == sorted(from_json, key=str)


def test_recorded_sacct() -> None:
    jobs = parse_sacct(fixture("sacct-22.05.txt"))
    assert [(j.job_id, j.user, j.state, j.exit_code, j.gpus, j.nodes) for j in jobs] == [
        ("5001", "root", "COMPLETED", 0, 1, ("lab-001",)),
        ("5002", "nobody", "FAILED", 3, 2, ("lab-001",)),
        ("5003", "nobody", "COMPLETED", 0, 2, ("lab-001", "lab-002")),
        ("5004", "root", "CANCELLED", 0, 0, ("lab-001",)),
    ]
    assert jobs[0].extra["steps"] == "batch,0"
    assert jobs[0].account == "root" and jobs[1].account == ""
    assert jobs[3].extra["cancelled_by"] == "0"
    assert jobs[1].ended_at == dt.datetime(2026, 12, 2, 21, 7, 36, tzinfo=dt.UTC)


def test_recorded_sacct_requeue_down_and_array() -> None:
    jobs = {j.job_id: j for j in parse_sacct(fixture("sacct-requeue-22.05.txt"))}
    assert jobs["5005"].state == "REQUEUED"  # scontrol requeue
    assert jobs["5006"].state == "NODE_FAIL"  # its node was set DOWN
    assert jobs["5008_0"].gpus == 8 and jobs["5008_0"].extra["steps"] == "batch"
    assert jobs["5010"].started_at is None and jobs["5010"].nodes == ()


@pytest.mark.parametrize(
    "name",
    [
        "scontrol-show-node-one-22.05.txt",
        "scontrol-show-node-invalid-reg-22.05.txt",
        "scontrol-show-node-reregistered-22.05.txt",
    ],
)
def test_scontrol_nodes_pasted_without_their_indentation(name: str) -> None:
    """``scontrol show node`` copied through a web page: the continuation lines lost their
    indentation (and the first line gained some). Same nodes, same fields."""
    recorded = fixture(name)
    pasted = "\n".join(("  " if line.startswith("NodeName=") else "") + line.strip()
                       for line in recorded.splitlines())  # fmt: skip
    assert sum(line[:1].isspace() for line in recorded.splitlines()) > 10
    assert parse_scontrol_nodes(pasted) == parse_scontrol_nodes(recorded)
    with pytest.raises(ValueError, match="NodeName="):
        parse_scontrol_nodes("NodeName=n1 State=IDLE\nthis is not a key value line\n")
