"""``KubernetesScheduler``: the ``Scheduler`` driver over a Kubernetes cluster's API.

What gpufleet does to a node it holds, in Kubernetes' own terms (docs/kubernetes.md):

- **cordon**: ``spec.unschedulable`` plus the annotation ``gpufleet.io/hold`` (the hold's
  reason, as Slurm's drain reason: ``gpufleet: <repair id> <signature>``) and a
  ``NoSchedule`` taint ``gpufleet.io/repair``; for a health hold (a repair, the
  healthcheck) also the node condition ``GpuHealthy=False`` with the signature as its
  reason and the hold as its message, as node-problem-detector and NVSentinel report.
  A node someone else cordoned is left as it is (their cordon is not ours to undo).
- **release**: only a node with gpufleet's annotation is uncordoned; the taint goes and
  the condition turns ``True``. Other controllers' taints and conditions are never
  touched: every change is a read-modify-write of the whole list, sent as a merge patch
  that carries the ``resourceVersion`` it read, and a 409 Conflict reads again.
- **drain**: the pods leave through the Eviction API (``evict_pods``, each pass of the
  repair's draining step): a PodDisruptionBudget's 429 is waited out, DaemonSet and
  mirror pods are left alone, each pod gets its own grace period. No pod is deleted,
  except by ``down``: an admin forcing the repair.
- **jobs** on a node are its pods that request ``nvidia.com/gpu`` and have not ended (a
  pod still terminating holds its GPUs); the job id is ``namespace/name`` and the
  account is the namespace.

**Slurm on Kubernetes** (Slinky): given the cluster's Slurm driver (``slurm``), a node
that runs a slurmd pod is held in Slurm's order: the hold drains its Slurm node first
(with gpufleet's reason, before Slinky could turn a cordon into a drain of its own), the
Slurm jobs are waited for, and only then is the node cordoned and its pods evicted; the
release uncordons first and resumes the Slurm node after. The Slurm node is the slurmd
pod's hostname; it is kept in the annotation ``gpufleet.io/slurm-node`` for the release.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from gpufleet.core.autoscale import PendingWork
from gpufleet.core.clock import as_utc
from gpufleet.core.errors import DriverError
from gpufleet.core.holds import HoldKind, parse_hold_reason
from gpufleet.schedulers.base import EvictionPass, SchedJob, SchedNode, both
from gpufleet.schedulers.kubernetes.client import KubeClient, KubeStatusError
from gpufleet.schedulers.kubernetes.config import (
    HEALTH_CONDITION,
    HOLD_ANNOTATION,
    HOLD_TAINT_KEY,
    SLURM_NODE_ANNOTATION,
    KubernetesConfig,
)
from gpufleet.schedulers.kubernetes.parsing import (
    KubeNode,
    KubePod,
    condition_reason,
    parse_node,
    parse_pod,
    pending_gpu_demand,
    pending_work,
    to_sched_node,
)

# Pods that hold a node: every phase but the ended ones (a field selector the API has).
_LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
# Read-modify-write attempts before a node that keeps changing is reported as an error.
_CONFLICT_ATTEMPTS = 5


class SlurmSide(Protocol):
    """What the driver needs of the Slurm driver on a Slurm-on-Kubernetes cluster (the
    Slurm driver's own methods: Scheduler, SupportsDrain, SupportsDown)."""

    async def jobs_on_node(self, node: str) -> list[SchedJob]: ...

    async def jobs_on_nodes(self, nodes: Sequence[str]) -> dict[str, list[SchedJob] | None]: ...

    async def drain(self, node: str, *, reason: str) -> None: ...

    async def resume(self, node: str) -> None: ...

    async def down(self, node: str, *, reason: str) -> None: ...


class KubernetesScheduler:
    """A Kubernetes cluster, through its API server. Implements Scheduler,
    SupportsJobsOnNodes, SupportsDrain, SupportsDown, SupportsEviction and
    SupportsPendingWork.

    Every method raises ``DriverError`` naming the node and the request when a call
    fails; none returns an empty list in place of an error.
    """

    kind = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        client: KubeClient | None = None,
        slurm: SlurmSide | None = None,
    ) -> None:
        self._config = config
        self._client = client or KubeClient(config)
        self._slurm = slurm  # Slurm on this cluster's nodes (Slinky), if any

    @property
    def server(self) -> str:
        return self._client.server

    @property
    def slurm(self) -> SlurmSide | None:
        """The Slurm driver holds go through first (Slurm on Kubernetes), if any."""
        return self._slurm

    async def aclose(self) -> None:
        await self._client.aclose()

    async def version(self) -> str:
        """The API server's version (``GET /version``): the reach check."""
        answer = await self._guard(None, self._client.version())
        return str(answer.get("gitVersion") or "unknown")

    # ------------------------------------------------------------------------ reads

    async def list_nodes(self) -> list[SchedNode]:
        """Every node, with state, gpufleet's hold reason, GPUs and the GPU pods on it."""
        nodes = await self._guard(None, self._client.list_nodes())
        on_node: dict[str, list[KubePod]] = {}
        for pod in await self._pods(_LIVE_PODS, node=None):
            if pod.node:
                on_node.setdefault(pod.node, []).append(pod)
        listed = [_node(obj) for obj in nodes.get("items") or []]
        return [to_sched_node(n, on_node.get(n.name, [])) for n in listed]

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        """The GPU pods on ``node`` that have not ended. Raises ``DriverError`` for a node
        the cluster does not know."""
        current, _raw = await self._read_node(node)
        pods = await self._pods(f"spec.nodeName={node},{_LIVE_PODS}", node=node)
        jobs = [p.to_sched_job() for p in pods if p.gpus > 0 and not p.ended]
        slurm_name = current.slurm_node or _slurm_node_of(pods)
        if self._slurm is not None and slurm_name is not None:
            jobs = await self._slurm.jobs_on_node(slurm_name) + jobs
        return jobs

    async def jobs_on_nodes(self, nodes: Sequence[str]) -> dict[str, list[SchedJob] | None]:
        """``jobs_on_node`` of each of ``nodes`` from two reads at once whatever their
        number (every node, every live pod), not two a node in turn; ``None`` for a node
        the cluster does not list. On Slurm on Kubernetes the Slurm jobs of those nodes
        come from one read of Slurm too; a node whose Slurm node Slurm does not list is
        ``None`` as well (its jobs are not known)."""
        listed, live = await both(
            self._guard(None, self._client.list_nodes()), self._pods(_LIVE_PODS, node=None)
        )
        known = {n.name: n for n in (_node(obj) for obj in listed.get("items") or [])}
        on_node: dict[str, list[KubePod]] = {n: [] for n in nodes if n in known}
        for pod in live:
            if pod.node in on_node:
                on_node[pod.node].append(pod)
        pod_jobs = {
            name: [p.to_sched_job() for p in pods if p.gpus > 0 and not p.ended]
            for name, pods in on_node.items()
        }
        slurm_names = {
            name: slurm_name
            for name, pods in on_node.items()
            if (slurm_name := known[name].slurm_node or _slurm_node_of(pods)) is not None
        }
        slurm_jobs: dict[str, list[SchedJob] | None] = {}
        if self._slurm is not None and slurm_names:
            slurm_jobs = await self._slurm.jobs_on_nodes(sorted(set(slurm_names.values())))
        found: dict[str, list[SchedJob] | None] = {}
        for name in nodes:
            if name not in pod_jobs:
                found[name] = None
            elif self._slurm is None or name not in slurm_names:
                found[name] = pod_jobs[name]
            else:
                jobs = slurm_jobs.get(slurm_names[name])
                found[name] = None if jobs is None else jobs + pod_jobs[name]
        return found

    async def slurmd_pods(self) -> list[KubePod]:
        """The Slinky slurmd pods that have not ended, on every node (their node, Slurm
        node, uid and restarts: a restart or a replacement is the self-healing daemon)."""
        return [p for p in await self._pods(_LIVE_PODS, node=None) if p.slurm_node and p.node]

    async def pending_gpu_demand(self) -> int:
        """GPUs asked for by the pods ``pending_work`` lists, in all."""
        return pending_gpu_demand(await self._pods("status.phase=Pending", node=None))

    async def pending_work(self) -> list[PendingWork]:
        """Each Pending GPU pod the scheduler could not place for lack of room
        (``parsing.waits_for_gpus``: PodScheduled=False, reason Unschedulable, a shortage
        in its message): id ``namespace/name``, its ``nvidia.com/gpu`` request over its
        containers (the largest init container's when more), and since when it waits
        (the condition's lastTransitionTime, else its creation). Touches nothing.

        Raises:
            DriverError: the pods cannot be read (never an empty list instead).
        """
        pods = await self._pods("status.phase=Pending", node=None)
        return pending_work(pods, now=dt.datetime.now(dt.UTC))

    async def accounting_since(self, since: dt.datetime) -> list[SchedJob]:
        """GPU pods that ended at or after ``since``, oldest first, from what the API
        server still holds (a Job's pods until its TTL or history limit removes them;
        Kubernetes keeps no accounting of its own)."""
        start = as_utc(since)
        pods = await self._pods("status.phase=Succeeded", node=None)
        pods += await self._pods("status.phase=Failed", node=None)
        ended = [p for p in pods if p.gpus > 0 and p.ended_at is not None and p.ended_at >= start]
        ended.sort(key=lambda p: p.ended_at or start)
        return [p.to_sched_job() for p in ended]

    # ----------------------------------------------------------------------- writes

    async def drain(self, node: str, *, reason: str) -> None:
        """Cordon ``node`` with gpufleet's annotation and taint (and, for a health hold,
        ``GpuHealthy=False``). Idempotent: a node gpufleet already holds keeps its
        reason; one someone else cordoned is left as it is."""
        if not reason.strip():
            raise DriverError(f"kubernetes: node {node}: a cordon needs a reason")
        slurm_name = await self._slurm_node(node)
        if slurm_name is not None and self._slurm is not None:
            # Slurm first, with our reason; the cordon waits for its jobs (evict_pods).
            await self._slurm.drain(slurm_name, reason=reason)

            def pending(current: KubeNode, _raw: dict[str, Any]) -> dict[str, Any] | None:
                if current.hold_reason is not None or current.unschedulable:
                    return None
                annotations = {HOLD_ANNOTATION: reason, SLURM_NODE_ANNOTATION: slurm_name}
                return {"metadata": {"annotations": annotations}}

            held = await self._modify(node, pending, status=False)
        else:
            held = await self._modify(node, _cordon(reason, adopt=False), status=False)
        if held.hold_reason == reason:
            await self._mark_health(node, reason)

    async def resume(self, node: str) -> None:
        """Undo gpufleet's cordon: uncordon, drop its taint, ``GpuHealthy=True`` (and
        resume its Slurm node after, on Slurm on Kubernetes). Only once the node is Ready:
        a node whose kubelet has not come back after a reboot stays held.

        Raises:
            DriverError: the node is cordoned without gpufleet's annotation (someone
                else's cordon, never undone), it is not Ready yet, or a call fails.
        """

        # On Slurm on Kubernetes, the Slurm node to resume after (the uncordon drops its
        # annotation); nothing to read otherwise.
        slurm_name = (await self._read_node(node))[0].slurm_node if self._slurm else None

        def uncordon(current: KubeNode, raw: dict[str, Any]) -> dict[str, Any] | None:
            if current.hold_reason is not None and current.ready is not True:
                raise DriverError(
                    f"kubernetes: node {node} is not Ready yet "
                    f"({current.not_ready_reason or 'no Ready condition'}); it stays cordoned "
                    "until its kubelet reports Ready"
                )
            if current.hold_reason is None:
                if current.unschedulable:
                    raise DriverError(
                        f"kubernetes: refusing to uncordon node {node}: it was not cordoned "
                        f"by gpufleet (no {HOLD_ANNOTATION} annotation); uncordon it by hand "
                        f"with `kubectl uncordon {node}` if it is safe"
                    )
                return None
            taints = [t for t in _raw_taints(raw) if t.get("key") != HOLD_TAINT_KEY]
            return {
                "metadata": {"annotations": {HOLD_ANNOTATION: None, SLURM_NODE_ANNOTATION: None}},
                "spec": {"unschedulable": None, "taints": taints or None},
            }

        await self._modify(node, uncordon, status=False)

        def healthy(current: KubeNode, raw: dict[str, Any]) -> dict[str, Any] | None:
            ours = current.condition(HEALTH_CONDITION)
            if ours is None or ours.status == "True":
                return None
            return _conditions_patch(
                raw, status="True", reason="Healthy", message="released by gpufleet"
            )

        await self._modify(node, healthy, status=True)
        if slurm_name is not None and self._slurm is not None:
            await self._slurm.resume(slurm_name)  # after the uncordon, never before

    async def down(self, node: str, *, reason: str) -> None:
        """An admin forced the repair: cordon, then delete every pod an eviction would
        have asked to leave (each with its grace period). DaemonSet and mirror pods
        stay. The only place gpufleet deletes pods. On a Slurm-on-Kubernetes node the
        Slurm node is downed first (Slurm kills or requeues its jobs)."""
        slurm_name = await self._slurm_node(node)
        if slurm_name is not None and self._slurm is not None:
            await self._slurm.down(slurm_name, reason=reason)
        await self.drain(node, reason=reason)
        await self._modify(node, _cordon(reason, adopt=True), status=False)
        for pod in await self._pods(f"spec.nodeName={node},{_LIVE_PODS}", node=node):
            if pod.daemonset or pod.mirror or pod.terminating or pod.ended:
                continue
            try:
                await self._client.delete_pod(pod.namespace, pod.name)
            except KubeStatusError as exc:
                if exc.status != 404:
                    raise DriverError(f"kubernetes: node {node}: {exc}") from None

    async def evict_pods(self, node: str) -> EvictionPass:
        """Ask every pod on ``node`` to leave through the Eviction API (module doc)."""
        current, _raw = await self._read_node(node)
        if current.slurm_node is not None and not current.unschedulable:
            # Slurm on Kubernetes: cordon and evict once Slurm's jobs have ended.
            if self._slurm is not None:
                jobs = await self._slurm.jobs_on_node(current.slurm_node)
                if jobs:
                    return EvictionPass(
                        blocked=(
                            f"slurm node {current.slurm_node}: {len(jobs)} Slurm job(s) still "
                            "running; the cordon and evictions wait for them",
                        )
                    )
            await self._modify(node, _cordon(current.hold_reason or "", adopt=True), status=False)
        evicted: list[str] = []
        blocked: list[str] = []
        terminating: list[str] = []
        skipped: list[str] = []
        for pod in await self._pods(f"spec.nodeName={node},{_LIVE_PODS}", node=node):
            if pod.ended:
                continue
            if pod.daemonset or pod.mirror:
                skipped.append(pod.key)
                continue
            if pod.terminating:
                terminating.append(pod.key)
                continue
            try:
                await self._client.evict(pod.namespace, pod.name)
            except KubeStatusError as exc:
                if exc.status == 404:
                    continue  # gone since the listing
                if exc.status == 429:  # a PodDisruptionBudget: not now
                    blocked.append(f"{pod.key} ({exc.message})")
                    continue
                raise DriverError(f"kubernetes: node {node}: {exc}") from None
            evicted.append(pod.key)
        return EvictionPass(
            evicted=tuple(evicted),
            blocked=tuple(blocked),
            terminating=tuple(terminating),
            skipped=tuple(skipped),
        )

    # ---------------------------------------------------------------------- helpers

    async def _guard(self, node: str | None, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except KubeStatusError as exc:
            where = f"node {node}: " if node else ""
            if exc.status == 404 and node is not None:
                raise DriverError(
                    f"kubernetes: node {node}: no such node ({exc.request})"
                ) from None
            raise DriverError(f"kubernetes: {where}{exc}") from None

    async def _slurm_node(self, node: str) -> str | None:
        """The Slurm node a slurmd pod on ``node`` runs, when this cluster has Slurm."""
        if self._slurm is None:
            return None
        current, _raw = await self._read_node(node)
        if current.slurm_node is not None:
            return current.slurm_node
        return _slurm_node_of(await self._pods(f"spec.nodeName={node},{_LIVE_PODS}", node=node))

    async def _read_node(self, node: str) -> tuple[KubeNode, dict[str, Any]]:
        raw = await self._guard(node, self._client.get_node(node))
        return _node(raw), raw

    async def _pods(self, selector: str, *, node: str | None) -> list[KubePod]:
        answer = await self._guard(node, self._client.list_pods(field_selector=selector))
        try:
            return [parse_pod(obj) for obj in answer.get("items") or []]
        except ValueError as exc:
            raise DriverError(f"kubernetes: could not read a pod: {exc}") from None

    async def _modify(
        self,
        node: str,
        change: Callable[[KubeNode, dict[str, Any]], dict[str, Any] | None],
        *,
        status: bool,
    ) -> KubeNode:
        """Read the node, compute the change from what was read, send it with that
        ``resourceVersion``; on 409 Conflict read again. Answers the node as left."""
        for _ in range(_CONFLICT_ATTEMPTS):
            current, raw = await self._read_node(node)
            patch = change(current, raw)
            if patch is None:
                return current
            patch.setdefault("metadata", {})["resourceVersion"] = current.resource_version
            try:
                answer = await self._client.patch_node(node, patch, status=status)
            except KubeStatusError as exc:
                if exc.status == 409:
                    continue
                raise DriverError(f"kubernetes: node {node}: {exc}") from None
            return _node(answer)
        raise DriverError(
            f"kubernetes: node {node}: still changing after {_CONFLICT_ATTEMPTS} attempts "
            "(409 Conflict each time); will try again"
        )

    async def _mark_health(self, node: str, reason: str) -> None:
        hold = parse_hold_reason(reason)
        if hold is None or hold.kind not in (HoldKind.REPAIR, HoldKind.HEALTHCHECK):
            return
        subject = hold.subject if hold.kind is HoldKind.REPAIR else " ".join(hold.signatures)

        def unhealthy(current: KubeNode, raw: dict[str, Any]) -> dict[str, Any] | None:
            ours = current.condition(HEALTH_CONDITION)
            if ours is not None and ours.status == "False" and ours.message == reason:
                return None
            return _conditions_patch(
                raw,
                status="False",
                reason=condition_reason(subject or "GpuUnhealthy"),
                message=reason,
            )

        await self._modify(node, unhealthy, status=True)


def _cordon(reason: str, *, adopt: bool) -> Callable[[KubeNode, dict[str, Any]], Any]:
    """The change that cordons a node with gpufleet's marks. ``adopt``: the node already
    carries gpufleet's annotation (a Slurm-on-Kubernetes hold whose Slurm side is done)."""

    def change(current: KubeNode, raw: dict[str, Any]) -> dict[str, Any] | None:
        if current.unschedulable or (current.hold_reason is not None and not adopt):
            return None
        taints = [t for t in _raw_taints(raw) if t.get("key") != HOLD_TAINT_KEY]
        held = current.hold_reason or reason
        return {
            "metadata": {"annotations": {HOLD_ANNOTATION: held}},
            "spec": {"unschedulable": True, "taints": [*taints, _our_taint(held)]},
        }

    return change


def _slurm_node_of(pods: list[KubePod]) -> str | None:
    return next((p.slurm_node for p in pods if p.slurm_node and not p.ended), None)


def _node(obj: dict[str, Any]) -> KubeNode:
    try:
        return parse_node(obj)
    except ValueError as exc:
        raise DriverError(f"kubernetes: could not read a node: {exc}") from None


def _raw_taints(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's taints as read, every field kept (``timeAdded``...)."""
    taints = (raw.get("spec") or {}).get("taints") or []
    return [dict(t) for t in taints if isinstance(t, dict)]


def _our_taint(reason: str) -> dict[str, Any]:
    hold = parse_hold_reason(reason)
    value = hold.kind.value if hold is not None else "hold"
    return {"key": HOLD_TAINT_KEY, "value": value, "effect": "NoSchedule"}


def _conditions_patch(
    raw: dict[str, Any], *, status: str, reason: str, message: str
) -> dict[str, Any]:
    """The whole conditions list with gpufleet's set: a merge patch replaces lists, so
    the others go back exactly as they were read, under the resourceVersion read."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    read = (raw.get("status") or {}).get("conditions") or []
    previous = next(
        (c for c in read if isinstance(c, dict) and c.get("type") == HEALTH_CONDITION), None
    )
    conditions = [
        dict(c) for c in read if isinstance(c, dict) and c.get("type") != HEALTH_CONDITION
    ]
    changed = previous is None or previous.get("status") != status
    conditions.append(
        {
            "type": HEALTH_CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": (
                now if changed or previous is None else previous.get("lastTransitionTime", now)
            ),
            "lastHeartbeatTime": now,
        }
    )
    return {"status": {"conditions": conditions}}
