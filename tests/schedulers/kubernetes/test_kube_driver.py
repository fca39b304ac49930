"""The Kubernetes driver through the real ``kubernetes_asyncio`` client against the API
emulator (``gpufleet.testing.kube_api``: kmock with resourceVersions, selectors, the
Eviction API and PodDisruptionBudgets; its doc names what it does not emulate)."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

import kmock
import pytest

from gpufleet.core.errors import DriverError
from gpufleet.core.holds import acceptance_hold, repair_hold
from gpufleet.schedulers.base import (
    SchedNodeState,
    Scheduler,
    SupportsDown,
    SupportsDrain,
    SupportsEviction,
    SupportsJobsOnNodes,
)
from gpufleet.schedulers.kubernetes.config import KubernetesConfig
from gpufleet.schedulers.kubernetes.driver import KubernetesScheduler
from gpufleet.testing.kube_api import NODES, PDBS, PODS, RunningKubeApi, pod_object

REPAIR = repair_hold("0191d3a4-0000-7000-8000-000000000001", signature_id="xid-79", action="reboot")


def node(name: str, *, gpus: int = 8, ready: bool = True, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": dict(spec),
        "status": {
            "capacity": {"cpu": "96", "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "95", "nvidia.com/gpu": str(gpus)},
            "conditions": [
                {
                    "type": "KernelDeadlock",
                    "status": "False",
                    "reason": "KernelHasNoDeadlock",
                    "lastTransitionTime": "2026-11-01T00:00:00Z",
                },
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"},
            ],
            "nodeInfo": {"bootID": "boot-1"},
        },
    }


def pod(name: str, on: str | None, *, ns: str = "ml", **kw: Any) -> dict[str, Any]:
    return pod_object(name, on, namespace=ns, serviceAccountName="trainer", **kw)


def seed_world(api: RunningKubeApi) -> None:
    api.emulator.seed(NODES, node("gpu-1"))
    api.emulator.seed(NODES, node("gpu-2", gpus=4))
    api.emulator.seed(PODS, pod("train-0", "gpu-1", gpus=8, labels={"app": "train"}))
    api.emulator.seed(PODS, pod("exporter-x", "gpu-1", owner=("DaemonSet", "dcgm-exporter")))
    api.emulator.seed(PODS, pod("notebook", "gpu-2", gpus=2, owner=("StatefulSet", "nb")))
    api.emulator.seed(PODS, pod("done", "gpu-2", gpus=4, phase="Succeeded"))


async def test_capabilities_and_reads(api: RunningKubeApi, driver: KubernetesScheduler) -> None:
    assert isinstance(driver, Scheduler)
    assert isinstance(driver, SupportsDrain) and isinstance(driver, SupportsDown)
    assert isinstance(driver, SupportsEviction) and isinstance(driver, SupportsJobsOnNodes)
    seed_world(api)
    assert (await driver.version()).startswith("v1.")
    nodes = {n.name: n for n in await driver.list_nodes()}
    assert nodes["gpu-1"].state is SchedNodeState.ALLOCATED
    assert (nodes["gpu-1"].gpus, nodes["gpu-1"].gpus_allocated) == (8, 8)
    assert nodes["gpu-1"].job_ids == ("ml/train-0",)
    assert nodes["gpu-2"].state is SchedNodeState.MIXED and nodes["gpu-2"].gpus_allocated == 2

    jobs = await driver.jobs_on_node("gpu-1")
    assert [j.job_id for j in jobs] == ["ml/train-0"]  # the DaemonSet pod is no job
    job = jobs[0]
    assert (job.name, job.account, job.user, job.gpus) == ("train", "ml", "trainer", 8)
    assert job.extra["owner_kind"] == "Job"
    with pytest.raises(DriverError, match="node gpu-9: no such node"):
        await driver.jobs_on_node("gpu-9")

    # The selector reached the server: the driver asked only for gpu-1's live pods.
    lists = [r for r in api.emulator if r.method == kmock.method.GET and r.resource == PODS]
    assert "spec.nodeName=gpu-1" in lists[-1].params["fieldSelector"]

    # Many nodes (Cluster Autoscaler's DeleteNodes, the repair planner): what each
    # node's own read answers, from one list of nodes and one of live pods.
    one_by_one = {n: await driver.jobs_on_node(n) for n in ("gpu-1", "gpu-2")}
    assert [j.job_id for j in one_by_one["gpu-2"]] == ["ml/notebook"]  # not the ended pod
    before = len(list(api.emulator))
    batch = await driver.jobs_on_nodes(["gpu-2", "gpu-9", "gpu-1"])
    assert batch == {**one_by_one, "gpu-9": None}
    reads = [(r.method, r.resource) for r in list(api.emulator)[before:]]
    assert sorted(reads, key=str) == sorted(
        [(kmock.method.GET, NODES), (kmock.method.GET, PODS)], key=str
    )


async def test_pending_gpu_demand_counts_only_gpu_shortage(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    def waiting(name: str, gpus: int, message: str) -> dict[str, Any]:
        obj = pod(name, None, gpus=gpus, phase="Pending")
        obj["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
        return obj

    short = "0/4 nodes are available: 1 node(s) were unschedulable, 3 Insufficient nvidia.com/gpu."
    api.emulator.seed(PODS, waiting("a", 8, short))
    api.emulator.seed(PODS, waiting("b", 4, short))
    api.emulator.seed(
        PODS, waiting("c", 8, "0/4 nodes are available: 4 node(s) didn't match selector")
    )
    api.emulator.seed(PODS, waiting("d", 0, "0/4 nodes are available: 4 Insufficient cpu."))
    assert await driver.pending_gpu_demand() == 12


async def test_cordon_marks_keep_others_and_release_clears_ours(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    theirs = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    api.emulator.seed(NODES, node("gpu-1", taints=[theirs]))

    await driver.drain("gpu-1", reason=REPAIR.text)
    held = api.emulator.stored(NODES, "gpu-1")
    assert held["spec"]["unschedulable"] is True
    assert held["metadata"]["annotations"]["gpufleet.io/hold"] == REPAIR.text
    assert held["spec"]["taints"] == [
        theirs,
        {"key": "gpufleet.io/repair", "value": "repair", "effect": "NoSchedule"},
    ]
    conditions = {c["type"]: c for c in held["status"]["conditions"]}
    assert conditions["GpuHealthy"]["status"] == "False"
    assert conditions["GpuHealthy"]["reason"] == "Xid79"
    assert conditions["GpuHealthy"]["message"] == REPAIR.text
    # Others' conditions came back exactly as they were (times included).
    assert conditions["KernelDeadlock"]["lastTransitionTime"] == "2026-11-01T00:00:00Z"
    assert conditions["Ready"]["status"] == "True"
    state = {n.name: n for n in await driver.list_nodes()}["gpu-1"]
    assert (state.state, state.reason) == (SchedNodeState.DRAINED, REPAIR.text)

    # Idempotent: a second hold keeps the first reason.
    await driver.drain("gpu-1", reason=acceptance_hold().text)
    assert api.emulator.stored(NODES, "gpu-1")["metadata"]["annotations"]["gpufleet.io/hold"] == (
        REPAIR.text
    )

    await driver.resume("gpu-1")
    released = api.emulator.stored(NODES, "gpu-1")
    assert not released["spec"].get("unschedulable")
    assert released["spec"]["taints"] == [theirs]
    assert "gpufleet.io/hold" not in (released["metadata"].get("annotations") or {})
    conditions = {c["type"]: c for c in released["status"]["conditions"]}
    assert conditions["GpuHealthy"]["status"] == "True"
    assert set(conditions) == {"KernelDeadlock", "Ready", "GpuHealthy"}


async def test_acceptance_hold_cordons_without_unhealthy_condition(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    api.emulator.seed(NODES, node("gpu-1"))
    await driver.drain("gpu-1", reason=acceptance_hold().text)
    held = api.emulator.stored(NODES, "gpu-1")
    assert held["spec"]["unschedulable"] is True
    assert "GpuHealthy" not in {c["type"] for c in held["status"]["conditions"]}


async def test_someone_elses_cordon_is_never_undone(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    api.emulator.seed(NODES, node("gpu-1", unschedulable=True))
    await driver.drain("gpu-1", reason=REPAIR.text)  # left as it is
    assert "annotations" not in api.emulator.stored(NODES, "gpu-1")["metadata"]
    with pytest.raises(DriverError, match="refusing to uncordon node gpu-1"):
        await driver.resume("gpu-1")
    assert api.emulator.stored(NODES, "gpu-1")["spec"]["unschedulable"] is True
    state = {n.name: n for n in await driver.list_nodes()}["gpu-1"]
    assert state.reason == "cordoned (not by gpufleet)"


async def test_a_conflict_reads_again_and_keeps_the_other_writers_change(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    """Another controller adds a taint between gpufleet's read and its write: the write
    is refused (409), read again, and both taints stand."""
    api.emulator.seed(NODES, node("gpu-1"))
    raced = False

    def race(request: kmock.Request) -> Any:
        nonlocal raced
        read = copy.deepcopy(api.emulator.stored(NODES, "gpu-1"))
        if not raced:  # the other writer changes the node just after gpufleet read it
            raced = True
            api.emulator.change(
                NODES,
                "gpu-1",
                {"spec": {"taints": [{"key": "other.io/x", "effect": "NoExecute"}]}},
            )
        return read

    api.emulator[kmock.action.FETCH, NODES, kmock.name("gpu-1")] << race
    await driver.drain("gpu-1", reason=REPAIR.text)
    patches = [r for r in api.emulator if r.method == kmock.method.PATCH and r.subresource is None]
    assert len(patches) >= 2  # the first was refused
    taints = {t["key"] for t in api.emulator.stored(NODES, "gpu-1")["spec"]["taints"]}
    assert taints == {"other.io/x", "gpufleet.io/repair"}


async def test_eviction_waits_out_a_budget_and_never_deletes(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    seed_world(api)
    api.emulator.seed(
        PODS,
        pod(
            "kube-proxy-gpu-1",
            "gpu-1",
            owner=("Node", "gpu-1"),
            annotations={"kubernetes.io/config.mirror": "abc"},
        ),
    )
    api.emulator.seed(
        PDBS,
        {
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}, "minAvailable": 1},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1},
        },
    )
    await driver.drain("gpu-1", reason=REPAIR.text)

    first = await driver.evict_pods("gpu-1")
    assert first.evicted == ()
    assert len(first.blocked) == 1 and first.blocked[0].startswith("ml/train-0 (Cannot evict")
    assert set(first.skipped) == {"ml/exporter-x", "ml/kube-proxy-gpu-1"}
    assert [j.job_id for j in await driver.jobs_on_node("gpu-1")] == ["ml/train-0"]

    api.emulator.change(PDBS, "train", {"status": {"disruptionsAllowed": 1}}, "ml")
    second = await driver.evict_pods("gpu-1")
    assert second.evicted == ("ml/train-0",) and second.blocked == ()
    third = await driver.evict_pods("gpu-1")
    assert third.terminating == ("ml/train-0",) and third.evicted == ()  # its grace period
    for _ in range(100):
        if not await driver.jobs_on_node("gpu-1"):
            break
        await asyncio.sleep(0.05)
    assert await driver.jobs_on_node("gpu-1") == []
    assert api.emulator.stored(PODS, "exporter-x", "ml") is not None  # the DaemonSet pod stays

    evictions = api.emulator.requests_to("post", subresource="eviction")
    assert {r.name for r in evictions} == {"train-0"}  # never the DaemonSet or mirror pod
    assert len(evictions) == 2  # the 429, then the one the budget allowed
    assert api.emulator.requests_to("delete") == []  # no pod deleted


async def test_down_is_the_only_delete_and_spares_daemonsets(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    seed_world(api)
    await driver.down("gpu-1", reason=REPAIR.text)
    deletes = api.emulator.requests_to("delete")
    assert [(r.namespace, r.name) for r in deletes] == [("ml", "train-0")]
    assert api.emulator.stored(NODES, "gpu-1")["spec"]["unschedulable"] is True


async def test_accounting_from_ended_gpu_pods(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    ended = pod("train-1", "gpu-1", gpus=8, phase="Failed")
    ended["status"]["containerStatuses"] = [
        {
            "name": "main",
            "state": {
                "terminated": {
                    "exitCode": 137,
                    "reason": "Error",
                    "startedAt": "2026-12-01T10:00:00Z",
                    "finishedAt": "2026-12-01T12:00:00Z",
                }
            },
        }
    ]
    api.emulator.seed(PODS, ended)
    api.emulator.seed(PODS, pod("cpu-only", "gpu-1", phase="Succeeded"))
    jobs = await driver.accounting_since(dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    assert [(j.job_id, j.state, j.exit_code, j.gpus) for j in jobs] == [
        ("ml/train-1", "Failed", 137, 8)
    ]
    assert await driver.accounting_since(dt.datetime(2026, 12, 2, tzinfo=dt.UTC)) == []


async def test_unreachable_and_refused(api: RunningKubeApi) -> None:
    closed = api.kubeconfig().replace(api.url, "http://127.0.0.1:9")
    scheduler = KubernetesScheduler(KubernetesConfig(kubeconfig=closed, timeout_s=2))
    try:
        with pytest.raises(DriverError, match=r"cannot reach http://127\.0\.0\.1:9") as caught:
            await scheduler.version()
        assert "emulator-token" not in str(caught.value)
    finally:
        await scheduler.aclose()
    with pytest.raises(ValueError, match="no context 'prod'"):
        KubernetesConfig(kubeconfig=api.kubeconfig(), context="prod")


async def test_release_waits_for_the_kubelet_to_report_ready(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    api.emulator.seed(NODES, node("gpu-1"))
    await driver.drain("gpu-1", reason=REPAIR.text)
    # The reboot: the kubelet is gone, then back with a new boot id.
    not_ready = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    api.emulator.change(NODES, "gpu-1", {"status": {"conditions": not_ready}})
    with pytest.raises(DriverError, match=r"gpu-1 is not Ready yet \(NodeStatusUnknown\)"):
        await driver.resume("gpu-1")
    assert api.emulator.stored(NODES, "gpu-1")["spec"]["unschedulable"] is True
    ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    api.emulator.change(
        NODES, "gpu-1", {"status": {"conditions": ready, "nodeInfo": {"bootID": "boot-2"}}}
    )
    await driver.resume("gpu-1")
    assert not api.emulator.stored(NODES, "gpu-1")["spec"].get("unschedulable")
