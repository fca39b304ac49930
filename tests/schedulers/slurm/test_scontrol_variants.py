"""Hand-made ``scontrol show node`` variants (``tests/fixtures/slurm/variants``): text that
went through a web page, a chat or an editor parses to the same nodes, or fails saying
which line it could not read. The files are constructed, not recorded (their README).
Also the recorded job, sacct and JSON texts with the same damage done in the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.schedulers.slurm.parsing import (
    SlurmNodeInfo,
    parse_nodes_json,
    parse_sacct,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
)

VARIANTS = Path(__file__).parents[2] / "fixtures" / "slurm" / "variants"
RECORDED = VARIANTS.parent

A02 = SlurmNodeInfo(
    name="gpu-a02",
    base_state="IDLE",
    flags=frozenset({"DRAIN", "INVALID_REG"}),
    reason="gres/gpu count reported lower than configured (7 < 8)",
    gpus=8,
    gpus_allocated=0,
    partitions=("gpu",),
)


def _nodes(name: str) -> list[SlurmNodeInfo]:
    return parse_scontrol_nodes((VARIANTS / name).read_bytes().decode("utf-8"))


def test_continuation_lines_without_indentation() -> None:
    a01, a02, a03 = _nodes("scontrol-show-node-dedented.txt")
    assert (a01.name, a01.base_state, a01.flags, a01.reason) == (
        "gpu-a01",
        "MIXED",
        frozenset(),
        None,
    )
    assert (a01.gpus, a01.gpus_allocated, a01.partitions) == (8, 4, ("gpu", "debug"))
    assert a02 == A02
    assert (a03.base_state, a03.flags, a03.reason) == (
        "DOWN",
        frozenset({"NOT_RESPONDING"}),
        "Kill task failed",
    )


def test_the_same_text_indented_parses_the_same() -> None:
    text = (VARIANTS / "scontrol-show-node-dedented.txt").read_text()
    indented = "\n".join(
        line if line.startswith("NodeName=") or not line else "   " + line
        for line in text.splitlines()
    )
    assert parse_scontrol_nodes(indented) == _nodes("scontrol-show-node-dedented.txt")


def test_crlf_bom_non_breaking_and_zero_width_spaces() -> None:
    raw = (VARIANTS / "scontrol-show-node-nbsp-crlf.txt").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw and not raw.endswith(b"\n")
    assert "\u200b" in raw.decode() and "\u00a0" in raw.decode()
    assert _nodes("scontrol-show-node-nbsp-crlf.txt") == [A02]


def test_records_run_together_on_one_line_are_split() -> None:
    """A page that dropped the line breaks of ``-o`` output: two records on one line must
    not merge into one node with the second's name and a mix of both's fields."""
    recorded = parse_scontrol_nodes((RECORDED / "scontrol-show-node-22.05.txt").read_text())
    pasted = _nodes("scontrol-show-node-run-together.txt")
    assert [n.name for n in pasted] == ["lab-001", "lab-002", "lab-003"]
    assert pasted == recorded
    assert pasted[0].reason == "gpufleet: xid 79 on GPU3" and pasted[1].reason is None


def test_fields_a_newer_slurm_adds_and_tabs() -> None:
    [node] = _nodes("scontrol-show-node-newer-fields.txt")
    assert node == SlurmNodeInfo(
        name="gpu-b07",
        base_state="IDLE",
        flags=frozenset({"DRAIN", "DYNAMIC_NORM"}),
        reason="NHC: check_nvsmi_healthmon:  nvidia-smi:  The GPU has fallen off the bus "
        "or has otherwise become inaccessible; retry=3",
        gpus=8,  # gpu:b200:4(S:0),gpu:b200:4(S:1)
        gpus_allocated=3,  # GresUsed=gpu:b200:3(IDX:0-2)
        partitions=("gpu", "long"),
    )


def test_a_pasted_shell_prompt_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"expected a line starting with NodeName=.*login1"):
        _nodes("scontrol-show-node-shell-prompt.txt")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", None),  # nothing at all: no nodes
        ("NodeName=n1 Arch=x86_64\n", "node n1: no State="),
        ("NodeName=n1 State=\n", "node n1: empty node state"),
        ("<html><body>NodeName=n1 State=IDLE</body></html>\n", "expected a line starting"),
    ],
)
def test_bad_text_says_what_is_wrong(text: str, match: str | None) -> None:
    if match is None:
        assert parse_scontrol_nodes(text) == []
        return
    with pytest.raises(ValueError, match=match):
        parse_scontrol_nodes(text)


def test_a_state_word_slurm_adds_later_is_kept_as_a_flag() -> None:
    [node] = parse_scontrol_nodes("NodeName=n1 State=IDLE+HIBERNATING Gres=gpu:2\n")
    assert (node.base_state, node.flags, node.gpus) == ("IDLE", frozenset({"HIBERNATING"}), 2)


def test_job_text_with_invisible_characters() -> None:
    recorded = (RECORDED / "scontrol-show-job-22.05.txt").read_text()
    pasted = "\ufeff" + recorded.replace("\n", "\r\n").replace(" JobName=", " \u200bJobName=")
    assert parse_scontrol_jobs(pasted) == parse_scontrol_jobs(recorded)


@pytest.mark.parametrize(
    "variant",
    [
        lambda t: t.replace("\n", "\r\n"),
        lambda t: "\ufeff" + t,  # the first job's id must not carry the mark
        lambda t: t.rstrip("\n"),
        lambda t: "\n" + t + "\n\n",
    ],
    ids=["crlf", "bom", "no-final-newline", "blank-lines"],
)
def test_sacct_text_variants(variant: object) -> None:
    text = (RECORDED / "sacct-22.05.txt").read_text()
    assert callable(variant)
    assert parse_sacct(variant(text)) == parse_sacct(text)


def test_json_with_a_byte_order_mark() -> None:
    text = (RECORDED / "sinfo-22.05.json").read_text()
    assert parse_nodes_json("\ufeff" + text) == parse_nodes_json(text)


def test_a_reason_that_names_another_node_is_not_cut_into_a_record() -> None:
    text = (
        "NodeName=gpu-01 Arch=x86_64 CPUTot=64 State=DRAIN+IDLE "
        "Reason=NHC: compare with NodeName=gpu-02 [root@2026-12-04T10:00:00]\n"
    )
    (node,) = parse_scontrol_nodes(text)
    assert node.name == "gpu-01"
    assert "NodeName=gpu-02" in (node.reason or "")
