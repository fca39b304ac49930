"""The Slurm parsers on slurmrestd's answers, recorded from the lab's slurmrestd (Slurm
22.05.8, ``openapi/v0.0.38``; ``tests/fixtures/slurm/README.md`` has each request)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.schedulers.base import SchedNodeState
from gpufleet.schedulers.slurm.parsing import (
    SlurmReportedError,
    error_body_text,
    parse_jobs_json,
    parse_nodes_json,
    pending_gpu_demand,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_rest_nodes() -> None:
    nodes = parse_nodes_json(fixture("rest-nodes-22.05.json"))
    rows = [
        (n.name, n.state, n.reason, n.gpus, n.gpus_allocated, n.partitions, n.drain) for n in nodes
    ]
    assert rows == [
        ("lab-001", SchedNodeState.DRAINING, "gpufleet: r-123 xid-79", 8, 1, ("gpu",), True),
        ("lab-002", SchedNodeState.MIXED, None, 8, 2, ("gpu",), False),
        ("lab-003", SchedNodeState.DRAINED, "hc: ECC errors", 8, 0, ("gpu",), True),
    ]


def test_rest_one_node() -> None:
    (node,) = parse_nodes_json(fixture("rest-node-22.05.json"))
    assert (node.name, node.base_state, node.flags, node.reason) == (
        "lab-001",
        "MIXED",
        frozenset({"DRAIN"}),
        "gpufleet: r-123 xid-79",
    )


def test_rest_jobs_and_pending_demand() -> None:
    jobs = parse_jobs_json(fixture("rest-jobs-22.05.json"))
    rows = [(j.job_id, j.user, j.state, j.state_reason, j.nodes, j.gpus) for j in jobs]
    assert rows == [
        ("151001", "root", "RUNNING", "None", ("lab-001",), 1),
        ("151002", "nobody", "RUNNING", "None", ("lab-002",), 2),
        ("151003", "nobody", "PENDING", "Resources", (), 16),  # -N 2 × gpu:8
        ("151004", "root", "PENDING", "Priority", (), 8),  # array 0-9%2, per task
        ("151005", "root", "PENDING", "JobHeldUser", (), 4),
    ]
    assert [j.job_id for j in jobs if j.active] == ["151001", "151002"]
    assert jobs[3].array_tasks == 10 and jobs[3].array_throttle == 2
    # 16 for 151003 + 8 × 2 running at once for the array; the held job asks for nothing
    assert pending_gpu_demand(jobs) == 32
    assert jobs[1].to_sched_job().extra["partition"] == "gpu"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("rest-node-unknown-22.05.json", "Invalid node name specified (error 2018)"),
        ("rest-nodes-expired-jwt-22.05.json", "Unspecified error (error -1)"),
    ],
)
def test_rest_error_bodies_raise_never_an_empty_list(name: str, message: str) -> None:
    text = fixture(name)
    assert json.loads(text)["nodes"] == []  # the trap: an empty list next to the error
    with pytest.raises(SlurmReportedError) as caught:
        parse_nodes_json(text)
    assert str(caught.value) == message
    assert error_body_text(text) == message


def test_rest_jobs_error_body() -> None:
    text = fixture("rest-jobs-expired-jwt-22.05.json")
    expected = "slurm_load_jobs: Failed while looking for jobs: Unspecified error (error -1)"
    with pytest.raises(SlurmReportedError) as caught:
        parse_jobs_json(text)
    assert str(caught.value) == expected
    assert error_body_text(text) == expected


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ("Authentication failure", "Authentication failure"),  # the 401 body (text/plain)
        ("Unable find requested URL.\n", "Unable find requested URL."),
        ("", "(empty body)"),
        ('{"errors": [], "nodes": []}', '{"errors": [], "nodes": []}'),
    ],
)
def test_error_body_text_without_errors(body: str, text: str) -> None:
    assert error_body_text(body) == text
