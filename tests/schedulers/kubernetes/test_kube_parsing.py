"""The pure Kubernetes parser on recorded objects and on variants.

``tests/fixtures/kubernetes/*.json`` are Node and Pod objects as their publishers
recorded them (``SOURCES.md`` there names each source and what was cut). The kinds no
complete recorded object was found for (a GPU node, a NotReady node, a cordoned node, a
node-problem-detector condition that is True, a Pending pod short of ``nvidia.com/gpu``,
a PyTorchJob's pod) are covered here by variants: every one is labelled HAND-WRITTEN and
says what it is built on. The tests at the end pin defects of the parser found (and
fixed) while writing these.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.schedulers.base import SchedJob, SchedNode, SchedNodeState
from gpufleet.schedulers.kubernetes.config import (
    GPU_RESOURCE,
    HOLD_ANNOTATION,
    SLURM_NODE_ANNOTATION,
)
from gpufleet.schedulers.kubernetes.parsing import (
    Condition,
    KubePod,
    Taint,
    condition_reason,
    parse_node,
    parse_pod,
    pending_gpu_demand,
    pod_gpus,
    to_sched_node,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kubernetes"
S = SchedNodeState
UTC = dt.UTC

# What Kubernetes accepts as a condition's ``reason`` (metav1.Condition's validation).
K8S_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@cache
def _recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def recorded(name: str) -> dict[str, Any]:
    """A fresh copy of a recorded object (variants change their copy, never the cache)."""
    obj: dict[str, Any] = json.loads(_recorded(name))
    return obj


WORKER = "node-kube-worker-1.k8s-docs.json"
GKE_NPD = "node-gke-npd-conditions.nais-fasit.json"
MASTER = "node-master-tainted.openshift-insights.json"
NGINX = "pod-nginx-replicaset.k8s-docs.json"
SDN = "pod-sdn-controller-daemonset.openshift-insights.json"
MIRROR = "pod-kube-scheduler-mirror.openshift-insights.json"
JOB_FAILED = "pod-job-failed-exit3.openshift-insights.json"
KUEUE_GPU = "pod-gpu-unschedulable-terminating.kueue-2213.json"

NODES = (WORKER, GKE_NPD, MASTER)
PODS = (NGINX, SDN, MIRROR, JOB_FAILED, KUEUE_GPU)


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


# --------------------------------------------------------------- recorded nodes


def test_every_fixture_is_documented() -> None:
    on_disk = {p.name for p in FIXTURES.glob("*.json")}
    assert set(NODES + PODS) <= on_disk
    sources = (FIXTURES / "SOURCES.md").read_text()
    for name in on_disk:
        assert f"`{name}`" in sources, f"{name} has no entry in SOURCES.md"


def test_docs_node_kube_worker_1() -> None:
    node = parse_node(recorded(WORKER))
    assert node.name == "kube-worker-1"
    assert node.resource_version == "4026"
    assert node.ready is True
    assert node.not_ready_reason is None
    assert node.unschedulable is False
    assert (node.gpu_capacity, node.gpu_allocatable) == (0, 0)
    assert node.boot_id == "22333234-7a6b-44d4-9ce1-67e31dc7e369"
    assert node.taints == ()
    assert node.hold_reason is None
    assert node.slurm_node is None
    assert [c.type for c in node.conditions] == [
        "NetworkUnavailable",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "Ready",
    ]
    assert node.condition("Ready") == Condition(
        type="Ready",
        status="True",
        reason="KubeletReady",
        message="kubelet is posting ready status. AppArmor enabled",
    )
    assert node.condition("KernelDeadlock") is None
    assert node.labels["kubernetes.io/hostname"] == "kube-worker-1"


def test_gke_node_with_node_problem_detector_conditions() -> None:
    node = parse_node(recorded(GKE_NPD))
    assert node.name == "gk3-nais-io-nap-1acv0bno-8e1cf148-kkdf"
    assert node.ready is True
    assert node.boot_id == "83e94cae-a54b-497c-9ea8-9a378ebb6977"
    assert (node.gpu_capacity, node.gpu_allocatable) == (0, 0)
    assert node.taints == ()
    npd = {
        "KernelDeadlock": "KernelHasNoDeadlock",
        "ReadonlyFilesystem": "FilesystemIsNotReadOnly",
        "CorruptDockerOverlay2": "NoCorruptDockerOverlay2",
        "FrequentUnregisterNetDevice": "NoFrequentUnregisterNetDevice",
        "FrequentKubeletRestart": "NoFrequentKubeletRestart",
        "FrequentDockerRestart": "NoFrequentDockerRestart",
        "FrequentContainerdRestart": "NoFrequentContainerdRestart",
    }
    for kind, reason in npd.items():
        condition = node.condition(kind)
        assert condition is not None, kind
        assert (condition.status, condition.reason) == ("False", reason)
    assert len(node.conditions) == 12
    assert node.labels["cloud.google.com/gke-nodepool"] == "nap-1acv0bno"


def test_openshift_master_keeps_its_taint_and_anonymised_boot_id() -> None:
    node = parse_node(recorded(MASTER))
    assert node.name == "master-0.imeixner20210707.lab.upshift.rdu2.redhat.com"
    assert node.taints == (Taint(key="node-role.kubernetes.io/master", effect="NoSchedule"),)
    assert node.unschedulable is False  # a taint is not a cordon
    assert node.ready is True
    # The publisher replaced the boot id with x's; the parser passes on what it is given.
    assert node.boot_id == "x" * 36
    assert node.labels["node-role.kubernetes.io/master"] == ""


# ---------------------------------------------------------------- recorded pods


def test_docs_pod_owned_by_a_replicaset() -> None:
    pod = parse_pod(recorded(NGINX))
    assert pod.key == "default/nginx-deployment-67d4bdd6f5-w6kd7"
    assert pod.uid == "a6501da1-0447-4262-98eb-c03d4002222e"
    assert pod.node == "kube-worker-1"
    assert pod.phase == "Running"
    assert pod.gpus == 0
    assert (pod.owner_kind, pod.owner_name) == ("ReplicaSet", "nginx-deployment-67d4bdd6f5")
    assert (pod.mirror, pod.daemonset, pod.terminating, pod.ended) == (False,) * 4
    assert pod.grace_s == 30
    assert pod.service_account == "default"
    assert pod.created_at == at("2022-02-17T21:51:01Z")
    assert pod.started_at == at("2022-02-17T21:51:01Z")
    assert (pod.ended_at, pod.exit_code, pod.unschedulable_reason) == (None, None, None)
    assert pod.slurm_node is None
    assert pod.to_sched_job() == SchedJob(
        job_id="default/nginx-deployment-67d4bdd6f5-w6kd7",
        name="nginx-deployment-67d4bdd6f5",
        user="default",
        account="default",
        state="Running",
        nodes=("kube-worker-1",),
        gpus=0,
        submitted_at=at("2022-02-17T21:51:01Z"),
        started_at=at("2022-02-17T21:51:01Z"),
        extra={
            "namespace": "default",
            "pod": "nginx-deployment-67d4bdd6f5-w6kd7",
            "owner_kind": "ReplicaSet",
            "owner_name": "nginx-deployment-67d4bdd6f5",
        },
    )


def test_daemonset_pod_ignores_its_previous_containers_exit() -> None:
    pod = parse_pod(recorded(SDN))
    assert pod.key == "openshift-sdn/sdn-controller-xcnqb"
    assert pod.daemonset is True
    assert (pod.owner_kind, pod.owner_name) == ("DaemonSet", "sdn-controller")
    assert pod.node == "ci-ln-d53y532-f76d1-2btqq-master-1"
    assert pod.phase == "Running"
    assert pod.mirror is False
    # lastState.terminated (exit 255 before a restart) is history: a running pod has none.
    assert pod.exit_code is None
    assert pod.ended_at is None
    assert pod.service_account == "sdn-controller"
    assert pod.started_at == at("2020-08-12T08:28:52Z")


def test_static_pod_is_a_mirror_owned_by_its_node() -> None:
    pod = parse_pod(recorded(MIRROR))
    assert pod.mirror is True
    assert (pod.owner_kind, pod.owner_name) == (
        "Node",
        "master-0.imeixner20210707.lab.upshift.rdu2.redhat.com",
    )
    assert pod.node == "master-0.imeixner20210707.lab.upshift.rdu2.redhat.com"
    assert pod.daemonset is False
    assert pod.phase == "Running"
    assert pod.gpus == 0  # an init container and three containers, none asking for GPUs
    assert pod.exit_code is None  # its init container exited 0, but the pod runs on
    assert pod.service_account is None  # the static manifest names none
    assert pod.grace_s == 30


def test_failed_job_pod_has_its_exit_code_and_end() -> None:
    pod = parse_pod(recorded(JOB_FAILED))
    assert pod.key == "di-288312/auditlog-retention-28566720-t22qj"
    assert (pod.owner_kind, pod.owner_name) == ("Job", "auditlog-retention-28566720")
    assert pod.phase == "Failed"
    assert pod.ended is True
    assert pod.exit_code == 3
    assert pod.ended_at == at("2024-04-25T00:01:03Z")
    assert pod.started_at == at("2024-04-25T00:00:00Z")
    assert pod.node == "pvx508.wdf.sap.corp"
    assert pod.gpus == 0
    job = pod.to_sched_job()
    assert (job.job_id, job.name, job.state) == (
        "di-288312/auditlog-retention-28566720-t22qj",
        "auditlog-retention-28566720",
        "Failed",
    )
    assert (job.exit_code, job.ended_at, job.account) == (
        3,
        at("2024-04-25T00:01:03Z"),
        "di-288312",
    )
    assert job.extra["owner_kind"] == "Job"


def test_kueue_gpu_pod_unschedulable_failed_and_terminating() -> None:
    pod = parse_pod(recorded(KUEUE_GPU))
    assert pod.key == "kueue-dws/dws-pod"
    assert pod.gpus == 1
    assert pod.node is None
    assert pod.phase == "Failed"
    assert pod.terminating is True
    assert (pod.owner_kind, pod.owner_name) == (None, None)
    assert pod.unschedulable_reason == (
        "0/9 nodes are available: 9 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/9 nodes are available: 9 Preemption is not helpful for scheduling."
    )
    # It never ran a container: no end time and no exit code, though the pod has ended.
    assert (pod.ended, pod.ended_at, pod.exit_code, pod.started_at) == (True, None, None, None)
    job = pod.to_sched_job()
    assert (job.name, job.state, job.nodes, job.gpus) == ("dws-pod", "Failed", (), 1)
    assert job.extra["terminating"] == "true"
    # Failed, being deleted, and short of a node selector, not of GPUs: no GPU demand.
    assert pending_gpu_demand([pod]) == 0


def test_recorded_pods_ask_for_no_new_gpus() -> None:
    assert pending_gpu_demand(parse_pod(recorded(name)) for name in PODS) == 0


# ------------------------------------------------- recorded nodes as the protocol sees them


def test_docs_worker_with_its_cpu_pod_is_idle() -> None:
    node = parse_node(recorded(WORKER))
    pods = [parse_pod(recorded(NGINX))]
    assert to_sched_node(node, pods) == SchedNode(name="kube-worker-1", state=S.IDLE)


def test_master_with_its_mirror_pod_is_idle() -> None:
    node = parse_node(recorded(MASTER))
    pods = [parse_pod(recorded(name)) for name in PODS]  # only the mirror pod is on it
    assert to_sched_node(node, pods) == SchedNode(name=node.name, state=S.IDLE)


def test_gke_node_without_pods_is_idle() -> None:
    node = parse_node(recorded(GKE_NPD))
    assert to_sched_node(node, []) == SchedNode(name=node.name, state=S.IDLE)


# ------------------------------------------------------------------ HAND-WRITTEN variants
# Each variant below is built by this file, not recorded; each says what it is built on.

# HAND-WRITTEN around a recorded excerpt: the node ``status`` as posted in
# NVIDIA/k8s-device-plugin issue #58 (a 16-GPU node whose plugin marked every GPU
# unhealthy); the issue posted no metadata and no conditions, so the name is ours.
DEVICE_PLUGIN_58_STATUS: dict[str, Any] = {
    "addresses": [
        {"address": "134.79.129.97", "type": "InternalIP"},
        {"address": "ocio-gpu01", "type": "Hostname"},
    ],
    "allocatable": {
        "cpu": "48",
        "ephemeral-storage": "9391196145",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "263412492Ki",
        "nvidia.com/gpu": "0",
        "pods": "110",
    },
    "capacity": {
        "cpu": "48",
        "ephemeral-storage": "10190100Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "263514892Ki",
        "nvidia.com/gpu": "16",
        "pods": "110",
    },
}


def test_variant_device_plugin_58_status() -> None:
    node = parse_node({"metadata": {"name": "ocio-gpu01"}, "status": DEVICE_PLUGIN_58_STATUS})
    assert (node.gpu_capacity, node.gpu_allocatable) == (16, 0)
    assert node.ready is None  # no Ready condition was posted
    assert node.conditions == ()
    # No Ready condition: unknown. The GPU count falls back to capacity when allocatable
    # is 0 (``allocatable or capacity``).
    assert to_sched_node(node, []) == SchedNode(name="ocio-gpu01", state=S.UNKNOWN, gpus=16)


def gpu_worker(gpus: Any = "8") -> dict[str, Any]:
    """HAND-WRITTEN: the recorded kube-worker-1 with ``gpus`` in capacity and allocatable."""
    obj = recorded(WORKER)
    obj["status"]["capacity"][GPU_RESOURCE] = gpus
    obj["status"]["allocatable"][GPU_RESOURCE] = gpus
    return obj


API_VERSIONS = {"PyTorchJob": "kubeflow.org/v1", "StatefulSet": "apps/v1"}


def gpu_pod(
    name: str,
    gpus: Any,
    *,
    node: str | None = "kube-worker-1",
    owner: tuple[str, str] | None = ("Job", "train"),
    phase: str = "Running",
) -> dict[str, Any]:
    """HAND-WRITTEN: the recorded kueue GPU pod, renamed, asking for ``gpus`` (limits only,
    as most GPU manifests do), bound to ``node`` and owned by ``owner``."""
    obj = recorded(KUEUE_GPU)
    meta, spec, status = obj["metadata"], obj["spec"], obj["status"]
    meta["name"], meta["namespace"] = name, "ml"
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "finalizers"):
        meta.pop(key)
    if owner is not None:
        kind, owner_name = owner
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSIONS.get(kind, "batch/v1"),
                "kind": kind,
                "name": owner_name,
                "uid": "00000000-0000-4000-8000-000000000000",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    resources = spec["containers"][0]["resources"]
    del resources["requests"][GPU_RESOURCE]
    resources["limits"][GPU_RESOURCE] = gpus
    if node is not None:
        spec["nodeName"] = node
    status["phase"] = phase
    status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    return obj


@pytest.mark.parametrize("gpus", ["8", 8, " 8 "], ids=["string", "int", "padded"])
def test_variant_gpu_node_quantity_as_string_or_int(gpus: Any) -> None:
    node = parse_node(gpu_worker(gpus))
    assert (node.gpu_capacity, node.gpu_allocatable) == (8, 8)


def test_variant_gpu_node_partly_and_fully_allocated() -> None:
    node = parse_node(gpu_worker("8"))
    job = parse_pod(gpu_pod("train-0", "2"))
    sts = parse_pod(gpu_pod("infer-0", 6, owner=("StatefulSet", "infer")))
    done = parse_pod(gpu_pod("old-0", "8", phase="Succeeded"))
    elsewhere = parse_pod(gpu_pod("far-0", "8", node="kube-worker-2"))
    waiting = parse_pod(gpu_pod("queued-0", "8", node=None, phase="Pending"))
    cpu_only = parse_pod(recorded(NGINX))
    assert (job.gpus, sts.gpus, sts.owner_kind) == (2, 6, "StatefulSet")

    ignored = [done, elsewhere, waiting, cpu_only]
    assert to_sched_node(node, [job, *ignored]) == SchedNode(
        name="kube-worker-1", state=S.MIXED, gpus=8, gpus_allocated=2, job_ids=("ml/train-0",)
    )
    assert to_sched_node(node, [job, sts, *ignored]) == SchedNode(
        name="kube-worker-1",
        state=S.ALLOCATED,
        gpus=8,
        gpus_allocated=8,
        job_ids=("ml/train-0", "ml/infer-0"),
    )


def test_variant_pytorchjob_pod() -> None:
    pod = parse_pod(gpu_pod("bert-worker-0", 8, owner=("PyTorchJob", "bert")))
    assert (pod.owner_kind, pod.owner_name, pod.gpus) == ("PyTorchJob", "bert", 8)
    assert pod.to_sched_job().name == "bert"


def test_variant_owner_prefers_the_controller_reference() -> None:
    obj = recorded(JOB_FAILED)
    job_ref = obj["metadata"]["ownerReferences"][0]
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "u"}
    obj["metadata"]["ownerReferences"] = [other, job_ref]
    assert parse_pod(obj).owner_kind == "Job"
    job_ref.pop("controller")  # no controller among them: the first one
    assert parse_pod(obj).owner_kind == "ConfigMap"


# HAND-WRITTEN: the recorded kube-worker-1 with the conditions and taints that the same
# kubernetes.io page shows for it, down, in its ``kubectl describe`` output.
def down_worker() -> dict[str, Any]:
    obj = recorded(WORKER)
    unknown = "Kubelet stopped posting node status."
    for condition in obj["status"]["conditions"]:
        if condition["type"] != "NetworkUnavailable":
            condition.update(status="Unknown", reason="NodeStatusUnknown", message=unknown)
    obj["spec"]["taints"] = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    ]
    return obj


def test_variant_not_ready_node_is_down() -> None:
    node = parse_node(down_worker())
    assert node.ready is False
    assert node.not_ready_reason == "NodeStatusUnknown"
    assert [t.effect for t in node.taints] == ["NoExecute", "NoSchedule"]
    assert to_sched_node(node, [parse_pod(recorded(NGINX))]) == SchedNode(
        name="kube-worker-1", state=S.DOWN, reason="NodeStatusUnknown"
    )


@pytest.mark.parametrize(
    ("ready", "reason"),
    [
        (
            {"type": "Ready", "status": "False", "message": "PLEG is not healthy"},
            "PLEG is not healthy",
        ),
        ({"type": "Ready", "status": "False"}, "Ready=False"),
        ({"type": "Ready"}, "Ready=Unknown"),
    ],
)
def test_variant_not_ready_reason_falls_back(ready: dict[str, str], reason: str) -> None:
    obj = recorded(WORKER)
    obj["status"]["conditions"] = [ready]
    node = parse_node(obj)
    assert node.ready is False
    assert to_sched_node(node, []).reason == reason


# HAND-WRITTEN: the spec of a cordoned node as published (the ``kubectl get node rpi405
# -o yaml`` excerpt named in SOURCES.md) on the recorded kube-worker-1.
CORDON_SPEC: dict[str, Any] = {
    "taints": [
        {
            "effect": "NoSchedule",
            "key": "node.kubernetes.io/unschedulable",
            "timeAdded": "2021-07-10T09:41:33Z",
        }
    ],
    "unschedulable": True,
}


def cordoned_worker(gpus: str = "8") -> dict[str, Any]:
    obj = gpu_worker(gpus)
    obj["spec"] = copy.deepcopy(CORDON_SPEC)
    return obj


def test_variant_cordoned_node() -> None:
    node = parse_node(cordoned_worker())
    assert node.unschedulable is True
    assert node.taints == (Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"),)
    assert node.hold_reason is None
    drained = SchedNode(
        name="kube-worker-1", state=S.DRAINED, reason="cordoned (not by gpufleet)", gpus=8
    )
    assert to_sched_node(node, [parse_pod(recorded(NGINX))]) == drained
    assert to_sched_node(node, [parse_pod(gpu_pod("train-0", "2"))]) == SchedNode(
        name="kube-worker-1",
        state=S.DRAINING,
        reason="cordoned (not by gpufleet)",
        gpus=8,
        gpus_allocated=2,
        job_ids=("ml/train-0",),
    )


def test_variant_cordoned_node_waits_for_terminating_pods_but_not_daemonsets() -> None:
    node = parse_node(cordoned_worker())
    leaving = recorded(NGINX)
    leaving["metadata"]["deletionTimestamp"] = "2022-02-17T22:00:00Z"
    assert to_sched_node(node, [parse_pod(leaving)]).state is S.DRAINING
    daemon = recorded(SDN)
    daemon["spec"]["nodeName"] = "kube-worker-1"
    daemon["metadata"]["deletionTimestamp"] = "2022-02-17T22:00:00Z"
    assert to_sched_node(node, [parse_pod(daemon)]).state is S.DRAINED


def test_variant_held_node_reports_the_hold_and_the_slurm_node() -> None:
    obj = cordoned_worker()
    obj["metadata"]["annotations"][HOLD_ANNOTATION] = "repair xid-79"
    obj["metadata"]["annotations"][SLURM_NODE_ANNOTATION] = "gpu-001"
    node = parse_node(obj)
    assert (node.hold_reason, node.slurm_node) == ("repair xid-79", "gpu-001")
    assert to_sched_node(node, []).reason == "repair xid-79"
    obj["metadata"]["annotations"][HOLD_ANNOTATION] = ""  # an empty annotation holds nothing
    assert parse_node(obj).hold_reason is None


def test_variant_problem_condition_does_not_change_the_state() -> None:
    """HAND-WRITTEN: the recorded GKE node with node-problem-detector's KernelDeadlock True.
    The parser reports the condition; whether it makes the node unhealthy is not its call."""
    obj = recorded(GKE_NPD)
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "KernelDeadlock":
            condition.update(status="True", reason="DockerHung", message="task docker:7 blocked")
    node = parse_node(obj)
    deadlock = node.condition("KernelDeadlock")
    assert deadlock == Condition(
        type="KernelDeadlock", status="True", reason="DockerHung", message="task docker:7 blocked"
    )
    assert node.ready is True
    assert to_sched_node(node, []).state is S.IDLE


# HAND-WRITTEN around recorded messages: scheduler messages as they appear in the titles of
# NVIDIA/k8s-device-plugin issues #430 and #119.
SHORT_OF_GPUS = (
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
    "available: 1 No preemption victims found for incoming pod.."
)
SHORT_OF_GPUS_OR_CORDONED = (
    "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."
)


def pending_gpu_pod(gpus: Any = "1", message: str = SHORT_OF_GPUS) -> dict[str, Any]:
    """HAND-WRITTEN: the recorded kueue pod as it would be before Kueue stopped it: Pending,
    not being deleted, its PodScheduled condition carrying ``message``."""
    obj = recorded(KUEUE_GPU)
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "finalizers"):
        obj["metadata"].pop(key)
    resources = obj["spec"]["containers"][0]["resources"]
    resources["requests"][GPU_RESOURCE] = resources["limits"][GPU_RESOURCE] = gpus
    obj["status"]["phase"] = "Pending"
    obj["status"]["conditions"][0]["message"] = message
    del obj["status"]["conditions"][1]  # Kueue's TerminationTarget
    return obj


def test_variant_pending_pod_short_of_gpus_is_demand() -> None:
    pod = parse_pod(pending_gpu_pod())
    assert (pod.phase, pod.node, pod.terminating, pod.gpus) == ("Pending", None, False, 1)
    assert pod.unschedulable_reason == SHORT_OF_GPUS
    assert pod.ended_at is None and pod.exit_code is None
    assert pending_gpu_demand([pod]) == 1
    other = parse_pod(pending_gpu_pod(4, SHORT_OF_GPUS_OR_CORDONED))
    assert pending_gpu_demand([pod, other, parse_pod(recorded(KUEUE_GPU))]) == 5


def test_variant_pending_pods_that_are_not_gpu_demand() -> None:
    recorded_message = parse_pod(recorded(KUEUE_GPU)).unschedulable_reason
    assert recorded_message is not None
    not_gpus = parse_pod(pending_gpu_pod(message=recorded_message))
    bound = pending_gpu_pod()
    bound["spec"]["nodeName"] = "kube-worker-1"
    leaving = pending_gpu_pod()
    leaving["metadata"]["deletionTimestamp"] = "2024-05-17T14:06:40Z"
    gated = pending_gpu_pod()
    gated["status"]["conditions"][0]["reason"] = "SchedulingGated"
    scheduled = pending_gpu_pod()
    scheduled["status"]["conditions"][0]["status"] = "True"
    no_gpus = pending_gpu_pod(gpus="0")
    others = [parse_pod(obj) for obj in (bound, leaving, gated, scheduled, no_gpus)]
    assert others[2].unschedulable_reason is None  # only reason Unschedulable counts
    assert pending_gpu_demand([not_gpus, *others]) == 0


def test_unschedulable_without_a_message_says_so() -> None:
    obj = pending_gpu_pod()
    del obj["status"]["conditions"][0]["message"]
    assert parse_pod(obj).unschedulable_reason == "Unschedulable"


# ------------------------------------------------------------ variants of shape


@pytest.mark.parametrize(
    ("value", "expected"),
    [("8", 8), (8, 8), ("0", 0), (0, 0), (None, 0), ("2k", 2000), ("\t4\n", 4)],
)
def test_gpu_quantities(value: Any, expected: int) -> None:
    obj = recorded(WORKER)
    obj["status"]["capacity"][GPU_RESOURCE] = value
    assert parse_node(obj).gpu_capacity == expected


@pytest.mark.parametrize("value", ["1.5", 1.5, "500m", "-1", "", "eight", True, [8], {"n": 8}])
def test_gpu_quantity_not_a_count_names_the_node(value: Any) -> None:
    obj = recorded(WORKER)
    obj["status"]["allocatable"][GPU_RESOURCE] = value
    with pytest.raises(ValueError, match=r"^node kube-worker-1: nvidia\.com/gpu is "):
        parse_node(obj)


@pytest.mark.parametrize("where", ["requests", "limits"])
def test_gpu_quantity_not_a_count_names_the_pod(where: str) -> None:
    obj = recorded(NGINX)
    obj["spec"]["containers"][0]["resources"][where][GPU_RESOURCE] = "0.5"
    with pytest.raises(ValueError, match=r"^pod default/nginx-deployment-67d4bdd6f5-w6kd7: "):
        parse_pod(obj)


def test_missing_status_spec_and_conditions() -> None:
    node = parse_node({"metadata": {"name": "bare"}})
    assert (node.ready, node.unschedulable, node.gpu_capacity, node.gpu_allocatable) == (
        None,
        False,
        0,
        0,
    )
    assert (node.boot_id, node.resource_version, node.taints, node.conditions) == (
        None,
        None,
        (),
        (),
    )
    assert to_sched_node(node, []) == SchedNode(name="bare", state=S.UNKNOWN)

    no_conditions = recorded(WORKER)
    del no_conditions["status"]["conditions"]
    assert parse_node(no_conditions).ready is None

    pod = parse_pod({"metadata": {"name": "bare"}})
    assert (pod.namespace, pod.phase, pod.node, pod.gpus, pod.owner_kind) == (
        "default",
        "Pending",
        None,
        0,
        None,
    )
    assert (pod.unschedulable_reason, pod.started_at, pod.grace_s, pod.mirror) == (
        None,
        None,
        None,
        False,
    )
    assert pending_gpu_demand([pod]) == 0


@pytest.mark.parametrize("obj", [{}, {"metadata": {}}, {"metadata": {"name": ""}}, {"metadata": 7}])
def test_objects_without_a_name_are_refused(obj: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"^a Node has no metadata\.name$"):
        parse_node(obj)
    with pytest.raises(ValueError, match=r"^a Pod has no metadata\.name$"):
        parse_pod(obj)


# Maps whose keys are data (a label, a resource name), not fields of the API's schema.
DATA_MAPS = frozenset(
    {"labels", "annotations", "capacity", "allocatable", "requests", "limits", "nodeSelector"}
)


def _with_unknown_fields(value: Any, parent: str = "") -> Any:
    """Every object of the schema gains a field a later Kubernetes might add."""
    if isinstance(value, dict):
        out = {key: _with_unknown_fields(item, key) for key, item in value.items()}
        if parent not in DATA_MAPS:
            out["x-future-field"] = {"alpha": [1, "two", None]}
        return out
    if isinstance(value, list):
        return [_with_unknown_fields(item, parent) for item in value]
    return value


@pytest.mark.parametrize("name", NODES)
def test_unknown_node_fields_are_ignored(name: str) -> None:
    assert parse_node(_with_unknown_fields(recorded(name))) == parse_node(recorded(name))


@pytest.mark.parametrize("name", PODS)
def test_unknown_pod_fields_are_ignored(name: str) -> None:
    assert parse_pod(_with_unknown_fields(recorded(name))) == parse_pod(recorded(name))


def test_malformed_lists_and_entries_are_skipped() -> None:
    obj = recorded(WORKER)
    obj["spec"]["taints"] = ["NoSchedule", {"effect": "NoSchedule"}, {"key": "a"}]
    obj["status"]["conditions"] = [None, {"status": "True"}, {"type": "Ready", "status": "True"}]
    node = parse_node(obj)
    assert node.taints == (Taint(key="a", effect=""),)
    assert node.conditions == (Condition(type="Ready", status="True"),)
    assert node.ready is True
    obj["status"]["conditions"] = {"type": "Ready"}  # not a list
    assert parse_node(obj).ready is None


# ---------------------------------------------------------------------- pod_gpus


def container(gpus: Any = None, *, request: Any = None, always: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources["limits"] = {GPU_RESOURCE: gpus}
    if request is not None:
        resources["requests"] = {GPU_RESOURCE: request}
    out: dict[str, Any] = {"name": "c", "resources": resources}
    if always:
        out["restartPolicy"] = "Always"
    return out


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, 0),
        ({"containers": [container(2), container(1), container()]}, 3),
        ({"containers": [container(request="2")]}, 2),
        ({"containers": [container("4", request="4")]}, 4),
        # An explicit request wins over the limit (for GPUs they must be equal anyway).
        ({"containers": [container("4", request="0")]}, 0),
        # Init containers run one at a time before the others: the largest counts...
        ({"initContainers": [container(4), container(1)], "containers": [container(2)]}, 4),
        ({"initContainers": [container(1)], "containers": [container(2)]}, 2),
        # ...but restartable ones (sidecars) keep running beside the containers.
        ({"initContainers": [container(1, always=True)], "containers": [container(2)]}, 3),
        (
            {
                "initContainers": [container(2), container(1, always=True)],
                "containers": [container(2)],
            },
            3,
        ),
        ({"initContainers": [container(2), container(1, always=True)]}, 2),
        ({"containers": "not a list", "initContainers": [None, "x", container(1)]}, 1),
    ],
)
def test_pod_gpus(spec: dict[str, Any], expected: int) -> None:
    assert pod_gpus(spec, where="pod ml/p") == expected


def test_pod_gpus_on_a_recorded_pod_with_init_containers() -> None:
    obj = recorded(MIRROR)
    obj["spec"]["initContainers"][0]["resources"]["limits"] = {GPU_RESOURCE: "1"}
    obj["spec"]["containers"][1]["resources"]["limits"] = {GPU_RESOURCE: 1}
    assert parse_pod(obj).gpus == 1
    obj["spec"]["initContainers"][0]["resources"]["limits"] = {GPU_RESOURCE: "1.5"}
    with pytest.raises(ValueError, match=r"^pod openshift-kube-scheduler/openshift-kube-sch"):
        parse_pod(obj)


# -------------------------------------------------------------- exits and ends


def ended_pod(*finished: tuple[int, str], phase: str = "Failed") -> dict[str, Any]:
    """HAND-WRITTEN: the recorded failed Job pod with one terminated container per entry."""
    obj = recorded(JOB_FAILED)
    template = obj["status"]["containerStatuses"][0]
    statuses = []
    for code, finished_at in finished:
        status = copy.deepcopy(template)
        status["state"]["terminated"].update(exitCode=code, finishedAt=finished_at)
        statuses.append(status)
    obj["status"]["containerStatuses"] = statuses
    obj["status"]["phase"] = phase
    return obj


def test_exit_code_is_the_first_failure_and_the_end_the_last_finish() -> None:
    pod = parse_pod(ended_pod((0, "2024-04-25T00:02:00Z"), (137, "2024-04-25T00:01:00Z")))
    assert (pod.exit_code, pod.ended_at) == (137, at("2024-04-25T00:02:00Z"))
    pod = parse_pod(ended_pod((0, "2024-04-25T00:01:00Z"), phase="Succeeded"))
    assert (pod.exit_code, pod.ended_at) == (0, at("2024-04-25T00:01:00Z"))
    # A container that ended in a pod still running (phase Running) ends nothing.
    pod = parse_pod(ended_pod((1, "2024-04-25T00:01:00Z"), phase="Running"))
    assert (pod.exit_code, pod.ended_at) == (None, None)


def test_unreadable_times_are_none() -> None:
    obj = recorded(JOB_FAILED)
    obj["metadata"]["creationTimestamp"] = "yesterday"
    obj["status"]["startTime"] = 1714003200
    obj["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = None
    pod = parse_pod(obj)
    assert (pod.created_at, pod.started_at, pod.ended_at, pod.exit_code) == (None, None, None, 3)
    obj["status"]["startTime"] = "2024-04-25T00:00:00"  # no zone: UTC
    assert parse_pod(obj).started_at == dt.datetime(2024, 4, 25, tzinfo=UTC)


def test_mirror_is_the_annotation_whatever_its_value() -> None:
    obj = recorded(NGINX)
    obj["metadata"]["annotations"] = {"kubernetes.io/config.mirror": ""}
    assert parse_pod(obj).mirror is True


# ---------------------------------------------------------------- condition_reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("xid-79", "Xid79"),
        ("gpu-fell-off-bus", "GpuFellOffBus"),
        ("", "Gpufleet"),
        ("---", "Gpufleet"),
        ("79", "Gpufleet79"),
        ("79 xid", "Gpufleet79Xid"),
        ("GPU has fallen off the bus", "GPUHasFallenOffTheBus"),
        ("ecc_dbe", "EccDbe"),
        ("nvlink: down", "NvlinkDown"),
        ("été", "T"),
    ],
)
def test_condition_reason(text: str, reason: str) -> None:
    assert condition_reason(text) == reason
    assert K8S_REASON.match(reason)


@settings(max_examples=100, database=None, deadline=None)
@given(st.text(max_size=80))
def test_condition_reason_is_always_a_kubernetes_reason(text: str) -> None:
    reason = condition_reason(text)
    assert K8S_REASON.match(reason), reason
    assert 1 <= len(reason) <= 128


# -------------------------------------------------------------- property tests

# JSON-like values, and objects shaped like Nodes and Pods whose every field may be missing
# or any JSON value, so that the paths the parser walks (status.capacity,
# spec.containers[].resources.limits, ...) are reached with good and bad values.
# Floats are finite: an infinite float is a known failure (see the xfail below).
KEYS = st.sampled_from(
    [
        "metadata",
        "name",
        "namespace",
        "annotations",
        "labels",
        "ownerReferences",
        "deletionTimestamp",
        "creationTimestamp",
        "resourceVersion",
        "uid",
        "controller",
        "kind",
        "spec",
        "status",
        "capacity",
        "allocatable",
        GPU_RESOURCE,
        "conditions",
        "type",
        "reason",
        "message",
        "taints",
        "key",
        "effect",
        "value",
        "unschedulable",
        "nodeInfo",
        "bootID",
        "containers",
        "initContainers",
        "resources",
        "requests",
        "limits",
        "restartPolicy",
        "nodeName",
        "hostname",
        "phase",
        "startTime",
        "containerStatuses",
        "state",
        "terminated",
        "exitCode",
        "finishedAt",
        "terminationGracePeriodSeconds",
        "serviceAccountName",
        HOLD_ANNOTATION,
        "kubernetes.io/config.mirror",
    ]
) | st.text(max_size=6)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["True", "False", "Ready", "Always", "Pending", "Failed", "Unschedulable"])
    | st.sampled_from(["PodScheduled", "2024-04-25T00:01:03Z", "8", "1k", "0.5", "DaemonSet"])
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)


def _shaped(required: dict[str, Any], **optional: Any) -> Any:
    """An object of the schema's shape: any of its fields may be missing, and its leaves
    are any JSON (the other property tests' objects are any JSON at every level)."""
    return st.fixed_dictionaries(required, optional=optional)


# A GPU quantity: mostly counts, in both of the API's spellings, sometimes anything.
QUANTITY = st.one_of(
    st.integers(0, 16), st.integers(0, 16).map(str), st.sampled_from(["2k", " 4 "]), SCALARS
)
RESOURCE_LIST = _shaped({GPU_RESOURCE: QUANTITY}, cpu=JSON)
CONTAINERS = st.lists(
    _shaped(
        {"resources": _shaped({"limits": RESOURCE_LIST}, requests=RESOURCE_LIST)},
        restartPolicy=st.sampled_from(["Always", "OnFailure"]) | SCALARS,
    ),
    max_size=3,
)
CONDITIONS = st.lists(
    _shaped(
        {
            "type": st.sampled_from(["Ready", "PodScheduled", "KernelDeadlock"]) | SCALARS,
            "status": st.sampled_from(["True", "False", "Unknown"]) | SCALARS,
        },
        reason=st.sampled_from(["Unschedulable", "KubeletReady"]) | SCALARS,
        message=st.sampled_from([SHORT_OF_GPUS, "x"]) | SCALARS,
    ),
    max_size=3,
)
TERMINATED = _shaped(
    {"exitCode": st.integers(-1, 255) | SCALARS},
    finishedAt=st.sampled_from(["2024-04-25T00:01:03Z", "2024-04-25T00:01:03"]) | SCALARS,
)
STATUSES = st.lists(_shaped({"state": _shaped({"terminated": TERMINATED})}), max_size=2)
METADATA = _shaped(
    {"name": st.text(min_size=1, max_size=8)},
    namespace=SCALARS,
    annotations=_shaped({}, **{HOLD_ANNOTATION: SCALARS, "kubernetes.io/config.mirror": SCALARS}),
    labels=JSON,
    ownerReferences=st.lists(_shaped({}, kind=SCALARS, name=SCALARS, controller=SCALARS)),
    deletionTimestamp=SCALARS,
    creationTimestamp=SCALARS,
)
SHAPED = _shaped(
    {
        "metadata": METADATA,
        "spec": _shaped(
            {"containers": CONTAINERS},
            initContainers=CONTAINERS,
            nodeName=SCALARS,
            taints=st.lists(_shaped({}, key=SCALARS, effect=SCALARS, value=SCALARS), max_size=2),
            unschedulable=SCALARS,
            terminationGracePeriodSeconds=SCALARS,
        ),
        "status": _shaped(
            {"capacity": RESOURCE_LIST, "conditions": CONDITIONS},
            allocatable=RESOURCE_LIST,
            nodeInfo=_shaped({}, bootID=SCALARS),
            phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded"]) | SCALARS,
            containerStatuses=STATUSES,
            startTime=SCALARS,
        ),
    }
)
OBJECTS = SHAPED | st.dictionaries(KEYS, JSON, max_size=6)
PROPERTY = settings(
    max_examples=120, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY
@given(OBJECTS)
def test_parse_node_returns_or_raises_value_error(obj: dict[str, Any]) -> None:
    try:
        node = parse_node(obj)
    except ValueError:
        return
    to_sched_node(node, [])


@PROPERTY
@given(OBJECTS)
def test_parse_pod_returns_or_raises_value_error(obj: dict[str, Any]) -> None:
    try:
        pod = parse_pod(obj)
    except ValueError:
        return
    assert isinstance(pod, KubePod)
    pod.to_sched_job()
    pending_gpu_demand([pod])


def _whole(value: Any) -> bool:
    """Whether a quantity may be a whole number of GPUs by Kubernetes' quantity grammar:
    a non-negative whole number (an int, an integral float, ASCII digits with an optional
    ``+``, zero decimals, an exponent or a suffix). Over-range values count as whole
    here (the parser refuses them too; this only picks what must be refused)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if isinstance(value, float):
        return value.is_integer() and value >= 0
    pattern = r"\+?[0-9]+(\.0*)?([eE][0-9]+|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?"
    return isinstance(value, str) and re.fullmatch(pattern, value.strip()) is not None


NOT_WHOLE = (
    st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="ascii"), max_size=10)
    | st.sampled_from(["0.5", "1.5", "500m", "1e-3", "-8", "-1", "8 GPUs", "1K", "k", "٨"])
    | st.booleans()
    | st.lists(st.integers(), max_size=2)
).filter(lambda value: not _whole(value))


@settings(max_examples=100, database=None, deadline=None)
@given(
    NOT_WHOLE,
    st.sampled_from(["capacity", "allocatable", "requests", "limits", "init"]),
)
def test_gpu_quantity_not_whole_raises_naming_the_object(value: Any, where: str) -> None:
    if where in ("capacity", "allocatable"):
        obj = recorded(MASTER)
        obj["status"][where][GPU_RESOURCE] = value
        name = "node master-0.imeixner20210707.lab.upshift.rdu2.redhat.com"
        parse = parse_node
    else:
        obj = recorded(MIRROR)
        target = (
            obj["spec"]["initContainers"][0] if where == "init" else obj["spec"]["containers"][2]
        )
        target["resources"].setdefault("limits", {})[GPU_RESOURCE] = value
        if where == "requests":
            target["resources"]["requests"][GPU_RESOURCE] = value
        name = "pod openshift-kube-scheduler/openshift-kube-scheduler-master-0.imeixner"
        parse = parse_pod
    with pytest.raises(ValueError, match=re.escape(name)) as raised:
        parse(obj)
    assert GPU_RESOURCE in str(raised.value)


# ------------------------------------------------------------ defects found and fixed
# Each was a defect of parsing.py found while writing these tests.


@pytest.mark.parametrize("raw", ["1e400", "Infinity"])
def test_infinite_grace_period_is_a_value_error_or_none(raw: str) -> None:
    # Python's json module reads both as float('inf'); parse_pod then calls int() on it.
    text = '{"metadata": {"name": "p"}, "spec": {"terminationGracePeriodSeconds": ' + raw + "}}"
    obj = json.loads(text)
    try:
        pod = parse_pod(obj)
    except ValueError:
        return
    assert pod.grace_s is None


@pytest.mark.parametrize(
    "value", ["٨", "²", "８"], ids=["arabic-indic", "superscript", "fullwidth"]
)
def test_non_ascii_digits_are_refused_naming_the_node(value: str) -> None:
    obj = recorded(WORKER)
    obj["status"]["capacity"][GPU_RESOURCE] = value
    with pytest.raises(ValueError, match=r"^node kube-worker-1: "):
        parse_node(obj)


def test_negative_int_quantity_is_refused() -> None:
    obj = recorded(WORKER)
    obj["status"]["capacity"][GPU_RESOURCE] = -1
    with pytest.raises(ValueError, match=r"^node kube-worker-1: "):
        parse_node(obj)


def test_init_container_peak_includes_earlier_sidecars() -> None:
    # KEP-753 (and k8s.io/component-helpers resource.AggregateContainerRequests): a regular
    # init container needs its own requests plus those of every restartable init container
    # before it, which keep running. Here: 1 (sidecar) + 2 (init) = 3 while initialising.
    spec = {"initContainers": [container(1, always=True), container(2)], "containers": []}
    assert pod_gpus(spec, where="pod ml/p") == 3


@pytest.mark.parametrize(
    ("value", "count"),
    [(8, 8), ("8", 8), ("+8", 8), (8.0, 8), ("8.00", 8), ("1e1", 10), ("1k", 1000), ("1Ki", 1024)],
)
def test_quantities_in_kubernetes_grammar(value: Any, count: int) -> None:
    obj = recorded(WORKER)
    obj["status"]["capacity"][GPU_RESOURCE] = value
    assert parse_node(obj).gpu_capacity == count
