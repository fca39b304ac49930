"""What Slurm's power saving hands ResumeProgram/SuspendProgram: the hostlist argument and
``SLURM_RESUME_FILE`` in both formats (``gpufleet.schedulers.slurm.power``).

``resume-file-22.05.json`` was recorded in the lab (3 cloud nodes, two jobs submitted at
once: ``-w cloud1 --gres=gpu:2`` and ``-N2 -w cloud[2-3] --gres=gpu:8``; slurmctld resumed
all three in one call). The 23.02+ form is written from ``power_save.shtml``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.schedulers.slurm.power import (
    MAX_NODES,
    HostlistError,
    ResumeFile,
    ResumeFileError,
    ResumeJob,
    expand_nodes,
    parse_resume_file,
)

FIXTURE = Path(__file__).parents[2] / "fixtures" / "slurm" / "resume-file-22.05.json"

NEWER = {
    "all_nodes_resume": "cloud[1-3]",
    "jobs": [
        {
            "extra": None,
            "features": "h100&ib",
            "job_id": 42,
            "nodes_alloc": "cloud[1-2],gpu7",
            "nodes_resume": "cloud[1-2]",
            "oversubscribe": "OK",
            "partition": "cloud",
            "reservation": None,
        },
        {
            "extra": "tier=spot",
            "features": None,
            "job_id": 43,
            "nodes_alloc": "cloud3",
            "nodes_resume": "cloud3",
            "oversubscribe": "NO",
            "partition": "cloud",
            "reservation": "maint",
        },
    ],
}


# ---------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("cloud1", ("cloud1",)),
        (
            "cloud[1-3,5],gpu-[01-02],node7",
            ("cloud1", "cloud2", "cloud3", "cloud5", "gpu-01", "gpu-02", "node7"),
        ),
        ("gpu-[008-011]", ("gpu-008", "gpu-009", "gpu-010", "gpu-011")),  # padding kept
        ("n[1,3-4],n2", ("n1", "n3", "n4", "n2")),  # Slurm's order, not sorted
        ("n[1-2],n[2-3]", ("n1", "n2", "n3")),  # each once
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),  # brackets multiply
        (" cloud[1-2] ", ("cloud1", "cloud2")),
        ("a.b_c-1", ("a.b_c-1",)),
    ],
)
def test_a_hostlist_expands_to_its_node_names(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand_nodes(hostlist) == names


@pytest.mark.parametrize(
    ("hostlist", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("cloud[1-3", "not a hostlist"),
        ("cloud1-3]", "not a hostlist"),
        ("cloud[[1-2]]", "not a hostlist"),
        ("cloud[a-c]", "not a hostlist"),
        ("cloud[1-]", "not a hostlist"),
        ("cloud[3-1]", "runs backwards"),
        ("cloud 1", "not a node name"),
        ("-cloud1", "not a node name"),
        ("cloud1;reboot", "not a node name"),
        ("x" * 64, "not a node name"),
        (",", "names no node"),
        (f"n[1-{MAX_NODES + 1}]", f"at most {MAX_NODES}"),
        ("a[1-100]b[1-100]", "names 10000 nodes"),
    ],
)
def test_a_bad_hostlist_says_what_is_wrong_and_what_is_accepted(hostlist: str, says: str) -> None:
    with pytest.raises(HostlistError) as raised:
        expand_nodes(hostlist)
    assert says in str(raised.value)
    assert isinstance(raised.value, ValueError)
    if says not in ("runs backwards",) and "at most" not in says and "names" not in says:
        assert "cloud[1-3,5]" in str(raised.value)  # shows one that is accepted


def test_a_huge_range_fails_at_once_without_expanding() -> None:
    start = time.monotonic()
    with pytest.raises(HostlistError, match="names 999999999 nodes"):
        expand_nodes("cloud[1-999999999]")
    assert time.monotonic() - start < 0.5


def test_the_largest_hostlist_taken_is_max_nodes() -> None:
    assert len(expand_nodes(f"n[1-{MAX_NODES}]")) == MAX_NODES


# ---------------------------------------------------------------------------- resume file


def test_the_recorded_22_05_resume_file() -> None:
    raw = FIXTURE.read_bytes()
    assert json.loads(raw) == {
        "jobs": [{"job_id": 1, "nodes": "cloud1"}, {"job_id": 2, "nodes": "cloud[2-3]"}],
        "all_nodes": "cloud[1-3]",
    }
    assert parse_resume_file(raw) == ResumeFile(
        nodes=("cloud1", "cloud2", "cloud3"),
        jobs=(
            ResumeJob(job_id="1", nodes_alloc=("cloud1",), nodes_resume=("cloud1",)),
            ResumeJob(
                job_id="2",
                nodes_alloc=("cloud2", "cloud3"),
                nodes_resume=("cloud2", "cloud3"),
            ),
        ),
    )
    assert parse_resume_file(raw.decode()) == parse_resume_file(raw)  # text or bytes


def test_the_newer_resume_file_with_features_partition_and_nulls() -> None:
    parsed = parse_resume_file(json.dumps(NEWER))
    assert parsed.nodes == ("cloud1", "cloud2", "cloud3")
    first, second = parsed.jobs
    assert first == ResumeJob(
        job_id="42",
        nodes_alloc=("cloud1", "cloud2", "gpu7"),
        nodes_resume=("cloud1", "cloud2"),  # gpu7 was up already
        features="h100&ib",
        partition="cloud",
        oversubscribe="OK",
    )
    assert (second.features, second.extra, second.reservation) == ("", "tier=spot", "maint")


def test_in_22_05_a_job_waits_only_for_its_nodes_that_are_resumed() -> None:
    raw = '{"jobs":[{"job_id":7,"nodes":"cloud[1-2],lab-001"}],"all_nodes":"cloud[1-2]"}'
    [job] = parse_resume_file(raw).jobs
    assert job.nodes_alloc == ("cloud1", "cloud2", "lab-001")
    assert job.nodes_resume == ("cloud1", "cloud2")


@pytest.mark.parametrize(
    ("doc", "nodes", "jobs"),
    [
        ({"all_nodes": "cloud[1-2]"}, ("cloud1", "cloud2"), ()),  # no jobs key
        ({"all_nodes": "cloud1", "jobs": None}, ("cloud1",), ()),
        ({"all_nodes": "cloud1", "jobs": []}, ("cloud1",), ()),
        ({}, (), ()),
        # no all_nodes: what the jobs wait for
        ({"jobs": [{"job_id": "7", "nodes": "cloud[1-2]"}]}, ("cloud1", "cloud2"), ("7",)),
        ({"all_nodes": None, "jobs": [{"job_id": 8, "nodes": "c1"}]}, ("c1",), ("8",)),
        # a list of names instead of a hostlist; job ids of array tasks and het jobs
        ({"all_nodes_resume": ["c1", "c2"], "jobs": [{"job_id": "9_3"}]}, ("c1", "c2"), ("9_3",)),
        ({"all_nodes": "c1", "jobs": [{"job_id": "10+1", "nodes": None}]}, ("c1",), ("10+1",)),
        # unknown keys are left alone
        ({"all_nodes": "c1", "version": 2, "jobs": [{"job_id": 11, "x": [1]}]}, ("c1",), ("11",)),
    ],
)
def test_variants_with_keys_missing_or_null(
    doc: dict[str, object], nodes: tuple[str, ...], jobs: tuple[str, ...]
) -> None:
    parsed = parse_resume_file(json.dumps(doc))
    assert parsed.nodes == nodes
    assert tuple(j.job_id for j in parsed.jobs) == jobs


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("cloud[1-2]", "not JSON"),
        ("[]", "JSON list, expected an object"),
        ('"cloud1"', "JSON str, expected an object"),
        ('{"jobs": {"job_id": 1}}', "jobs is {'job_id': 1}, expected a list"),
        ('{"jobs": [7]}', "jobs[0] is 7, expected an object"),
        ('{"jobs": [{"nodes": "c1"}]}', "job_id is None"),
        ('{"jobs": [{"job_id": true}]}', "job_id is True"),
        ('{"jobs": [{"job_id": 1.5}]}', "job_id is 1.5"),
        ('{"jobs": [{"job_id": "seven"}]}', "not a Slurm job id"),
        ('{"jobs": [{"job_id": 7, "nodes": "c[1-"}]}', "job 7 nodes"),
        ('{"jobs": [{"job_id": 7, "nodes": 3}]}', "expected a hostlist"),
        ('{"jobs": [{"job_id": 7, "features": 3}]}', "features is 3, expected text"),
        ('{"all_nodes": "c[2-1]"}', "runs backwards"),
        ('{"all_nodes": ["c1", 2]}', "expected a hostlist"),
    ],
)
def test_garbage_is_refused_with_what_is_wrong(raw: str | bytes, says: str) -> None:
    with pytest.raises(ResumeFileError) as raised:
        parse_resume_file(raw)
    assert says in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_a_file_far_too_large_is_refused_unread() -> None:
    with pytest.raises(ResumeFileError, match="far under"):
        parse_resume_file(b" " * (17 * 1024 * 1024))
