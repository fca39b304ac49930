"""Pending work from Kubernetes: the GPU pods the scheduler could not place for lack of
room. The pure parser on the recorded kueue pod and HAND-WRITTEN variants of it (as in
``test_kube_parsing.py``: the recorded object with the fields named changed), then the
driver through the real client against the API emulator."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import kmock
import pytest

from gpufleet.core.autoscale import PendingWork
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SupportsPendingWork
from gpufleet.schedulers.kubernetes.config import GPU_RESOURCE, KubernetesConfig
from gpufleet.schedulers.kubernetes.driver import KubernetesScheduler
from gpufleet.schedulers.kubernetes.parsing import (
    parse_pod,
    pending_gpu_demand,
    pending_work,
    waits_for_gpus,
)
from gpufleet.testing.kube_api import PODS, RunningKubeApi, pod_object

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kubernetes"
KUEUE_GPU = "pod-gpu-unschedulable-terminating.kueue-2213.json"
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
CREATED = dt.datetime(2024, 5, 17, 14, 2, 54, tzinfo=dt.UTC)  # the recorded pod's
# Scheduler messages as published (NVIDIA/k8s-device-plugin issues #430, #119) and as
# the scheduler words the other shortages.
SHORT_OF_GPUS = (
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
    "available: 1 No preemption victims found for incoming pod.."
)
SHORT_OF_CPU = "0/4 nodes are available: 1 node(s) were unschedulable, 3 Insufficient cpu."
TOO_MANY_PODS = "0/2 nodes are available: 2 Too many pods."
NO_NODES = "no nodes available to schedule pods"
AFFINITY = (  # the recorded pod's own message
    "0/9 nodes are available: 9 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/9 nodes are available: 9 Preemption is not helpful for scheduling."
)
TAINT = "0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: infra}."


def recorded() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((FIXTURES / KUEUE_GPU).read_text())
    return obj


def waiting(
    message: str = SHORT_OF_GPUS, *, gpus: Any = "1", since: str | None = "2024-05-17T14:03:10Z"
) -> dict[str, Any]:
    """HAND-WRITTEN: the recorded kueue pod before Kueue stopped it: Pending, not being
    deleted, its PodScheduled condition carrying ``message`` since ``since``."""
    obj = recorded()
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "finalizers"):
        obj["metadata"].pop(key)
    resources = obj["spec"]["containers"][0]["resources"]
    resources["requests"][GPU_RESOURCE] = resources["limits"][GPU_RESOURCE] = gpus
    obj["status"]["phase"] = "Pending"
    obj["status"]["conditions"][0]["message"] = message
    obj["status"]["conditions"][0]["lastTransitionTime"] = since
    del obj["status"]["conditions"][1]  # Kueue's TerminationTarget
    return obj


# ---------------------------------------------------------------------- parser


def test_the_recorded_pod_is_no_pending_work() -> None:
    """Failed, being deleted, and short of a matching node selector, not of room."""
    pod = parse_pod(recorded())
    assert pod.unschedulable_reason == AFFINITY
    assert pod.unschedulable_since is None  # recorded with lastTransitionTime: null
    assert not waits_for_gpus(pod)
    assert pending_work([pod], now=NOW) == []


def test_a_pod_short_of_gpus_waits_since_it_became_unschedulable() -> None:
    pod = parse_pod(waiting(gpus="4"))
    since = dt.datetime(2024, 5, 17, 14, 3, 10, tzinfo=dt.UTC)
    assert pod.unschedulable_since == since
    assert pending_work([pod], now=NOW) == [PendingWork("kueue-dws/dws-pod", 4, since)]
    assert pending_gpu_demand([pod]) == 4


def test_without_a_transition_time_it_waits_since_its_creation_else_now() -> None:
    pod = parse_pod(waiting(since=None))
    assert pending_work([pod], now=NOW) == [PendingWork("kueue-dws/dws-pod", 1, CREATED)]
    bare = waiting(since=None)
    del bare["metadata"]["creationTimestamp"]
    assert pending_work([parse_pod(bare)], now=NOW)[0].since == NOW
    garbled = waiting(since="yesterday")
    assert pending_work([parse_pod(garbled)], now=NOW)[0].since == CREATED


@pytest.mark.parametrize("message", [SHORT_OF_GPUS, SHORT_OF_CPU, TOO_MANY_PODS, NO_NODES])
def test_shortages_one_more_node_cures(message: str) -> None:
    assert [w.gpus for w in pending_work([parse_pod(waiting(message))], now=NOW)] == [1]


@pytest.mark.parametrize("message", [AFFINITY, TAINT, "Unschedulable"])
def test_no_node_of_the_same_kind_would_take_it(message: str) -> None:
    assert pending_work([parse_pod(waiting(message))], now=NOW) == []


def test_pods_that_do_not_wait_for_gpus() -> None:
    bound = waiting()
    bound["spec"]["nodeName"] = "gpu-1"
    leaving = waiting()
    leaving["metadata"]["deletionTimestamp"] = "2024-05-17T14:06:40Z"
    gated = waiting()  # Kueue and other scheduling gates hold it back: not our demand
    gated["status"]["conditions"][0]["reason"] = "SchedulingGated"
    running = waiting()
    running["status"]["phase"] = "Running"
    scheduled = waiting()
    scheduled["status"]["conditions"][0]["status"] = "True"
    no_gpus = waiting(gpus="0")
    pods = [parse_pod(o) for o in (bound, leaving, gated, running, scheduled, no_gpus)]
    assert pending_work(pods, now=NOW) == []
    assert pending_gpu_demand(pods) == 0


def test_gpus_are_summed_over_containers_and_init_containers_take_the_max() -> None:
    many = waiting(gpus="2")
    many["spec"]["containers"].append(
        {"name": "sidecar", "resources": {"limits": {GPU_RESOURCE: 3}}}  # limit only
    )
    assert pending_work([parse_pod(many)], now=NOW)[0].gpus == 5
    init = waiting(gpus="2")
    init["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"requests": {GPU_RESOURCE: "8"}}},
        {"name": "fetch", "resources": {}},
    ]
    assert pending_work([parse_pod(init)], now=NOW)[0].gpus == 8
    sidecar = waiting(gpus="2")  # a restartable init container runs alongside
    sidecar["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {GPU_RESOURCE: 1}}}
    ]
    assert pending_work([parse_pod(sidecar)], now=NOW)[0].gpus == 3


def test_order_is_kept_and_the_total_matches() -> None:
    first, second = waiting(gpus="8"), waiting(SHORT_OF_CPU, gpus="2")
    second["metadata"]["name"], second["metadata"]["namespace"] = "b", "ml"
    pods = [parse_pod(first), parse_pod(waiting(AFFINITY)), parse_pod(second)]
    assert [(w.id, w.gpus) for w in pending_work(pods, now=NOW)] == [
        ("kueue-dws/dws-pod", 8),
        ("ml/b", 2),
    ]
    assert pending_gpu_demand(pods) == 10


# ---------------------------------------------------------------------- driver


def unschedulable(name: str, gpus: int, message: str, *, since: str) -> dict[str, Any]:
    obj = pod_object(name, None, gpus=gpus, phase="Pending")
    obj["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": since,
        }
    ]
    return obj


async def test_driver_lists_the_pods_that_wait_for_room(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    assert isinstance(driver, SupportsPendingWork)
    assert await driver.pending_work() == []
    api.emulator.seed(PODS, unschedulable("a", 8, SHORT_OF_GPUS, since="2026-12-01T10:00:00Z"))
    api.emulator.seed(PODS, unschedulable("b", 4, SHORT_OF_CPU, since="2026-12-01T10:05:00Z"))
    api.emulator.seed(PODS, unschedulable("c", 8, AFFINITY, since="2026-12-01T10:00:00Z"))
    api.emulator.seed(PODS, pod_object("train-0", "gpu-1", gpus=8))
    api.emulator.seed(PODS, pod_object("fresh", None, gpus=2, phase="Pending"))  # not yet seen
    work = await driver.pending_work()
    assert work == [
        PendingWork("ml/a", 8, dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)),
        PendingWork("ml/b", 4, dt.datetime(2026, 12, 1, 10, 5, tzinfo=dt.UTC)),
    ]
    assert await driver.pending_gpu_demand() == 12
    lists = [r for r in api.emulator if r.method == kmock.method.GET and r.resource == PODS]
    assert lists[-1].params["fieldSelector"] == "status.phase=Pending"


async def test_driver_raises_when_the_api_cannot_be_read(api: RunningKubeApi) -> None:
    closed = api.kubeconfig().replace(api.url, "http://127.0.0.1:9")
    scheduler = KubernetesScheduler(KubernetesConfig(kubeconfig=closed, timeout_s=2))
    try:
        with pytest.raises(DriverError, match=r"GET pods \(status\.phase=Pending\): cannot reach"):
            await scheduler.pending_work()
    finally:
        await scheduler.aclose()


async def test_driver_raises_on_a_pod_it_cannot_read(
    api: RunningKubeApi, driver: KubernetesScheduler
) -> None:
    api.emulator.seed(PODS, unschedulable("bad", 1, SHORT_OF_GPUS, since="2026-12-01T10:00:00Z"))
    api.emulator.change(
        PODS,
        "bad",
        {"spec": {"containers": [{"name": "m", "resources": {"limits": {GPU_RESOURCE: "0.5"}}}]}},
        "ml",
    )
    with pytest.raises(DriverError, match=r"could not read a pod: pod ml/bad: nvidia\.com/gpu"):
        await driver.pending_work()
