"""Reading Kubernetes Node and Pod objects (the API's JSON, as plain dicts) into what the
driver needs. Pure: no I/O, no client import, so recorded objects are test fixtures.

Objects from any Kubernetes version parse: every field is optional except the names;
quantities may be strings or numbers (``"8"``, ``8``); unknown fields are ignored. What
is malformed (a node without a name, a GPU quantity that is not a whole number) raises
``ValueError`` saying which object and field.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.core.autoscale import PendingWork
from gpufleet.schedulers.base import SchedJob, SchedNode, SchedNodeState
from gpufleet.schedulers.kubernetes.config import (
    GPU_RESOURCE,
    HOLD_ANNOTATION,
    SLURM_NODE_ANNOTATION,
)

# The kubelet marks a static pod's API copy with this annotation; it cannot be evicted.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# Pod phases that mean the pod has ended (it holds nothing).
ENDED_PHASES = frozenset({"Succeeded", "Failed"})
# A Slinky slurmd pod: owned by a NodeSet (slinky.slurm.net), or labelled as slurmd. Its
# Slurm node is the pod's hostname (``slurmd -Z`` registers the host it runs as), which
# is ``spec.hostname`` when set and the pod's name otherwise.
SLINKY_OWNER_KIND = "NodeSet"
SLURMD_NAME_LABEL = ("app.kubernetes.io/name", "slurmd")
# What the scheduler says when a pod does not fit for lack of room that one more node
# brings: "3 Insufficient nvidia.com/gpu" (or cpu, memory...), "Too many pods", or no
# node at all ("no nodes available to schedule pods", a node pool scaled to zero).
_MESSAGE_SHORTAGE = re.compile(
    r"Insufficient\s+\S|Too many pods|no nodes available to schedule pods", re.IGNORECASE
)
# A Kubernetes quantity, ASCII only: sign, digits, an exponent or a suffix.
_QUANTITY = re.compile(
    r"\+?(?P<number>[0-9]{1,12}(?:\.[0-9]{1,12})?)"
    r"(?:[eE](?P<exponent>[0-9]{1,2})|(?P<suffix>k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?",
    re.ASCII,
)
_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
# More GPUs than any node or pod has: a typo or garbage, refused.
_MAX_GPUS = 1_000_000


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class KubeNode:
    name: str
    resource_version: str | None
    unschedulable: bool
    ready: bool | None  # None: no Ready condition (a node still registering)
    gpu_capacity: int
    gpu_allocatable: int
    hold_reason: str | None  # gpufleet's annotation: set while gpufleet holds the node
    boot_id: str | None
    taints: tuple[Taint, ...] = ()
    conditions: tuple[Condition, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    slurm_node: str | None = None  # the Slurm node gpufleet drained for its hold

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def not_ready_reason(self) -> str | None:
        ready = self.condition("Ready")
        if ready is None or ready.status == "True":
            return None
        return ready.reason or ready.message or f"Ready={ready.status}"


@dataclass(frozen=True, slots=True)
class KubePod:
    namespace: str
    name: str
    uid: str | None
    node: str | None
    phase: str
    gpus: int  # GPUs the pod holds while it runs (its effective request)
    owner_kind: str | None
    owner_name: str | None
    mirror: bool
    terminating: bool
    grace_s: int | None
    labels: Mapping[str, str]
    service_account: str | None
    created_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    exit_code: int | None
    unschedulable_reason: str | None  # PodScheduled=False, reason Unschedulable: its message
    hostname: str | None = None  # spec.hostname
    unschedulable_since: dt.datetime | None = None  # that condition's lastTransitionTime
    restarts: int = 0  # its containers' restarts (the kubelet restarted them in place)
    last_termination: str | None = None  # why a container last ended ("Error, exit 137")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def daemonset(self) -> bool:
        return self.owner_kind == "DaemonSet"

    @property
    def ended(self) -> bool:
        return self.phase in ENDED_PHASES

    @property
    def slurm_node(self) -> str | None:
        """The Slurm node this pod runs, for a Slinky slurmd pod; None for other pods."""
        key, value = SLURMD_NAME_LABEL
        if self.owner_kind != SLINKY_OWNER_KIND and self.labels.get(key) != value:
            return None
        return self.hostname or self.name

    def to_sched_job(self) -> SchedJob:
        """A pod as a job: its id is ``namespace/name``; its account is the namespace (a
        project maps to namespaces); its name is what owns it (a Job, a PyTorchJob...)."""
        extra = {"namespace": self.namespace, "pod": self.name}
        if self.owner_kind:
            extra["owner_kind"] = self.owner_kind
        if self.owner_name:
            extra["owner_name"] = self.owner_name
        if self.terminating:
            extra["terminating"] = "true"
        return SchedJob(
            job_id=self.key,
            name=self.owner_name or self.name,
            user=self.service_account or "default",
            account=self.namespace,
            state=("Terminating" if self.terminating and not self.ended else self.phase),
            nodes=(self.node,) if self.node else (),
            gpus=self.gpus,
            submitted_at=self.created_at,
            started_at=self.started_at,
            ended_at=self.ended_at,
            exit_code=self.exit_code,
            extra=extra,
        )


def parse_node(obj: Mapping[str, Any]) -> KubeNode:
    meta = _mapping(obj.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a Node has no metadata.name")
    spec, status = _mapping(obj.get("spec")), _mapping(obj.get("status"))
    annotations = _mapping(meta.get("annotations"))
    conditions = tuple(
        Condition(
            type=str(c.get("type")),
            status=str(c.get("status", "Unknown")),
            reason=_text(c.get("reason")),
            message=_text(c.get("message")),
        )
        for c in _list(status.get("conditions"))
        if isinstance(c, Mapping) and c.get("type")
    )
    ready = next((c for c in conditions if c.type == "Ready"), None)
    taints = tuple(
        Taint(key=str(t.get("key")), effect=str(t.get("effect", "")), value=_text(t.get("value")))
        for t in _list(spec.get("taints"))
        if isinstance(t, Mapping) and t.get("key")
    )
    where = f"node {name}"
    hold = annotations.get(HOLD_ANNOTATION)
    return KubeNode(
        name=name,
        resource_version=_text(meta.get("resourceVersion")),
        unschedulable=bool(spec.get("unschedulable")),
        ready=None if ready is None else ready.status == "True",
        gpu_capacity=_gpus(_mapping(status.get("capacity")).get(GPU_RESOURCE), where=where),
        gpu_allocatable=_gpus(_mapping(status.get("allocatable")).get(GPU_RESOURCE), where=where),
        hold_reason=hold if isinstance(hold, str) and hold else None,
        boot_id=_text(_mapping(status.get("nodeInfo")).get("bootID")),
        taints=taints,
        conditions=conditions,
        labels={str(k): str(v) for k, v in _mapping(meta.get("labels")).items()},
        slurm_node=_text(annotations.get(SLURM_NODE_ANNOTATION)),
    )


def parse_pod(obj: Mapping[str, Any]) -> KubePod:
    meta = _mapping(obj.get("metadata"))
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name:
        raise ValueError("a Pod has no metadata.name")
    spec, status = _mapping(obj.get("spec")), _mapping(obj.get("status"))
    where = f"pod {namespace}/{name}"
    owner = next(
        (
            o
            for o in _list(meta.get("ownerReferences"))
            if isinstance(o, Mapping) and o.get("controller")
        ),
        None,
    ) or next((o for o in _list(meta.get("ownerReferences")) if isinstance(o, Mapping)), None)
    terminated = [
        _mapping(_mapping(s.get("state")).get("terminated"))
        for s in _list(status.get("containerStatuses"))
        if isinstance(s, Mapping)
    ]
    finished = [t for t in terminated if t]
    scheduled = next(
        (
            c
            for c in _list(status.get("conditions"))
            if isinstance(c, Mapping) and c.get("type") == "PodScheduled"
        ),
        None,
    )
    unschedulable = unschedulable_since = None
    if (
        scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    ):
        unschedulable = str(scheduled.get("message") or "Unschedulable")
        unschedulable_since = _time(scheduled.get("lastTransitionTime"))
    phase = str(status.get("phase") or "Pending")
    exit_codes = [int(t["exitCode"]) for t in finished if isinstance(t.get("exitCode"), int)]
    grace = spec.get("terminationGracePeriodSeconds")
    annotations = _mapping(meta.get("annotations"))
    return KubePod(
        namespace=str(namespace),
        name=name,
        uid=_text(meta.get("uid")),
        node=_text(spec.get("nodeName")),
        phase=phase,
        gpus=pod_gpus(spec, where=where),
        owner_kind=_text(owner.get("kind")) if owner else None,
        owner_name=_text(owner.get("name")) if owner else None,
        mirror=MIRROR_ANNOTATION in annotations,
        terminating=bool(meta.get("deletionTimestamp")),
        grace_s=int(grace)
        if isinstance(grace, int) or (isinstance(grace, float) and math.isfinite(grace))
        else None,
        labels={str(k): str(v) for k, v in _mapping(meta.get("labels")).items()},
        service_account=_text(spec.get("serviceAccountName")),
        created_at=_time(meta.get("creationTimestamp")),
        started_at=_time(status.get("startTime")),
        ended_at=max((t for t in (_time(f.get("finishedAt")) for f in finished) if t), default=None)
        if phase in ENDED_PHASES
        else None,
        exit_code=(next((c for c in exit_codes if c != 0), 0) if exit_codes else None)
        if phase in ENDED_PHASES
        else None,
        unschedulable_reason=unschedulable,
        hostname=_text(spec.get("hostname")),
        unschedulable_since=unschedulable_since,
        restarts=sum(
            int(s["restartCount"])
            for s in _list(status.get("containerStatuses"))
            if isinstance(s, Mapping)
            and isinstance(s.get("restartCount"), int)
            and not isinstance(s.get("restartCount"), bool)
            and s["restartCount"] >= 0
        ),
        last_termination=_last_termination(status),
    )


def _last_termination(status: Mapping[str, Any]) -> str | None:
    """How a container of the pod last ended, when one was restarted: reason and exit."""
    for container in _list(status.get("containerStatuses")):
        if not isinstance(container, Mapping):
            continue
        ended = _mapping(_mapping(container.get("lastState")).get("terminated"))
        if ended:
            reason = _text(ended.get("reason")) or "terminated"
            code = ended.get("exitCode")
            return f"{reason}, exit {code}" if isinstance(code, int) else reason
    return None


def pod_gpus(spec: Mapping[str, Any], *, where: str) -> int:
    """The GPUs a pod holds: the sum over its containers (and restartable init containers,
    "sidecars", which run alongside), or the largest init container's if that is more,
    as the scheduler counts. A request defaults to the limit (extended resources must
    have both, equal)."""

    def one(container: Any) -> int:
        resources = _mapping(_mapping(container).get("resources"))
        wanted = _mapping(resources.get("requests")).get(GPU_RESOURCE)
        if wanted is None:
            wanted = _mapping(resources.get("limits")).get(GPU_RESOURCE)
        return _gpus(wanted, where=where)

    # Init containers run in order; a restartable one (a sidecar) keeps running, so a
    # regular init container after it needs its own GPUs plus every earlier sidecar's.
    sidecars = 0
    peak = 0
    for container in _list(spec.get("initContainers")):
        if _mapping(container).get("restartPolicy") == "Always":
            sidecars += one(container)
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + one(container))
    running = sum(one(c) for c in _list(spec.get("containers"))) + sidecars
    return max(running, peak)


def to_sched_node(node: KubeNode, pods: Iterable[KubePod]) -> SchedNode:
    """A node as the scheduler protocol sees it. A cordoned node is draining while GPU
    pods (or pods still terminating) remain on it, drained after; not Ready is down."""
    holding = [p for p in pods if p.node == node.name and not p.ended]
    gpu_pods = [p for p in holding if p.gpus > 0]
    used = sum(p.gpus for p in gpu_pods)
    if node.unschedulable:
        busy = gpu_pods or [p for p in holding if p.terminating and not p.daemonset]
        state = SchedNodeState.DRAINING if busy else SchedNodeState.DRAINED
    elif node.ready is False:
        state = SchedNodeState.DOWN
    elif node.ready is None:
        state = SchedNodeState.UNKNOWN
    elif used == 0:
        state = SchedNodeState.IDLE
    elif used >= node.gpu_allocatable > 0:
        state = SchedNodeState.ALLOCATED
    else:
        state = SchedNodeState.MIXED
    reason = node.hold_reason
    if reason is None and node.unschedulable:
        reason = "cordoned (not by gpufleet)"
    if reason is None and node.ready is False:
        reason = node.not_ready_reason
    return SchedNode(
        name=node.name,
        state=state,
        reason=reason,
        gpus=node.gpu_allocatable or node.gpu_capacity,
        gpus_allocated=used,
        job_ids=tuple(p.key for p in gpu_pods),
    )


def waits_for_gpus(pod: KubePod) -> bool:
    """A GPU pod the scheduler could not place for lack of room: Pending, not bound to a
    node, not being deleted, asking for ``nvidia.com/gpu``, PodScheduled=False with
    reason Unschedulable and a message naming a shortage one more node cures (module
    ``_MESSAGE_SHORTAGE``: GPUs, CPU or memory short, too many pods, no node at all).
    Not counted: a pod unschedulable only for a node selector or affinity nothing
    matches, a taint it does not tolerate, a volume (a new GPU node would not take it
    either), and one held back before scheduling (reason SchedulingGated: Kueue and
    other gates)."""
    return (
        pod.phase == "Pending"
        and not pod.node
        and not pod.terminating
        and pod.gpus > 0
        and pod.unschedulable_reason is not None
        and _MESSAGE_SHORTAGE.search(pod.unschedulable_reason) is not None
    )


def pending_work(pods: Iterable[KubePod], *, now: dt.datetime) -> list[PendingWork]:
    """Each pod that ``waits_for_gpus``, in the order given: id ``namespace/name``, its
    GPUs (``pod_gpus``), and since when it waits: when it became unschedulable (the
    condition's ``lastTransitionTime``), else its creation, else ``now``."""
    return [
        PendingWork(id=p.key, gpus=p.gpus, since=p.unschedulable_since or p.created_at or now)
        for p in pods
        if waits_for_gpus(p)
    ]


def pending_gpu_demand(pods: Iterable[KubePod]) -> int:
    """GPUs asked for by the pods that ``waits_for_gpus``, in all."""
    return sum(p.gpus for p in pods if waits_for_gpus(p))


def condition_reason(text: str) -> str:
    """A condition's ``reason`` from free text: Kubernetes wants CamelCase letters, digits,
    ``_``, ``,`` and ``:`` (``xid-79`` → ``Xid79``)."""
    words = re.split(r"[^A-Za-z0-9]+", text)
    reason = "".join(w[:1].upper() + w[1:] for w in words if w)
    if not reason or not reason[0].isalpha():
        reason = "Gpufleet" + reason
    return reason[:128]


def _gpus(value: Any, *, where: str) -> int:
    """A GPU count from a Kubernetes quantity: ``8``, ``"8"``, ``"+8"``, ``8.0``,
    ``"1e1"``, ``"1k"``, ``"1Ki"``. Anything that is not a whole, non-negative, sane
    number of GPUs raises ``ValueError`` naming the object."""
    if value is None:
        return 0
    wrong = ValueError(f"{where}: {GPU_RESOURCE} is {value!r}, not a whole number of GPUs")
    if isinstance(value, bool):
        raise wrong
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise wrong
        value = int(value)
    if isinstance(value, int):
        if not 0 <= value <= _MAX_GPUS:
            raise wrong
        return value
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise wrong
    number, exponent, suffix = match.group("number", "exponent", "suffix")
    whole, _, fraction = number.partition(".")
    if fraction.strip("0"):
        raise wrong
    count: int = int(whole or "0") * 10 ** int(exponent or "0") * _SUFFIXES[suffix or ""]
    if count > _MAX_GPUS:
        raise wrong
    return count


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
