"""A stand-in Kubernetes API server for the tests: kmock's ``KubernetesEmulator`` (real
HTTP, the real wire protocol, objects kept in memory) with the behaviour the driver
depends on and kmock leaves out. No kube-apiserver runs on these machines (none in
Debian, PyPI or npm, no container engine), so this is what the Kubernetes tests talk to
through the real ``kubernetes_asyncio`` client.

What is emulated here, on top of kmock (``../shared/reference/wave2-anchors.md`` §B):

- **resourceVersion and uid**: every create and change stamps a new ``resourceVersion``
  (one counter, as etcd's revision); a PATCH whose body carries
  ``metadata.resourceVersion`` that is not the current one is refused with **409
  Conflict**, as the apiserver's optimistic concurrency does.
- **field and label selectors** on LIST: ``spec.nodeName``, ``status.phase``,
  ``metadata.name``, ``metadata.namespace`` with ``=``, ``==`` and ``!=``; labels with
  ``=``, ``!=``, ``key`` and ``!key``.
- **strategic merge of node conditions**: a strategic-merge PATCH of ``status`` merges
  ``conditions`` by ``type`` (merge patches and JSON patches replace the list, as they do
  on a real server).
- **the Eviction API** (``POST .../pods/NAME/eviction``): a pod covered by a
  PodDisruptionBudget whose ``status.disruptionsAllowed`` is 0 is refused with **429**
  and the apiserver's message; otherwise the budget is spent, and the pod gets a
  ``deletionTimestamp`` and disappears after its grace period (``grace_scale`` real
  seconds per second of ``terminationGracePeriodSeconds``), as a kubelet would end it.
- **DELETE of a pod** is graceful the same way (the kubelet's part).

Not emulated, and named so that no test leans on them: the PDB controller (a test sets
``status.disruptionsAllowed`` to say the budget allows one more), the scheduler and the
workload controllers (no pod is recreated), admission and schema validation.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock

NODES = kmock.resource("v1/nodes")
PODS = kmock.resource("v1/pods")
PDBS = kmock.resource("policy/v1/poddisruptionbudgets")

_STRATEGIC = "application/strategic-merge-patch+json"
_FIELDS = {
    "spec.nodeName": ("spec", "nodeName"),
    "status.phase": ("status", "phase"),
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
}


@attrs.define(kw_only=True)
class KubeApiEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersions, selectors, condition merging, evictions
    and graceful pod deletion (this module's doc)."""

    grace_scale: float = 0.02
    _revision: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _reapers: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)
    # Called with each request as it arrives, before it is served (a test looks at the
    # world at that moment, e.g. Slurm's state when the first eviction comes in).
    watchers: list[Callable[[kmock.Request], None]] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # The client asks for /version/; the apiserver answers it with or without "/".
        self.fallback["get /version/"] << self._serve_server_version
        # Served even while none is stored (a real server lists an empty collection).
        for resource in ("v1/nodes", "v1/pods", "policy/v1/poddisruptionbudgets"):
            resources: Any = self.resources
            resources[resource] = {}

    # -------------------------------------------------------------- test helpers

    def seed(self, resource: kmock.resource, obj: dict[str, Any]) -> None:
        """Store an object as if created (stamped with a uid and a resourceVersion)."""
        meta = obj.setdefault("metadata", {})
        self._stamp(meta, created=True)
        self.objects[resource, meta.get("namespace"), meta["name"]] = obj

    def stored(self, resource: kmock.resource, name: str, namespace: str | None = None) -> Any:
        """The stored object now (a plain dict), or None when it is gone."""
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw

    def change(
        self,
        resource: kmock.resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
    ) -> None:
        """Change a stored object as another controller would (merge-patch semantics), with
        a new resourceVersion: e.g. the kubelet reporting Ready, the PDB controller."""
        key: Any = (resource, namespace, name)
        obj = self.objects[key]
        merged = dict(patch)
        merged["metadata"] = {**dict(patch.get("metadata") or {})}
        self._stamp(merged["metadata"], created=False)
        obj.patch(merged)

    def requests_to(self, method: str, *, subresource: str | None = None) -> list[kmock.Request]:
        """Requests received with ``method`` (and ``subresource``), oldest first."""
        wanted = kmock.method(method.upper())
        return [r for r in self if r.method == wanted and r.subresource == subresource]

    # -------------------------------------------------------------------- serving

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        for watch in self.watchers:
            watch(request)
        if request.resource == PODS and request.subresource == "eviction":
            return await self._evict(request)
        if request.resource is not None and isinstance(request.data, dict):
            if request.action == kmock.action.CREATE:
                data = {**request.data, "metadata": dict(request.data.get("metadata") or {})}
                self._stamp(data["metadata"], created=True)
                _set_body(request, data)
            elif request.action == kmock.action.UPDATE and request.name is not None:
                _set_body(request, self._precondition(request))
        elif request.action == kmock.action.UPDATE and request.name is not None:
            self._current(request)  # a JSON patch: the object must exist
        if request.resource == PODS and request.action == kmock.action.DELETE and request.name:
            obj = self._current(request)
            return await self._terminate(request, obj, grace=_grace(obj, request))
        return await super()._handle(request)

    async def _serve_list(self, request: kmock.Request) -> Any:
        listing: Any = await super()._serve_list(request)
        fields = _selector(request.params.get("fieldSelector", ""))
        labels = _selector(request.params.get("labelSelector", ""))
        items = [
            item
            for item in listing["items"]
            if _matches_fields(item, fields) and _matches_labels(item, labels)
        ]
        return {
            **listing,
            "metadata": {"resourceVersion": str(next(self._revision))},
            "items": items,
        }

    # ------------------------------------------------------------------ internals

    def _stamp(self, meta: dict[str, Any], *, created: bool) -> None:
        meta["resourceVersion"] = str(next(self._revision))
        if created:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )

    def _current(self, request: kmock.Request) -> dict[str, Any]:
        """The object the request names; 404 (as the apiserver answers) when it is gone."""
        key: Any = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError(
                message=f"{request.resource.plural if request.resource else 'object'} "
                f'"{request.name}" not found'
            )
        raw: dict[str, Any] = self.objects[key].raw
        return raw

    def _precondition(self, request: kmock.Request) -> dict[str, Any]:
        """The PATCH body to apply: refused (409) on a stale resourceVersion; conditions
        merged by type for a strategic merge of status; stamped with a new version."""
        current = self._current(request)
        data: dict[str, Any] = dict(request.data)
        meta = dict(data.get("metadata") or {})
        wanted = meta.get("resourceVersion")
        have = (current.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != have:
            plural = request.resource.plural if request.resource else "objects"
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"Operation cannot be fulfilled on {plural} "
                f'"{request.name}": the object has been modified; please apply your changes '
                "to the latest version and try again",
            )
        content_type = request.headers.get("Content-Type", "")
        status = data.get("status")
        if content_type.startswith(_STRATEGIC) and isinstance(status, dict):
            patch_conditions = status.get("conditions")
            if isinstance(patch_conditions, list):
                merged = {
                    c.get("type"): c for c in (current.get("status") or {}).get("conditions") or []
                }
                for condition in patch_conditions:
                    merged[condition.get("type")] = {
                        **merged.get(condition.get("type"), {}),
                        **condition,
                    }
                data["status"] = {**status, "conditions": list(merged.values())}
        self._stamp(meta, created=False)
        data["metadata"] = meta
        return data

    async def _evict(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.method != kmock.method.POST:
            raise kmock.KubernetesError(status=405, reason="MethodNotAllowed", message="POST only")
        pod = self._current(request)
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return _status(201, "Success")  # already going: the apiserver answers the same
        for (resource, namespace, name), obj in list(self.objects.items()):
            if resource != PDBS or namespace != request.namespace or obj.deleted:
                continue
            budget = obj.raw
            selector = ((budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            labels = meta.get("labels") or {}
            if not all(labels.get(k) == v for k, v in selector.items()):
                continue
            state = budget.get("status") or {}
            allowed = int(state.get("disruptionsAllowed", 0))
            if allowed <= 0:
                raise kmock.KubernetesError(
                    status=429,
                    reason="TooManyRequests",
                    message="Cannot evict pod as it would violate the pod's disruption budget.",
                    details={
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {name} needs "
                                f"{state.get('desiredHealthy', 1)} healthy pods and has "
                                f"{state.get('currentHealthy', 1)} currently",
                            }
                        ]
                    },
                )
            self.change(PDBS, name, {"status": {"disruptionsAllowed": allowed - 1}}, namespace)
        body = request.data if isinstance(request.data, dict) else {}
        options = body.get("deleteOptions")
        grace = _grace(pod, request, options=options)
        await self._terminate(request, pod, grace=grace)
        return _status(201, "Success")

    async def _terminate(
        self, request: kmock.Request, pod: dict[str, Any], *, grace: float
    ) -> aiohttp.web.StreamResponse:
        """Mark the pod terminating, and end it after its grace period (the kubelet)."""
        key: Any = (PODS, request.namespace, request.name)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            self.change(
                PODS,
                str(request.name),
                {"metadata": {"deletionTimestamp": now, "deletionGracePeriodSeconds": int(grace)}},
                request.namespace,
            )
            task = asyncio.get_running_loop().create_task(self._reap(key, grace * self.grace_scale))
            self._reapers.add(task)
            task.add_done_callback(self._reapers.discard)
        return aiohttp.web.json_response(self.objects[key].raw)

    async def _reap(self, key: Any, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if key in self.objects and not self.objects[key].deleted:
            self.objects[key].delete()


@dataclass
class RunningKubeApi:
    emulator: KubeApiEmulator
    url: str

    def kubeconfig(self, *, token: str = "emulator-token", context: str = "lab") -> str:  # noqa: S107
        """A kubeconfig for this server (a bearer token: the emulator checks none)."""
        return (
            "apiVersion: v1\nkind: Config\n"
            f"current-context: {context}\n"
            f"clusters:\n- name: {context}\n  cluster:\n    server: {self.url}\n"
            f"users:\n- name: {context}-admin\n  user:\n    token: {token}\n"
            f"contexts:\n- name: {context}\n  context:\n    cluster: {context}\n"
            f"    user: {context}-admin\n"
        )


@asynccontextmanager
async def kube_api(*, grace_scale: float = 0.02) -> AsyncIterator[RunningKubeApi]:
    """The emulator served on a free loopback port, in this event loop."""
    emulator = KubeApiEmulator(grace_scale=grace_scale)
    async with emulator, kmock.Server(emulator) as server:
        yield RunningKubeApi(emulator=emulator, url=str(server.url).rstrip("/"))


def _set_body(request: kmock.Request, data: dict[str, Any]) -> None:
    """Replace what kmock's own handling applies (the request object is frozen; kmock
    matches reactions on this very object, so it cannot be swapped for a copy)."""
    object.__setattr__(request, "data", data)


def _status(code: int, status: str) -> aiohttp.web.StreamResponse:
    return aiohttp.web.json_response(
        {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": status, "code": code},
        status=code,
    )


def _grace(
    pod: Mapping[str, Any], request: kmock.Request, *, options: Mapping[str, Any] | None = None
) -> float:
    given = (options or {}).get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
    if given is not None:
        return float(given)
    return float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))


def _selector(text: str) -> list[tuple[str, str, str | None]]:
    """``a=b,c!=d,e,!f`` as (key, op, value) triples."""
    out: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            out.append((key.strip(), "!=", value.strip()))
        elif "==" in part or "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            out.append((key.strip(), "=", value.strip()))
        elif part.startswith("!"):
            out.append((part[1:], "!", None))
        else:
            out.append((part, "exists", None))
    return out


def _matches_fields(item: Mapping[str, Any], selector: list[tuple[str, str, str | None]]) -> bool:
    for key, op, value in selector:
        if key not in _FIELDS:
            raise kmock.KubernetesError(
                status=400,
                reason="BadRequest",
                message=f"field label not supported: {key}",
            )
        outer, inner = _FIELDS[key]
        have = str((item.get(outer) or {}).get(inner) or "")
        if (op == "=" and have != value) or (op == "!=" and have == value):
            return False
    return True


def _matches_labels(item: Mapping[str, Any], selector: list[tuple[str, str, str | None]]) -> bool:
    labels = (item.get("metadata") or {}).get("labels") or {}
    for key, op, value in selector:
        if (
            (op == "=" and labels.get(key) != value)
            or (op == "!=" and labels.get(key) == value)
            or (op == "exists" and key not in labels)
            or (op == "!" and key in labels)
        ):
            return False
    return True


def pod_object(
    name: str,
    node: str | None,
    *,
    namespace: str = "ml",
    gpus: int = 0,
    owner: tuple[str, str] | None = ("Job", "train"),
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    grace_s: int = 30,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod as the API server would hold it (``node``: its ``spec.nodeName``, None while
    unscheduled), one container with ``gpus`` as its ``nvidia.com/gpu`` limit, owned by
    ``owner`` (kind, name) as its controller. ``spec`` adds fields to the spec."""
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        kind, owner_name = owner
        meta["ownerReferences"] = [
            {"kind": kind, "name": owner_name, "controller": True, "apiVersion": "v1", "uid": "u"}
        ]
    body: dict[str, Any] = {
        "containers": [{"name": "main", "resources": resources}],
        "terminationGracePeriodSeconds": grace_s,
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {"metadata": meta, "spec": body, "status": {"phase": phase}}
