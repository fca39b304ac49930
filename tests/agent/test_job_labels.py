from __future__ import annotations

import dataclasses
from pathlib import Path

from gpufleet.agent.collectors.base import Sample
from gpufleet.agent.job_labels import JobLabels, cap_values, read_job_mapping
from gpufleet.agent.kube_pods import PodListing
from gpufleet.agent.main import build_job_labels
from gpufleet.agent.settings import AgentSettings
from gpufleet.core.clock import FakeClock
from gpufleet.schedulers.kubernetes.parsing import parse_pod


def gpus(n: int) -> list[Sample]:
    return [Sample("gpu", {}, i, f"GPU-{i}", f"0000:{i:02x}:00.0") for i in range(n)]


def pod(name: str, gpu_count: int) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "nodeName": "gpu-7",
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpu_count)}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def listing(*pods: dict[str, object], stale: bool = False) -> PodListing:
    parsed = tuple(parse_pod(p) for p in pods)
    return PodListing(pods=parsed, read_at=FakeClock().now(), stale=stale)


def test_slurm_mapping_files_as_dcgm_exporter_reads_them(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "1").write_text("4242\n")
    (tmp_path / "2").write_text("77\n4243\n\n")  # two jobs share GPU 2
    (tmp_path / "3.1").write_text("999\n")  # a MIG instance: not a whole GPU
    (tmp_path / "notes").write_text("x\n")
    (tmp_path / "5").mkdir()
    assert read_job_mapping(tmp_path) == {0: ["4242"], 1: ["4242"], 2: ["4243", "77"]}
    labels = JobLabels(mapping_dir=tmp_path).for_gpus(gpus(4))
    assert labels == {
        0: (("hpc_job", "4242"),),
        1: (("hpc_job", "4242"),),
        2: (("hpc_job", "4243,77"),),
    }
    assert read_job_mapping(tmp_path / "missing") == {}


def test_at_most_max_values_distinct_values() -> None:
    found = {i: (("hpc_job", str(100 + i)),) for i in range(8)}
    capped = cap_values(found, 3)
    assert [capped[i][0][1] for i in range(8)] == ["100", "101", "102"] + ["other"] * 5
    assert len({v for v in capped.values()}) == 4  # 3 jobs + "other"
    same = cap_values({0: (("hpc_job", "1"),), 1: (("hpc_job", "1"),)}, 1)
    assert same[1] == (("hpc_job", "1"),)


def test_kubernetes_only_when_one_pod_holds_every_gpu() -> None:
    current: list[PodListing | None] = [listing(pod("train-0", 8))]
    jobs = JobLabels(mapping_dir=None, pods=lambda: current[0])
    labels = jobs.for_gpus(gpus(8))
    assert labels[7] == (("pod", "train-0"), ("namespace", "ml"))
    current[0] = listing(pod("a", 4), pod("b", 4))  # which 4 GPUs each holds is unknown
    assert jobs.for_gpus(gpus(8)) == {}
    current[0] = listing(pod("small", 2))
    assert jobs.for_gpus(gpus(8)) == {}
    current[0] = dataclasses.replace(listing(pod("train-0", 8)), stale=True)
    assert jobs.for_gpus(gpus(8)) == {}
    current[0] = None
    assert jobs.for_gpus(gpus(8)) == {}


def test_off_by_default_and_wired_from_settings(tmp_path: Path) -> None:
    assert build_job_labels(AgentSettings(node_token="t"), None) is None  # type: ignore[arg-type]
    settings = AgentSettings(
        node_token="t",  # type: ignore[arg-type]
        metrics_job_labels=True,
        metrics_job_mapping_dir=tmp_path,
        metrics_job_label_max=2,
    )
    jobs = build_job_labels(settings, None)
    assert jobs is not None and jobs.mapping_dir == tmp_path and jobs.max_values == 2
