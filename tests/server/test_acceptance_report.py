"""Acceptance reports: per node and GPU verdicts tied to hardware, a hash over canonical
JSON, and one self-contained, escaped HTML page."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from typing import Any

from gpufleet.core.acceptance import canonical_json, content_hash, default_suite
from gpufleet.core.enums import AcceptanceStage
from gpufleet.server.db.tables import (
    AcceptanceRunRow,
    CheckRunRow,
    ClusterRow,
    GpuRow,
    NodeRow,
)
from gpufleet.server.services.acceptance_report import (
    CheckEntry,
    build_report,
    localised,
    node_results,
    render_html,
)

T0 = dt.datetime(2026, 12, 3, 8, 0, tzinfo=dt.UTC)
NODE = AcceptanceStage.NODE
EVIL = '<script>alert("x")</script> & <img src=http://evil.example/x.png>'


def _cluster() -> ClusterRow:
    return ClusterRow(
        id="c-1",
        project_id="p-1",
        name="train",
        scheduler="sim",
        provider="sim",
        gpu_model="NVIDIA H100 80GB HBM3",
        gpus_per_node=2,
    )


def _node(i: int) -> NodeRow:
    return NodeRow(
        id=f"n-{i}",
        cluster_id="c-1",
        name=f"train-{i:03d}",
        hostname=f"host{i}",
        serial=f"SER-{i}",
        provider_instance_id=f"i-{i}",
        rack="r1",
        leaf_switch="leaf1",
    )


def _gpu(node: int, index: int) -> GpuRow:
    return GpuRow(
        id=f"g-{node}-{index}",
        node_id=f"n-{node}",
        index=index,
        uuid=f"GPU-{node:04d}{index:04d}-aaaa",
        serial=f"GS-{node}-{index}",
        model="NVIDIA H100 80GB HBM3",
    )


def _check(run_id: str, kind: str, nodes: dict[str, dict[str, Any]], **extra: Any) -> CheckRunRow:
    outcome = "fail" if any(n["outcome"] == "fail" for n in nodes.values()) else "pass"
    return CheckRunRow(
        id=run_id,
        cluster_id="c-1",
        kind=kind,
        params=extra.pop("params", {}),
        node_ids=list(nodes),
        status="failed" if outcome == "fail" else "passed",
        result={
            "kind": kind,
            "outcome": outcome,
            "gpu_model": "NVIDIA H100 80GB HBM3",
            "fabric": "NDR",
            "figures": {},
            "reasons": [],
            "nodes": nodes,
            **extra,
        },
        skipped=[],
        detail="",
        started_at=T0,
        finished_at=T0 + dt.timedelta(minutes=3),
    )


def _verdict(
    outcome: str, *, reason: str = "", gpus: dict[str, Any] | None = None
) -> dict[str, Any]:
    reasons = [{"outcome": outcome, "message": reason, "node": None}] if reason else []
    return {
        "name": "x",
        "outcome": outcome,
        "reasons": reasons,
        "figures": {"busbw": 480.5},
        "gpus": gpus or {},
    }


def _report() -> tuple[dict[str, Any], list[tuple[CheckEntry, CheckRunRow | None]]]:
    dcgm = _check(
        "k-dcgm",
        "dcgm-diag",
        {
            "n-1": _verdict("pass", gpus={"0": {"outcome": "pass", "figures": {}, "reasons": []}}),
            "n-2": _verdict(
                "fail",
                reason=EVIL,
                gpus={
                    "1": {
                        "outcome": "fail",
                        "figures": {"memory": "Fail"},
                        "reasons": [{"outcome": "fail", "message": "Memory test failed"}],
                    }
                },
            ),
        },
        params={"level": 3},
    )
    nccl = _check(
        "k-nccl",
        "nccl",
        {"n-1": _verdict("pass"), "n-2": _verdict("pass")},
        params={"scope": "per-node"},
    )
    checks: list[tuple[CheckEntry, CheckRunRow | None]] = [
        (CheckEntry("k-dcgm", "dcgm-diag", "dcgm-diag (level 3)", NODE, ("n-1", "n-2")), dcgm),
        (CheckEntry("k-nccl", "nccl", "nccl", NODE, ("n-1", "n-2")), nccl),
    ]
    run = AcceptanceRunRow(
        id="a-1",
        cluster_id="c-1",
        scope="cluster",
        trigger="provisioning",
        suite=default_suite().model_dump(mode="json"),
        created_by="system:acceptance",
        created_at=T0,
        started_at=T0,
        repair_id=None,
    )
    outcomes = {
        "n-1": {"outcome": "pass", "reasons": []},
        "n-2": {"outcome": "fail", "reasons": [f"dcgm-diag: {EVIL}"]},
    }
    report = build_report(
        run=run,
        cluster=_cluster(),
        nodes=[_node(2), _node(1)],
        gpus={"n-1": [_gpu(1, 1), _gpu(1, 0)], "n-2": [_gpu(2, 0), _gpu(2, 1)]},
        checks=checks,
        outcomes=outcomes,
        status="failed",
        detail="failed on 1 of 2 node(s)",
    )
    return report, checks


def test_report_ties_verdicts_to_nodes_gpus_and_evidence() -> None:
    report, _checks = _report()
    assert report["schema"] == "gpufleet.acceptance-report/1"
    assert report["summary"] == {
        "outcome": "fail",
        "nodes": 2,
        "passed": 1,
        "warned": 0,
        "failed": 1,
        "skipped": 0,
        "not_judged": 0,
        "failed_nodes": ["train-002"],
    }
    first, second = report["nodes"]
    assert (first["name"], first["serial"], first["provider_instance_id"]) == (
        "train-001",
        "SER-1",
        "i-1",
    )
    # GPUs in index order, each with its UUID and serial, judged per check.
    assert [g["uuid"] for g in first["gpus"]] == ["GPU-00010000-aaaa", "GPU-00010001-aaaa"]
    bad_gpu = second["gpus"][1]
    assert (bad_gpu["serial"], bad_gpu["outcome"]) == ("GS-2-1", "fail")
    assert bad_gpu["checks"]["dcgm-diag (level 3)"]["reasons"] == ["Memory test failed"]
    assert [c["label"] for c in second["checks"]] == ["dcgm-diag (level 3)", "nccl"]
    dcgm = report["checks"][0]
    assert dcgm["raw_output"] == "/api/v1/checks/k-dcgm/output"
    assert dcgm["thresholds"]["rule"].startswith("every DCGM test must report Pass")
    # Per-node NCCL is judged against the GPU model's busbw limits from the thresholds data.
    limits = report["checks"][1]["thresholds"]["busbw_gbytes"]
    assert limits["fail_below"] < limits["warn_below"] <= limits["expected"]
    assert report["cluster"]["gpu_model"] == "NVIDIA H100 80GB HBM3"


def test_report_hash_is_over_canonical_bytes_and_stable() -> None:
    report, _ = _report()
    again, _ = _report()
    assert content_hash(report) == content_hash(again)
    data = canonical_json(report)
    assert hashlib.sha256(data).hexdigest() == content_hash(report)
    # What a client downloads and parses gives the same bytes back.
    assert canonical_json(json.loads(data)) == data
    changed = json.loads(data)
    changed["nodes"][0]["gpus"][0]["uuid"] = "GPU-swapped"
    assert content_hash(changed) != content_hash(report)


def test_html_is_self_contained_and_escaped() -> None:
    report, _ = _report()
    page = render_html(report, sha256=content_hash(report))
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<img" not in page and "<link" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;img" in page
    # No external asset: every URL is a relative link to the raw output or an anchor.
    urls = re.findall(r'(?:href|src)="([^"]*)"', page)
    assert urls and all(u.startswith(("/api/v1/checks/", "#node-")) for u in urls)
    assert content_hash(report) in page
    assert "train-002" in page and "GPU-00020001-aaaa" in page


def test_missing_evidence_fails_and_skips_are_named() -> None:
    row = _check("k", "dcgm-diag", {"n-1": _verdict("pass")})
    row.node_ids = ["n-1", "n-2", "n-3"]
    row.skipped = [{"node_id": "n-3", "node": "train-003", "reason": "runs job 42"}]
    results = node_results(row)
    assert results["n-1"]["outcome"] == "pass"
    assert results["n-2"]["outcome"] == "fail"
    assert results["n-2"]["reasons"] == ["dcgm-diag: no verdict for this node"]
    assert results["n-3"]["outcome"] == "skipped"
    row.status, row.detail = "error", "the backend refused to start it 3 times"
    assert {r["outcome"] for r in node_results(row).values() if r["outcome"] != "skipped"} == {
        "fail"
    }


def test_localisation_pins_the_bad_node_or_nobody() -> None:
    names = {"n-1": "train-001", "n-2": "train-002", "n-3": "train-003"}
    slow = _check("k", "nccl", {n: _verdict("fail") for n in names})
    assert localised(slow, names) == (set(), set(), False)
    slow.result = {
        **slow.result,
        "localisation": {"bad_nodes": ["train-002"], "good": ["train-001", "train-003"]},
    }
    assert localised(slow, names) == ({"n-2"}, {"n-1", "n-3"}, True)
