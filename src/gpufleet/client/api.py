"""The typed HTTP client of the gpufleet REST API (``/api/v1``).

Used by the CLI and usable as an SDK. Every method returns ``gpufleet.core.models``
objects, raises ``ApiError`` with the server's message on a 4xx/5xx, and
``ServerUnreachable`` (naming the URL) when no response came back at all.
"""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from gpufleet.client.access import AccessCalls
from gpufleet.client.autoscale import AutoscaleCalls
from gpufleet.client.calls import API, segment
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.client.http import ServerUrls, is_idempotent, raise_for_error, send_with_failover
from gpufleet.client.inventory import InventoryCalls
from gpufleet.client.providers import ProviderCalls
from gpufleet.client.rollouts import RolloutCalls
from gpufleet.core.enums import (
    CheckStatus,
    ClusterStatus,
    Health,
    NodeState,
    ProviderKind,
    RepairStatus,
    Role,
    SchedulerKind,
)
from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL
from gpufleet.core.ids import is_id
from gpufleet.core.models import (
    AuthConfig,
    Breaker,
    Cluster,
    ClusterStatusReport,
    CreatedToken,
    Event,
    Finding,
    GpuHours,
    HealthSummary,
    IssuedEnrollToken,
    IssuedNodeToken,
    Me,
    Node,
    NodeAction,
    NodeActionResult,
    Page,
    Project,
    Repair,
    UsageGroup,
)
from gpufleet.core.stacks import Stack

# These models load on first use, inside the calls that return them: importing them
# with the client was a good part of every command's start (issue 19).
if TYPE_CHECKING:
    from gpufleet.core.acceptance import AcceptanceRun, AcceptanceSuite, AcceptanceTrigger
    from gpufleet.core.check_runs import CheckRun
    from gpufleet.core.faults import Fault
    from gpufleet.core.reliability import ReliabilityReport


# The server caps a page at 1000 items; iterators ask for full pages to save round trips.
MAX_PAGE_SIZE = 1000

M = TypeVar("M", bound=BaseModel)
# The repair policy and its dry run are the engine's own dataclasses; pydantic reads them.

if TYPE_CHECKING:
    from gpufleet.core.repair.models import PolicyConfig
    from gpufleet.core.repair.replay import ReplayReport


# The repair models load on first use, not with the client: they are a tenth of every
# command's start (issue 19: ``gpufleet nodes list`` in 400 ms) and only the repair
# policy's calls need them.
@cache
def policy_adapter() -> TypeAdapter[PolicyConfig]:
    from gpufleet.core.repair.models import PolicyConfig

    return TypeAdapter(PolicyConfig)


@cache
def replay_adapter() -> TypeAdapter[ReplayReport]:
    from gpufleet.core.repair.replay import ReplayReport

    return TypeAdapter(ReplayReport)


QueryValue = str | int | list[str]


def _tls_context(*base_urls: str) -> ssl.SSLContext | bool:
    """httpx's default (certifi's bundle) for an https server; for plain-HTTP ones, a
    context that trusts nothing, made in microseconds where loading the bundle takes
    20-40 ms of every command's start. The client follows no redirects, so it never
    leaves the plain-HTTP server; were it to reach an https URL, it would refuse it."""
    if all(url.startswith("http://") for url in base_urls):
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return True


def _query_value(value: object) -> str | int:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, int):
        return value
    return str(value)


def _query(params: Mapping[str, object]) -> dict[str, QueryValue]:
    """Drop unset filters and write values the way the server parses query strings.

    A list or tuple is a repeated parameter (``?status=a&status=b``); an empty one is
    left out like None.
    """
    out: dict[str, QueryValue] = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, list | tuple):
            if value:
                out[key] = [str(_query_value(v)) for v in value]
        else:
            out[key] = _query_value(value)
    return out


class ApiClient(AccessCalls, AutoscaleCalls, InventoryCalls, ProviderCalls, RolloutCalls):
    """Synchronous client for one gpufleet server.

    ``token`` is an API token (``Authorization: Bearer``); ``None`` only reaches the
    unauthenticated endpoints (``health``, ``ready``). Pass ``transport`` in tests
    (e.g. ``httpx.MockTransport``) or to route through an ASGI app.

    ``base_url`` may name several replicas, comma-separated: a request that finds one
    down (no connection, or a 502/503/504) goes to the next (``client/http.py``).
    """

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._urls = ServerUrls(base_url)
        headers = {"Accept": "application/json", "User-Agent": "gpufleet-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            verify=_tls_context(*self._urls.all),
        )

    @property
    def base_url(self) -> str:
        """The server's URL: of several replicas, the one that answered last."""
        return self._urls.current

    # -- plumbing -------------------------------------------------------------------
    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, object] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        return send_with_failover(
            self._http,
            self._urls,
            method,
            path,
            idempotent=is_idempotent(method),
            params=_query(params or {}),
            json=body,
            timeout=timeout,
        )

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, object] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """``timeout_s``: this call's own bound (None: the client's)."""
        response = self._send(method, path, params=params, body=body, timeout_s=timeout_s)
        raise_for_error(response)
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                response.status_code,
                "bad_response",
                f"{method} {path} returned a body that is not JSON: {response.text[:200]!r}",
            ) from exc

    def _get(self, model: type[M], path: str, params: Mapping[str, object]) -> M:
        return model.model_validate(self._call("GET", path, params=params))

    # -- service --------------------------------------------------------------------
    def health(self) -> str:
        """``GET /healthz``: the process is up. Returns the status string (``ok``)."""
        return str(self._call("GET", "/healthz").get("status", ""))

    def ready(self) -> bool:
        """``GET /readyz``: True when the server can serve (database reachable)."""
        response = self._send("GET", "/readyz")
        if response.status_code == httpx.codes.SERVICE_UNAVAILABLE:
            return False
        raise_for_error(response)
        return True

    def me(self) -> Me:
        return Me.model_validate(self._call("GET", f"{API}/me"))

    # -- projects and tokens --------------------------------------------------------
    def list_projects(
        self, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Project]:
        return self._get(Page[Project], f"{API}/projects", {"cursor": cursor, "limit": limit})

    def create_project(
        self, name: str, *, description: str = "", first_admin: str | None = None
    ) -> Project:
        """The owner only; ``first_admin`` (user id or name) defaults to the caller."""
        body: dict[str, object] = {"name": name, "description": description}
        if first_admin is not None:
            body["first_admin"] = first_admin
        return Project.model_validate(self._call("POST", f"{API}/projects", body=body))

    def get_project(self, ref: str) -> Project:
        """Get a project by id or by name."""
        return Project.model_validate(self._call("GET", f"{API}/projects/{ref}"))

    def create_token(
        self,
        *,
        name: str,
        project: str | None = None,
        role: Role | None = None,
        expires_in_days: int | None = None,
        user: str | None = None,
    ) -> CreatedToken:
        """Create a personal API token; the secret is in the result and never again.
        ``user`` (the owner only): a token for that member of ``project``."""
        body = {
            "name": name,
            "project": project,
            "role": role.value if role else None,
            "expires_in_days": expires_in_days,
        }
        if user is not None:
            body["user"] = user
        return CreatedToken.model_validate(self._call("POST", f"{API}/tokens", body=body))

    def auth_config(self) -> AuthConfig:
        """How to log in (works without a token): OIDC issuer and the CLI's client id."""
        return AuthConfig.model_validate(self._call("GET", f"{API}/auth/config"))

    def create_device_token(
        self,
        *,
        id_token: str,
        name: str,
        project: str | None = None,
        role: Role | None = None,
    ) -> CreatedToken:
        """Trade an ID token from the device grant for a personal API token (no token needed)."""
        body = {
            "id_token": id_token,
            "name": name,
            "project": project,
            "role": role.value if role else None,
        }
        return CreatedToken.model_validate(
            self._call("POST", f"{API}/auth/device-token", body=body)
        )

    # -- clusters -------------------------------------------------------------------
    def list_clusters(
        self,
        *,
        project: str | None = None,
        name: str | None = None,
        status: ClusterStatus | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Cluster]:
        params = {
            "project": project,
            "name": name,
            "status": status,
            "cursor": cursor,
            "limit": limit,
        }
        return self._get(Page[Cluster], f"{API}/clusters", params)

    def create_cluster(
        self,
        *,
        project: str,
        name: str,
        size: int,
        scheduler: SchedulerKind = SchedulerKind.SIM,
        provider: ProviderKind = ProviderKind.SIM,
        gpu_model: str = DEFAULT_GPU_MODEL,
        gpus_per_node: int = 8,
        acceptance_tests: bool = True,
        startup_scripts: list[str] | None = None,
        autoscale_min: int | None = None,
        autoscale_max: int | None = None,
        labels: Mapping[str, str] | None = None,
        node_prefix: str | None = None,
        first_node_index: int = 0,
        acceptance_suite: AcceptanceSuite | None = None,
        provider_config: Mapping[str, object] | None = None,
        kubeconfig: str | None = None,
        kube_context: str | None = None,
        kube_in_cluster: bool = False,
        kube_slurm: bool = False,
        stack: str | None = None,
    ) -> Cluster:
        """Create a cluster. A kubernetes one takes its API server's credentials:
        ``kubeconfig`` (the file's text; stored sealed, never shown again) with an
        optional ``kube_context``, or ``kube_in_cluster`` (the server's own pod's
        service account); the server checks that the API server answers first.
        ``kube_slurm``: Slurm runs on its nodes under Slinky (holds drain in Slurm
        first)."""
        body: dict[str, Any] = {
            "project": project,
            "name": name,
            "scheduler": scheduler.value,
            "provider": provider.value,
            "gpu_model": gpu_model,
            "gpus_per_node": gpus_per_node,
            "size": size,
            "acceptance_tests": acceptance_tests,
            "startup_scripts": list(startup_scripts or []),
            "autoscale_min": autoscale_min,
            "autoscale_max": autoscale_max,
            "labels": dict(labels or {}),
            "node_prefix": node_prefix,
            "first_node_index": first_node_index,
        }
        if acceptance_suite is not None:  # left out: the server's default suite
            body["acceptance_suite"] = acceptance_suite.model_dump(mode="json")
        if provider_config is not None:  # aws: region, credential, placement
            body["provider_config"] = dict(provider_config)
        if kubeconfig is not None:
            body["kubeconfig"] = kubeconfig
        if kube_context is not None:
            body["kube_context"] = kube_context
        if kube_in_cluster:
            body["kube_in_cluster"] = True
        if kube_slurm:
            body["kube_slurm"] = True
        if stack is not None:  # left out: the latest stack
            body["stack"] = stack
        return Cluster.model_validate(self._call("POST", f"{API}/clusters", body=body))

    def get_cluster(self, cluster_id: str) -> Cluster:
        """Get one cluster by id, with its node counts."""
        return Cluster.model_validate(self._call("GET", f"{API}/clusters/{cluster_id}"))

    def get_cluster_status(self, cluster_id: str) -> ClusterStatusReport:
        data = self._call("GET", f"{API}/clusters/{cluster_id}/status")
        return ClusterStatusReport.model_validate(data)

    def update_cluster(self, cluster_id: str, *, reason: str = "", **fields: Any) -> Cluster:
        """Change a cluster's ``acceptance_tests``, ``acceptance_suite`` (an
        ``AcceptanceSuite``, or None for the default), ``startup_scripts``,
        ``autoscale_min`` / ``autoscale_max`` (admins). Only the fields given change."""
        from gpufleet.core.acceptance import AcceptanceSuite

        allowed = {
            "acceptance_tests",
            "acceptance_suite",
            "startup_scripts",
            "autoscale_min",
            "autoscale_max",
        }
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise TypeError(f"update_cluster() got unknown fields {unknown}")
        body: dict[str, Any] = {**fields, "reason": reason}
        suite = body.get("acceptance_suite")
        if isinstance(suite, AcceptanceSuite):
            body["acceptance_suite"] = suite.model_dump(mode="json")
        path = f"{API}/clusters/{segment(cluster_id)}"
        return Cluster.model_validate(self._call("PATCH", path, body=body))

    def delete_cluster(self, cluster_id: str) -> Cluster:
        """Ask for a cluster's deletion; returns it in status ``deleting``."""
        return Cluster.model_validate(self._call("DELETE", f"{API}/clusters/{cluster_id}"))

    def find_cluster(self, ref: str, *, project: str | None = None) -> Cluster:
        """Find a cluster by id, or by a name that is unique among the caller's projects.

        Raises ``ApiError`` (404 ``not_found``) when no cluster has that name, and
        (409 ``ambiguous``) when several do; ``project`` narrows the search.
        """
        if is_id(ref):
            return self.get_cluster(ref)
        matches = self.list_clusters(project=project, name=ref, limit=MAX_PAGE_SIZE).items
        where = f" in project {project!r}" if project else ""
        if not matches:
            raise ApiError(404, "not_found", f"no cluster named {ref!r}{where}")
        if len(matches) > 1:
            raise ApiError(
                409,
                "ambiguous",
                f"{len(matches)} clusters are named {ref!r}{where}; "
                "pass the cluster id, or the project to search in",
            )
        return matches[0]

    # -- nodes ----------------------------------------------------------------------
    def list_nodes(
        self,
        *,
        cluster: str | None = None,
        state: NodeState | None = None,
        health: Health | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Node]:
        params = {
            "cluster": cluster,
            "state": state,
            "health": health,
            "cursor": cursor,
            "limit": limit,
        }
        return self._get(Page[Node], f"{API}/nodes", params)

    def iter_nodes(
        self,
        *,
        cluster: str | None = None,
        state: NodeState | None = None,
        health: Health | None = None,
        page_size: int = MAX_PAGE_SIZE,
    ) -> Iterator[Node]:
        """Yield every matching node, following ``next_cursor`` page by page."""
        cursor: str | None = None
        while True:
            page = self.list_nodes(
                cluster=cluster, state=state, health=health, cursor=cursor, limit=page_size
            )
            yield from page.items
            if page.next_cursor is None or not page.items:
                return
            cursor = page.next_cursor

    def get_node(self, node_id: str) -> Node:
        """Get one node by id, with its GPUs and their latest sample."""
        return Node.model_validate(self._call("GET", f"{API}/nodes/{node_id}"))

    # -- faults (simulated nodes) ---------------------------------------------------
    def inject_fault(
        self, node_id: str, *, signature: str, gpu_index: int | None = None, sticky: bool = False
    ) -> Fault:
        """Make a sim node fail with a catalog signature; its agent reports it at once.
        ``sticky``: broken hardware that comes back after every reboot and reinstall."""
        from gpufleet.core.faults import Fault

        body: dict[str, object] = {"signature": signature, "gpu_index": gpu_index}
        if sticky:
            body["sticky"] = True
        return Fault.model_validate(self._call("POST", f"{API}/nodes/{node_id}/faults", body=body))

    def clear_fault(
        self, node_id: str, signature: str, *, gpu_index: int | None = None
    ) -> list[Fault]:
        """Clear a sim node's open faults of ``signature``; returns those cleared."""
        from gpufleet.core.faults import Fault

        data = self._call(
            "DELETE",
            f"{API}/nodes/{node_id}/faults/{quote(signature, safe='')}",
            params={"gpu_index": gpu_index},
        )
        return [Fault.model_validate(item) for item in data]

    def list_faults(self, node_id: str) -> list[Fault]:
        from gpufleet.core.faults import Fault

        data = self._call("GET", f"{API}/nodes/{node_id}/faults")
        return [Fault.model_validate(item) for item in data]

    # -- events, findings, health ---------------------------------------------------
    def list_events(
        self,
        *,
        project: str | None = None,
        cluster: str | None = None,
        node: str | None = None,
        kind: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Event]:
        """Events, newest first."""
        params = {
            "project": project,
            "cluster": cluster,
            "node": node,
            "kind": kind,
            "since": since,
            "until": until,
            "cursor": cursor,
            "limit": limit,
        }
        return self._get(Page[Event], f"{API}/events", params)

    def list_findings(
        self,
        *,
        cluster: str | None = None,
        node: str | None = None,
        gpu: str | None = None,
        signature: str | None = None,
        open: bool | None = None,  # the API's own parameter name
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Finding]:
        params = {
            "cluster": cluster,
            "node": node,
            "gpu": gpu,
            "signature": signature,
            "open": open,
            "cursor": cursor,
            "limit": limit,
        }
        return self._get(Page[Finding], f"{API}/findings", params)

    def health_summary(self, *, cluster: str | None = None) -> HealthSummary:
        data = self._call("GET", f"{API}/health/summary", params={"cluster": cluster})
        return HealthSummary.model_validate(data)

    # -- repairs --------------------------------------------------------------------
    def list_repairs(
        self,
        *,
        cluster: str | None = None,
        node: str | None = None,
        status: Sequence[RepairStatus] | None = None,
        kind: str | None = None,
        open: bool | None = None,  # the API's own parameter name
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Repair]:
        """Repairs, filtered; ``status`` matches any of those given; ``open`` keeps the
        proposed and in-flight ones; ``kind`` is ``node`` or ``incident``."""
        params = {
            "cluster": cluster,
            "node": node,
            "status": [s.value for s in status or ()],
            "kind": kind,
            "open": open,
            "cursor": cursor,
            "limit": limit,
        }
        return self._get(Page[Repair], f"{API}/repairs", params)

    def get_repair(self, repair_id: str) -> Repair:
        """One repair, with the jobs on its node now (``jobs``) while it is open."""
        return Repair.model_validate(self._call("GET", f"{API}/repairs/{segment(repair_id)}"))

    def approve_repair(self, repair_id: str, *, reason: str = "", force: bool = False) -> Repair:
        """Approve a proposed repair. ``force`` lets its drain kill the jobs still running
        at the drain timeout. ``ApiError`` 409 when the breaker refuses or it is not
        proposed, 403 for a project member."""
        body = {"reason": reason, "force": force}
        path = f"{API}/repairs/{segment(repair_id)}/approve"
        return Repair.model_validate(self._call("POST", path, body=body))

    def dismiss_repair(self, repair_id: str, *, reason: str) -> Repair:
        """Reject a proposed repair; ``reason`` is required and kept with the decision."""
        path = f"{API}/repairs/{segment(repair_id)}/dismiss"
        return Repair.model_validate(self._call("POST", path, body={"reason": reason}))

    def force_repair(self, repair_id: str, *, reason: str) -> Repair:
        """Let a draining repair kill the jobs still on its node, now."""
        path = f"{API}/repairs/{segment(repair_id)}/force"
        return Repair.model_validate(self._call("POST", path, body={"reason": reason}))

    def node_action(
        self,
        node_id: str,
        *,
        action: NodeAction,
        reason: str,
        force: bool = False,
        gpu_index: int | None = None,
    ) -> NodeActionResult:
        """Cordon, uncordon or drain a node, or start a reboot, reprovision, replace,
        remove or GPU reset as an approved repair (named in the result)."""
        body = {"action": action.value, "reason": reason, "force": force, "gpu_index": gpu_index}
        data = self._call("POST", f"{API}/nodes/{segment(node_id)}/actions", body=body)
        return NodeActionResult.model_validate(data)

    def issue_node_token(self, node_id: str) -> IssuedNodeToken:
        """A new node token for the node's agent (shown once); the old one is refused."""
        data = self._call("POST", f"{API}/nodes/{segment(node_id)}/token", body={})
        return IssuedNodeToken.model_validate(data)

    def issue_enroll_token(self, cluster_id: str, *, ttl_s: int) -> IssuedEnrollToken:
        """A new enroll token for the cluster's bare-metal installs (shown once); the
        previous one is refused."""
        path = f"{API}/clusters/{segment(cluster_id)}/enroll-token"
        return IssuedEnrollToken.model_validate(self._call("POST", path, body={"ttl_s": ttl_s}))

    def get_breaker(self, cluster_id: str) -> Breaker:
        """A cluster's repair circuit breaker."""
        path = f"{API}/clusters/{segment(cluster_id)}/repair-breaker"
        return Breaker.model_validate(self._call("GET", path))

    def reset_breaker(self, cluster_id: str, *, reason: str) -> Breaker:
        """Close a tripped breaker so approvals go through again."""
        path = f"{API}/clusters/{segment(cluster_id)}/repair-breaker/reset"
        return Breaker.model_validate(self._call("POST", path, body={"reason": reason}))

    def gpu_hours(
        self,
        *,
        group_by: Sequence[UsageGroup] = (UsageGroup.PROJECT,),
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        project: str | None = None,
        cluster: str | None = None,
    ) -> GpuHours:
        """GPU-hours of finished jobs grouped by project, cluster, user, account, day."""
        params: dict[str, object] = {
            "group_by": [g.value for g in group_by],
            "since": since,
            "until": until,
            "project": project,
            "cluster": cluster,
        }
        return self._get(GpuHours, f"{API}/usage/gpu-hours", params)

    def reliability(
        self,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        project: str | None = None,
        cluster: str | None = None,
    ) -> ReliabilityReport:
        """GPU-hours lost by signature, GPU model, day, cluster and host; MTTR, MTBF."""
        from gpufleet.core.reliability import ReliabilityReport

        params: dict[str, object] = {
            "since": since,
            "until": until,
            "project": project,
            "cluster": cluster,
        }
        return self._get(ReliabilityReport, f"{API}/reliability", params)

    # -- software stacks ----------------------------------------------------------------
    def list_stacks(self) -> list[Stack]:
        """Every software stack, newest first; ``latest`` marks the one new clusters take."""
        return self._get(Page[Stack], f"{API}/stacks", {}).items

    def get_stack(self, name: str) -> Stack:
        return Stack.model_validate(self._call("GET", f"{API}/stacks/{segment(name)}"))

    def create_stack(
        self, name: str, *, spec: Mapping[str, str], notes: str = "", latest: bool = False
    ) -> Stack:
        """A new stack pinning ``spec`` (os_image, driver, cuda, nccl, dcgm, slurm, agent)."""
        body = {"name": name, **spec, "notes": notes, "latest": latest}
        return Stack.model_validate(self._call("POST", f"{API}/stacks", body=body))

    def make_latest_stack(self, name: str) -> Stack:
        """New clusters take ``name`` from now on."""
        return Stack.model_validate(self._call("POST", f"{API}/stacks/{segment(name)}/latest"))

    def get_repair_policy(self, project: str) -> PolicyConfig:
        """A project's repair policy (the server's default when it never set one)."""
        data = self._call("GET", f"{API}/projects/{segment(project)}/repair-policy")
        return policy_adapter().validate_python(data)

    def set_repair_policy(self, project: str, policy: Mapping[str, Any]) -> PolicyConfig:
        """Replace a project's repair policy (its fields as JSON, as ``policy_json``
        writes them); fields left out take their defaults. Returns the policy as stored."""
        path = f"{API}/projects/{segment(project)}/repair-policy"
        return policy_adapter().validate_python(self._call("PUT", path, body=policy))

    def replay_repair_policy(
        self,
        project: str,
        *,
        days: float = 7.0,
        cluster_id: str | None = None,
        policy: Mapping[str, Any] | None = None,
    ) -> ReplayReport:
        """Dry run: what ``policy`` (default: the project's) would have done over the
        findings of the last ``days``."""
        body = {
            "days": days,
            "cluster_id": cluster_id,
            "policy": None if policy is None else dict(policy),
        }
        path = f"{API}/projects/{segment(project)}/repair-policy/replay"
        return replay_adapter().validate_python(self._call("POST", path, body=body))

    # -- acceptance -----------------------------------------------------------------
    def list_acceptance_runs(
        self,
        cluster_id: str,
        *,
        trigger: AcceptanceTrigger | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[AcceptanceRun]:
        """A cluster's acceptance runs, newest first."""
        from gpufleet.core.acceptance import AcceptanceRun

        path = f"{API}/clusters/{segment(cluster_id)}/acceptance"
        params = {"trigger": trigger, "cursor": cursor, "limit": limit}
        return self._get(Page[AcceptanceRun], path, params)

    def run_acceptance(
        self,
        cluster_id: str,
        *,
        nodes: Sequence[str] | None = None,
        reason: str = "",
        force: bool = False,
    ) -> AcceptanceRun:
        """Run the cluster's acceptance suite now (admins); ``nodes`` (names or ids)
        limits it to those nodes and to the node-level checks."""
        from gpufleet.core.acceptance import AcceptanceRun

        body = {"nodes": None if nodes is None else list(nodes), "reason": reason, "force": force}
        path = f"{API}/clusters/{segment(cluster_id)}/acceptance"
        return AcceptanceRun.model_validate(self._call("POST", path, body=body))

    def get_acceptance_run(self, run_id: str) -> AcceptanceRun:
        from gpufleet.core.acceptance import AcceptanceRun

        return AcceptanceRun.model_validate(
            self._call("GET", f"{API}/acceptance/{segment(run_id)}")
        )

    def acceptance_report(self, run_id: str, *, fmt: str = "json") -> tuple[bytes, str]:
        """A finished run's report as ``json`` or ``html``: (the bytes, the SHA-256 of the
        JSON report, from the ``ETag``). 409 while the run is under way."""
        if fmt not in ("json", "html"):
            raise ValueError(f"report format is json or html, not {fmt!r}")
        response = self._send("GET", f"{API}/acceptance/{segment(run_id)}/report.{fmt}")
        raise_for_error(response)
        return response.content, response.headers.get("etag", "").strip('"')

    # -- active checks --------------------------------------------------------------
    def run_check(
        self,
        *,
        cluster: str,
        check: str,
        nodes: Sequence[str] | None = None,
        level: int | None = None,
        params: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> CheckRun:
        """Run ``check`` (dcgm-diag, nccl, ib-write-bw, gpu-burn) on a cluster's nodes
        (names or ids; None: every node in service). Returns the run, ``pending``.
        ``force`` (admins) runs it on nodes that run jobs too; 403 for a member."""
        from gpufleet.core.check_runs import CheckRun

        body: dict[str, Any] = {"cluster": cluster, "check": check, "force": force}
        if nodes is not None:
            body["nodes"] = list(nodes)
        if level is not None:
            body["level"] = level
        if params:
            body["params"] = dict(params)
        return CheckRun.model_validate(self._call("POST", f"{API}/checks", body=body))

    def list_checks(
        self,
        *,
        cluster: str | None = None,
        status: Sequence[CheckStatus] | None = None,
        kind: str | None = None,
        parent: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[CheckRun]:
        """Check runs, newest first, without their ``result`` (``get_check`` has it)."""
        from gpufleet.core.check_runs import CheckRun

        params = {
            "cluster": cluster,
            "status": [s.value for s in status or ()],
            "kind": kind,
            "parent": parent,
            "cursor": cursor,
            "limit": limit,
        }
        return self._get(Page[CheckRun], f"{API}/checks", params)

    def get_check(self, run_id: str) -> CheckRun:
        from gpufleet.core.check_runs import CheckRun

        return CheckRun.model_validate(self._call("GET", f"{API}/checks/{segment(run_id)}"))

    def check_output(self, run_id: str) -> str:
        """The run's raw output (every command's, under a header line each)."""
        response = self._send("GET", f"{API}/checks/{segment(run_id)}/output")
        raise_for_error(response)
        return response.text

    def cancel_check(self, run_id: str) -> CheckRun:
        from gpufleet.core.check_runs import CheckRun

        path = f"{API}/checks/{segment(run_id)}/cancel"
        return CheckRun.model_validate(self._call("POST", path))

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def policy_json(policy: PolicyConfig) -> dict[str, Any]:
    """A policy as the API writes it: the body ``set_repair_policy`` takes."""
    data: dict[str, Any] = policy_adapter().dump_python(policy, mode="json")
    return data


# The answer types are core's (one definition for the server, this client and the CLI);
# named here too for SDK users who import them from the client.
__all__ = [
    "ApiClient",
    "ApiError",
    "AuthConfig",
    "ClusterStatusReport",
    "GpuHours",
    "Me",
    "NodeAction",
    "NodeActionResult",
    "ServerUnreachable",
    "policy_json",
]
