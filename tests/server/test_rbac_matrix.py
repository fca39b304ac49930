"""Every API route × every kind of caller, against real objects of two projects.

The expectation of each (method, path template) comes from ``ROUTES`` below: the
permission the route needs (combined with ``core.rbac``'s matrix), or PUBLIC, SIGNED_IN,
AGENT. A route of the app that is missing from the table fails the test, so a new route
must say here who may call it. Outcome classes: 401 (no valid user credential), 404
(another project's object: existence does not leak), 403 (a role without the
permission), allowed (anything else; 409/422 count, but the bodies are valid so the
allowed path really runs). The console's HTML routes (outside ``/api/``) are left out:
they call the same services, and tests/web covers their roles.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import fastapi.routing
import pytest
from apihelpers import audit_rows_of, gpu_sample
from rbacworld import IDENTITIES, World, build_world, unique

from gpufleet.core.enums import Role
from gpufleet.core.ids import new_id
from gpufleet.core.rbac import OWNER_ONLY, ROLE_PERMISSIONS, Permission
from gpufleet.server.deps import (
    PATH_PARAMS,
    UNSCOPED_PATH_PARAMS,
    Guard,
    get_node_caller,
    node_token,
)
from gpufleet.testing.app import RunningApp

PUBLIC = "public"  # no credentials needed (the login itself)
SIGNED_IN = "signed-in"  # any user; what they get is their own
AGENT = "agent"  # node tokens only, for their own node

P = Permission
Body = Callable[[World, dict[str, str]], Any]  # (world, the request's path values)
Fresh = Callable[[World], Awaitable[dict[str, str]]]


@dataclass(frozen=True)
class Rule:
    need: str | Permission
    body: Body | None = None
    query: Callable[[World, dict[str, str]], dict[str, Any]] | None = None
    # Path objects made anew before each attempt: for routes that remove their object.
    fresh: Fresh | None = None
    own: bool = False  # the object is the member's own (their token): they may act on it
    # The object is a credential that outlives the ``expiring`` caller's token.
    outlives_expiring: bool = False


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _finding(w: World, v: dict[str, str]) -> dict[str, Any]:
    return {
        "findings": [
            {
                "seq": 10_000 + int(unique("")),
                "key": "thermal/GPU-0",
                "signature_id": "xid-79",
                "state": "open",
                "severity": "fatal",
                "source": "kernel-log",
                "title": "GPU has fallen off the bus",
                "gpu_index": 0,
                "evidence": "NVRM: Xid (PCI:0000:18:00): 79",
                "count": 1,
                "first_seen": _now(),
                "last_seen": _now(),
            }
        ]
    }


def _event(w: World, v: dict[str, str]) -> dict[str, Any]:
    return {
        "events": [
            {"id": new_id(), "kind": "node.daemon", "message": "slurmd restarted", "at": _now()}
        ]
    }


def _report(w: World, v: dict[str, str]) -> dict[str, Any]:
    seq = 100 + int(unique(""))
    return {"reports": [{"seq": seq, "sampled_at": _now(), "gpus": [gpu_sample(0)]}]}


def _command_result(w: World, v: dict[str, str]) -> dict[str, Any]:
    return {
        "id": w.a.command_id,
        "agent_boot_id": "boot-1",
        "exit_code": 0,
        "started_at": _now(),
        "finished_at": _now(),
    }


async def _fresh_cluster(w: World) -> dict[str, str]:
    return {"cluster_id": await w.new_cluster(w.a)}


async def _fresh_volume(w: World) -> dict[str, str]:
    return {"volume_ref": (await w.new_volume(w.a))["id"]}


async def _fresh_attachment(w: World) -> dict[str, str]:
    return {"volume_ref": (await w.new_volume(w.a, attach=True))["id"]}


async def _fresh_user(w: World) -> dict[str, str]:
    return {"new_user": await w.new_user()}


async def _fresh_member(w: World) -> dict[str, str]:
    return {"user_ref": await w.new_user(project="pa")}


async def _fresh_token(w: World) -> dict[str, str]:
    # A token of the member caller themselves: they may revoke their own.
    token = await w.token_for(w.users["member"], project="pa", role="member")
    return {"token_id": token["info"]["id"]}


async def _fresh_stack(w: World) -> dict[str, str]:
    name = unique("stack-")
    made = await w.app.client.post("/api/v1/stacks", json={"name": name, "driver": "580.95.05"})
    assert made.status_code == 201, made.text
    return {"stack_name": name}


async def _fresh_repair(w: World) -> dict[str, str]:
    return {"repair_id": await w.new_repair(w.a)}


async def _fresh_command(w: World) -> dict[str, str]:
    return {"command_id": await w.new_command(w.a)}


async def _fresh_node(w: World) -> dict[str, str]:
    # A node of its own: issuing a token refuses the old one, which other rows use.
    cluster_id = await w.new_cluster(w.a)
    response = await w.app.client.get("/api/v1/nodes", params={"cluster": cluster_id})
    return {"node_id": response.json()["items"][0]["id"]}


async def _fresh_metal_cluster(w: World) -> dict[str, str]:
    # A bare-metal cluster: only those take an enroll token (a sim one answers 422).
    body = {"project": "pa", "name": unique("m"), "size": 1, "provider": "ipmi"}
    created = await w.app.client.post("/api/v1/clusters", json=body)
    assert created.status_code == 201, created.text
    return {"cluster_id": str(created.json()["id"])}


async def _fresh_credential(w: World) -> dict[str, str]:
    return {"credential_ref": await w.new_credential(w.a)}


def _host_import(w: World, v: dict[str, str]) -> dict[str, Any]:
    return {"hosts": [{"hostname": unique("imp"), "bmc_type": "ipmi", "bmc_address": "10.1.1.1"}]}


def _project_filter(w: World, v: dict[str, str]) -> dict[str, Any]:
    return {"project": "pa"}


def _cluster_filter(w: World, v: dict[str, str]) -> dict[str, Any]:
    return {"cluster": w.a.cluster["id"]}


ROUTES: dict[tuple[str, str], Rule] = {
    # Login: reached before anyone has a credential (tests/auth covers them).
    ("GET", "/api/v1/auth/config"): Rule(PUBLIC),
    ("GET", "/api/v1/auth/login"): Rule(PUBLIC),
    ("GET", "/api/v1/auth/callback"): Rule(PUBLIC),
    ("POST", "/api/v1/auth/device-token"): Rule(PUBLIC, body=lambda _w, _v: {"id_token": "x.y.z"}),
    ("POST", "/api/v1/auth/logout"): Rule(SIGNED_IN),
    ("GET", "/api/v1/auth/me"): Rule(SIGNED_IN),
    ("GET", "/api/v1/me"): Rule(SIGNED_IN),
    # Projects, members, users, tokens.
    ("GET", "/api/v1/projects"): Rule(SIGNED_IN),
    ("POST", "/api/v1/projects"): Rule(P.PROJECT_CREATE, body=lambda _w, _v: {"name": unique("p")}),
    ("GET", "/api/v1/projects/{project_ref}"): Rule(P.PROJECT_READ),
    ("GET", "/api/v1/projects/{project_ref}/members"): Rule(P.MEMBER_READ),
    ("POST", "/api/v1/projects/{project_ref}/members"): Rule(
        P.MEMBER_MANAGE, body=lambda _w, v: {"user": v["new_user"]}, fresh=_fresh_user
    ),
    ("PATCH", "/api/v1/projects/{project_ref}/members/{user_ref}"): Rule(
        P.MEMBER_MANAGE, body=lambda _w, _v: {"role": "admin"}
    ),
    ("DELETE", "/api/v1/projects/{project_ref}/members/{user_ref}"): Rule(
        P.MEMBER_MANAGE, fresh=_fresh_member
    ),
    ("GET", "/api/v1/users"): Rule(P.USER_READ),
    ("POST", "/api/v1/users"): Rule(P.USER_MANAGE, body=lambda _w, _v: {"name": unique("u")}),
    ("PATCH", "/api/v1/users/{user_ref}"): Rule(
        P.USER_MANAGE, body=lambda _w, _v: {"unix_name": unique("x")}
    ),
    ("POST", "/api/v1/tokens"): Rule(
        P.TOKEN_CREATE, body=lambda _w, _v: {"project": "pa", "role": "member", "name": "mine"}
    ),
    ("GET", "/api/v1/tokens"): Rule(SIGNED_IN),
    ("GET", "/api/v1/projects/{project_ref}/tokens"): Rule(P.TOKEN_MANAGE),
    ("DELETE", "/api/v1/tokens/{token_id}"): Rule(
        P.TOKEN_MANAGE, fresh=_fresh_token, own=True, outlives_expiring=True
    ),
    # Clusters and nodes.
    ("GET", "/api/v1/clusters"): Rule(P.CLUSTER_READ, query=_project_filter),
    ("POST", "/api/v1/clusters"): Rule(
        P.CLUSTER_CREATE, body=lambda _w, _v: {"project": "pa", "name": unique("c"), "size": 1}
    ),
    ("GET", "/api/v1/clusters/{cluster_id}"): Rule(P.CLUSTER_READ),
    ("GET", "/api/v1/clusters/{cluster_id}/status"): Rule(P.CLUSTER_READ),
    ("PATCH", "/api/v1/clusters/{cluster_id}"): Rule(
        P.CLUSTER_CREATE, body=lambda _w, _v: {"autoscale_max": 8}
    ),
    ("DELETE", "/api/v1/clusters/{cluster_id}"): Rule(P.CLUSTER_DELETE, fresh=_fresh_cluster),
    ("GET", "/api/v1/clusters/{cluster_id}/provider-config"): Rule(P.CLUSTER_READ),
    ("PUT", "/api/v1/clusters/{cluster_id}/provider-config"): Rule(
        P.CLUSTER_CREATE, body=lambda _w, _v: {"config": {}, "reason": "matrix"}
    ),
    ("GET", "/api/v1/clusters/{cluster_id}/access"): Rule(P.MEMBER_READ),
    ("GET", "/api/v1/clusters/{cluster_id}/autoscale"): Rule(P.CLUSTER_READ),
    ("PUT", "/api/v1/clusters/{cluster_id}/autoscale"): Rule(
        P.CLUSTER_CREATE, body=lambda _w, _v: {"max_step": 4, "reason": "matrix"}
    ),
    ("GET", "/api/v1/clusters/{cluster_id}/autoscale/actions"): Rule(P.CLUSTER_READ),
    # A sim cluster has no power saving: the allowed caller's answer is a 409.
    ("POST", "/api/v1/clusters/{cluster_id}/power"): Rule(
        P.CLUSTER_CREATE, body=lambda _w, _v: {"action": "resume", "nodes": ["c-900"]}
    ),
    ("GET", "/api/v1/nodes"): Rule(P.NODE_READ, query=_cluster_filter),
    # Prometheus: service discovery (the scrape token, or the owner).
    ("GET", "/api/v1/prometheus/targets"): Rule(P.METRICS_READ),
    # The per-project query proxy: any member. No Prometheus is configured here, so the
    # allowed caller's answer is a 503 (label values: 400 for a name Prometheus refuses).
    **{
        (method, f"/api/v1/projects/{{project_ref}}/prometheus/api/v1/{endpoint}"): Rule(
            P.PROJECT_READ, query=lambda _w, _v: {"query": "up", "match[]": "up"}
        )
        for endpoint in ("query", "query_range", "series", "labels")
        for method in ("GET", "POST")
    },
    ("GET", "/api/v1/projects/{project_ref}/prometheus/api/v1/label/{label_name}/values"): Rule(
        P.PROJECT_READ
    ),
    ("GET", "/api/v1/nodes/{node_id}"): Rule(P.NODE_READ),
    ("POST", "/api/v1/nodes/{node_id}/faults"): Rule(
        P.NODE_ACTION, body=lambda _w, _v: {"signature": "thermal-slowdown", "gpu_index": 1}
    ),
    ("GET", "/api/v1/nodes/{node_id}/faults"): Rule(P.NODE_READ),
    ("DELETE", "/api/v1/nodes/{node_id}/faults/{signature}"): Rule(P.NODE_ACTION),
    ("POST", "/api/v1/nodes/{node_id}/actions"): Rule(
        P.NODE_ACTION, body=lambda _w, _v: {"action": "cordon", "reason": "matrix"}
    ),
    ("POST", "/api/v1/nodes/{node_id}/token"): Rule(
        P.HOST_MANAGE, fresh=_fresh_node, outlives_expiring=True
    ),
    ("POST", "/api/v1/clusters/{cluster_id}/enroll-token"): Rule(
        P.HOST_MANAGE, body=lambda _w, _v: {}, fresh=_fresh_metal_cluster, outlives_expiring=True
    ),
    ("GET", "/api/v1/nodes/{node_id}/commands"): Rule(P.NODE_READ),
    ("GET", "/api/v1/nodes/{node_id}/commands/{command_id}"): Rule(P.NODE_READ),
    ("POST", "/api/v1/nodes/{node_id}/commands"): Rule(
        P.NODE_ACTION, body=lambda _w, _v: {"argv": ["true"], "timeout_s": 30}
    ),
    ("POST", "/api/v1/nodes/{node_id}/commands/{command_id}/cancel"): Rule(
        P.NODE_ACTION, body=lambda _w, _v: {"reason": "matrix"}, fresh=_fresh_command
    ),
    # Timeline, findings, health, usage.
    ("GET", "/api/v1/events"): Rule(P.EVENT_READ, query=_project_filter),
    ("GET", "/api/v1/findings"): Rule(P.FINDING_READ, query=_cluster_filter),
    ("GET", "/api/v1/health/summary"): Rule(P.CLUSTER_READ, query=_cluster_filter),
    ("GET", "/api/v1/usage/gpu-hours"): Rule(P.USAGE_READ, query=_project_filter),
    ("GET", "/api/v1/reliability"): Rule(P.REPAIR_READ, query=_project_filter),
    # Software stacks: the platform's; everyone signed in reads them.
    ("GET", "/api/v1/stacks"): Rule(SIGNED_IN),
    ("POST", "/api/v1/stacks"): Rule(
        P.STACK_MANAGE, body=lambda _w, _v: {"name": unique("stack-"), "cuda": "12.8"}
    ),
    ("GET", "/api/v1/stacks/{stack_name}"): Rule(SIGNED_IN, fresh=_fresh_stack),
    ("POST", "/api/v1/stacks/{stack_name}/latest"): Rule(P.STACK_MANAGE, fresh=_fresh_stack),
    # Stack rollouts: members read them; admins (node actions) run them. A rollout that
    # cannot take the change (409) still let the caller in.
    ("GET", "/api/v1/clusters/{cluster_id}/rollouts"): Rule(P.CLUSTER_READ),
    ("POST", "/api/v1/clusters/{cluster_id}/rollouts"): Rule(
        P.NODE_ACTION,
        body=lambda _w, _v: {"to_stack": "matrix-stack", "window": "sun 02:00/2h"},
        fresh=_fresh_cluster,
    ),
    ("GET", "/api/v1/rollouts/{rollout_id}"): Rule(P.CLUSTER_READ),
    ("POST", "/api/v1/rollouts/{rollout_id}/pause"): Rule(P.NODE_ACTION, body=lambda _w, _v: {}),
    ("POST", "/api/v1/rollouts/{rollout_id}/resume"): Rule(P.NODE_ACTION, body=lambda _w, _v: {}),
    ("POST", "/api/v1/rollouts/{rollout_id}/abort"): Rule(P.NODE_ACTION, body=lambda _w, _v: {}),
    ("POST", "/api/v1/rollouts/{rollout_id}/nodes/{node_id}/rollback"): Rule(
        P.NODE_ACTION, body=lambda _w, _v: {}
    ),
    # Repairs and policy.
    ("GET", "/api/v1/repairs"): Rule(P.REPAIR_READ, query=_cluster_filter),
    ("GET", "/api/v1/repairs/{repair_id}"): Rule(P.REPAIR_READ),
    ("POST", "/api/v1/repairs/{repair_id}/approve"): Rule(
        P.REPAIR_APPROVE, body=lambda _w, _v: {"reason": "matrix"}, fresh=_fresh_repair
    ),
    ("POST", "/api/v1/repairs/{repair_id}/dismiss"): Rule(
        P.REPAIR_APPROVE, body=lambda _w, _v: {"reason": "matrix"}, fresh=_fresh_repair
    ),
    ("POST", "/api/v1/repairs/{repair_id}/force"): Rule(
        P.REPAIR_APPROVE, body=lambda _w, _v: {"reason": "matrix"}
    ),
    ("GET", "/api/v1/clusters/{cluster_id}/repair-breaker"): Rule(P.REPAIR_READ),
    ("POST", "/api/v1/clusters/{cluster_id}/repair-breaker/reset"): Rule(
        P.POLICY_MANAGE, body=lambda _w, _v: {"reason": "matrix"}
    ),
    ("GET", "/api/v1/projects/{project_ref}/repair-policy"): Rule(P.REPAIR_READ),
    ("PUT", "/api/v1/projects/{project_ref}/repair-policy"): Rule(
        P.POLICY_MANAGE, body=lambda _w, _v: {}
    ),
    ("POST", "/api/v1/projects/{project_ref}/repair-policy/replay"): Rule(
        P.REPAIR_READ, body=lambda _w, _v: {"days": 1}
    ),
    # Active checks and acceptance.
    ("POST", "/api/v1/checks"): Rule(
        P.CHECK_RUN, body=lambda w, _v: {"cluster": w.a.cluster["id"], "check": "gpu-burn"}
    ),
    ("GET", "/api/v1/checks"): Rule(P.CHECK_READ, query=_cluster_filter),
    ("GET", "/api/v1/checks/{check_id}"): Rule(P.CHECK_READ),
    ("GET", "/api/v1/checks/{check_id}/output"): Rule(P.CHECK_READ),
    ("POST", "/api/v1/checks/{check_id}/cancel"): Rule(P.CHECK_RUN),
    ("GET", "/api/v1/clusters/{cluster_id}/acceptance"): Rule(P.CLUSTER_READ),
    ("POST", "/api/v1/clusters/{cluster_id}/acceptance"): Rule(
        P.NODE_ACTION, body=lambda _w, _v: {"reason": "matrix"}
    ),
    ("GET", "/api/v1/acceptance/{acceptance_id}"): Rule(P.CLUSTER_READ),
    ("GET", "/api/v1/acceptance/{acceptance_id}/report.json"): Rule(P.CLUSTER_READ),
    ("GET", "/api/v1/acceptance/{acceptance_id}/report.html"): Rule(P.CLUSTER_READ),
    # Storage volumes.
    ("GET", "/api/v1/projects/{project_ref}/volumes"): Rule(P.VOLUME_READ),
    ("POST", "/api/v1/projects/{project_ref}/volumes"): Rule(
        P.VOLUME_MANAGE,
        body=lambda _w, _v: {"name": unique("v"), "size_gb": 10, "mount_path": f"/v/{unique('m')}"},
    ),
    ("GET", "/api/v1/projects/{project_ref}/volumes/{volume_ref}"): Rule(P.VOLUME_READ),
    ("PATCH", "/api/v1/projects/{project_ref}/volumes/{volume_ref}"): Rule(
        P.VOLUME_MANAGE, body=lambda _w, _v: {"size_gb": 100 + int(unique(""))}
    ),
    ("DELETE", "/api/v1/projects/{project_ref}/volumes/{volume_ref}"): Rule(
        P.VOLUME_MANAGE, fresh=_fresh_volume
    ),
    ("POST", "/api/v1/projects/{project_ref}/volumes/{volume_ref}/attachments"): Rule(
        P.VOLUME_MANAGE, body=lambda w, _v: {"cluster": w.a.cluster["id"]}, fresh=_fresh_volume
    ),
    ("DELETE", "/api/v1/projects/{project_ref}/volumes/{volume_ref}/attachments/{cluster_id}"): (
        Rule(P.VOLUME_MANAGE, fresh=_fresh_attachment)
    ),
    # The host inventory and its credentials: the management plane, admins only.
    ("GET", "/api/v1/projects/{project_ref}/credentials"): Rule(P.CREDENTIAL_MANAGE),
    ("GET", "/api/v1/projects/{project_ref}/credentials/{credential_ref}"): Rule(
        P.CREDENTIAL_MANAGE
    ),
    ("PUT", "/api/v1/projects/{project_ref}/credentials/{credential_ref}"): Rule(
        P.CREDENTIAL_MANAGE,
        body=lambda _w, _v: {"kind": "bmc_password", "username": "root", "secret": "pw"},
    ),
    ("DELETE", "/api/v1/projects/{project_ref}/credentials/{credential_ref}"): Rule(
        P.CREDENTIAL_MANAGE, fresh=_fresh_credential
    ),
    ("GET", "/api/v1/projects/{project_ref}/hosts"): Rule(P.HOST_READ, query=_cluster_filter),
    ("GET", "/api/v1/projects/{project_ref}/hosts/{host_ref}"): Rule(P.HOST_READ),
    ("POST", "/api/v1/projects/{project_ref}/hosts/import"): Rule(P.HOST_MANAGE, body=_host_import),
    ("POST", "/api/v1/projects/{project_ref}/hosts/{host_ref}/state"): Rule(
        P.HOST_MANAGE, body=lambda _w, _v: {"state": "out_of_service", "reason": "matrix"}
    ),
    ("POST", "/api/v1/projects/{project_ref}/hosts/{host_ref}/bind"): Rule(
        P.HOST_MANAGE, body=lambda w, _v: {"node_id": w.a.node["id"]}
    ),
    # A reach check opens the hosts' credentials. As ipmi: the world's host is a Redfish
    # one, so it is a "not checked" row and no BMC is called.
    ("POST", "/api/v1/clusters/{cluster_id}/providers/check"): Rule(
        P.HOST_READ, body=lambda _w, _v: {"provider": "ipmi"}
    ),
    # The audit log.
    ("GET", "/api/v1/audit"): Rule(P.AUDIT_READ, query=_project_filter),
    # Agents.
    ("POST", "/api/v1/agent/reports"): Rule(AGENT, body=_report),
    ("POST", "/api/v1/agent/findings"): Rule(AGENT, body=_finding),
    ("POST", "/api/v1/agent/events"): Rule(AGENT, body=_event),
    ("GET", "/api/v1/agent/commands"): Rule(AGENT, query=lambda _w, _v: {"boot_id": "boot-1"}),
    ("POST", "/api/v1/agent/commands/{command_id}/result"): Rule(AGENT, body=_command_result),
    ("GET", "/api/v1/agent/access"): Rule(AGENT),
    # Enrollment takes a cluster's enroll token, not a user's or a node's credential:
    # every caller here gets the same 401 (tests/server/test_bare_metal_cluster.py).
    ("POST", "/api/v1/agent/enroll"): Rule(PUBLIC, body=lambda _w, _v: {"hostname": "gpu-x"}),
}


def api_routes(app: RunningApp) -> dict[tuple[str, str], Any]:
    """Every (method, full path template) under /api/v1, with its route."""
    out: dict[tuple[str, str], Any] = {}
    for context in fastapi.routing.iter_route_contexts(app.app.routes):
        if not context.path.startswith("/api/v1/") or context.path in (
            "/api/v1/openapi.json",
            "/api/v1/docs",
        ):
            continue
        for method in context.methods or ():
            if method != "HEAD":
                out[(method, context.path)] = context.original_route
    return out


def guards_of(route: Any) -> list[Guard]:
    found: list[Guard] = []

    def walk(dependant: Any) -> None:
        for sub in dependant.dependencies:
            if isinstance(sub.call, Guard):
                found.append(sub.call)
            walk(sub)

    walk(route.dependant)
    return found


def dependency_calls(route: Any) -> list[Any]:
    found: list[Any] = []

    def walk(dependant: Any) -> None:
        for sub in dependant.dependencies:
            found.append(sub.call)
            walk(sub)

    walk(route.dependant)
    return found


# The one agent route that resolves its node later, set-wise, in the ingest's group commit.
RESOLVED_BY_THE_INGEST = ("POST", "/api/v1/agent/reports")


def expected(identity: str, rule: Rule) -> str:
    need = rule.need
    if need == PUBLIC:
        return "allowed"  # and the same for everyone: checked apart
    if need == AGENT:
        return "allowed" if identity == "node" else "401"
    if identity in ("anonymous", "node"):
        return "401"
    if need == SIGNED_IN or identity == "owner":
        return "allowed"
    assert isinstance(need, Permission)
    if need in OWNER_ONLY:
        return "403"
    if identity == "other":
        return "404"
    if identity == "expiring" and rule.outlives_expiring:
        return "403"  # a token cannot revoke one that outlives it
    # capped: an admin whose token is capped at member has a member's power, and the
    # member's own objects are not theirs.
    role = Role.ADMIN if identity in ("admin", "expiring") else Role.MEMBER
    if need in ROLE_PERMISSIONS[role] or (rule.own and identity == "member"):
        return "allowed"
    return "403"


def outcome(status: int) -> str:
    return str(status) if status in (401, 403, 404) else "allowed"


async def _path(w: World, template: str, rule: Rule) -> tuple[str, dict[str, str]]:
    values = {
        "project_ref": "pa",
        "cluster_id": w.a.cluster["id"],
        "node_id": w.a.node["id"],
        "repair_id": w.a.repair_id,
        "token_id": w.a.token_id,
        "user_ref": w.a.member,
        "volume_ref": w.a.volume["id"],
        "check_id": w.a.check_id,
        "command_id": w.a.command_id,
        "acceptance_id": w.a.acceptance_id,
        "rollout_id": w.a.rollout_id,
        "signature": "thermal-slowdown",
        "credential_ref": w.a.credential,
        "host_ref": w.a.host,
        "label_name": "job",
    }
    if rule.fresh is not None:
        values.update(await rule.fresh(w))
    return template.format(**values), values


def test_every_api_route_is_in_the_table_and_declares_its_permission_once(
    app: RunningApp,
) -> None:
    routes = api_routes(app)
    missing = sorted(set(routes) - set(ROUTES))
    stale = sorted(set(ROUTES) - set(routes))
    assert not missing, f"routes with no expectation in ROUTES (add them): {missing}"
    assert not stale, f"ROUTES names routes the app no longer has: {stale}"
    for key, route in routes.items():
        guards = guards_of(route)
        need = ROUTES[key].need
        calls = dependency_calls(route)
        # Agent routes take the node caller (server.deps.NodeCallerDep); others never do.
        assert (node_token in calls) == (need == AGENT), key
        if need == AGENT and key != RESOLVED_BY_THE_INGEST:
            assert get_node_caller in calls, f"{key} must take NodeCallerDep"
        if need in (PUBLIC, AGENT):
            assert guards == [], (key, guards)
            continue
        assert len(guards) == 1, f"{key} must declare exactly one Allow(...): {guards}"
        declared = guards[0].permission
        assert (declared.value if declared else SIGNED_IN) == (
            need.value if isinstance(need, Permission) else need
        ), key
        assert guards[0].own == ROUTES[key].own, key
        params = {p.strip("{}") for p in key[1].split("/") if p.startswith("{")}
        unknown = params - set(PATH_PARAMS) - UNSCOPED_PATH_PARAMS
        assert not unknown, f"{key}: path parameters the permission check cannot scope"


async def test_route_matrix(app: RunningApp) -> None:
    world = await build_world(app)
    clients = {identity: world.client(identity) for identity in IDENTITIES}
    wrong: list[str] = []
    refusals_unaudited: list[str] = []
    try:
        for (method, template), rule in sorted(ROUTES.items()):
            statuses: list[int] = []
            for identity in IDENTITIES:
                url, values = await _path(world, template, rule)
                body = rule.body(world, values) if rule.body else None
                params = rule.query(world, values) if rule.query else None
                response = await clients[identity].request(method, url, json=body, params=params)
                statuses.append(response.status_code)
                want, got = expected(identity, rule), outcome(response.status_code)
                if rule.need == PUBLIC:
                    continue
                if want != got:
                    wrong.append(
                        f"{method} {template} as {identity}: expected {want}, got "
                        f"{response.status_code} {response.text[:160]}"
                    )
                if method != "GET" and got in ("403", "404") and rule.need != AGENT:
                    rows = await audit_rows_of(app, response)
                    if [(r.result, r.actor) for r in rows] != [
                        ("denied", f"user:{world.users[identity]}")
                    ]:
                        refusals_unaudited.append(f"{method} {template} as {identity}: {rows}")
            # The login answers the same whoever asks (here: 404, no IdP is set up).
            if rule.need == PUBLIC and (len(set(statuses)) != 1 or 403 in statuses):
                wrong.append(f"{method} {template}: credentials changed the answer: {statuses}")
    finally:
        for client in clients.values():
            await client.aclose()
    assert not wrong, f"{len(wrong)} wrong outcome(s):\n" + "\n".join(wrong)
    assert not refusals_unaudited, "refused mutations without their audit row:\n" + "\n".join(
        refusals_unaudited
    )


@pytest.mark.parametrize("viewer", ["admin", "member"])
async def test_two_projects_are_isolated(app: RunningApp, viewer: str) -> None:
    """pa's people list everything they can and see nothing of pb; every pb object by id
    is 404 to them, exactly like an id that never existed."""
    world = await build_world(app)
    b_ids = set(world.b.ids().values())
    listings = [
        ("/api/v1/projects", {}),
        ("/api/v1/clusters", {}),
        ("/api/v1/nodes", {}),
        ("/api/v1/findings", {}),
        ("/api/v1/repairs", {}),
        ("/api/v1/events", {}),
        ("/api/v1/checks", {}),
        ("/api/v1/tokens", {}),
        ("/api/v1/projects/pa/volumes", {}),
        ("/api/v1/projects/pa/members", {}),
        ("/api/v1/health/summary", {}),
        ("/api/v1/usage/gpu-hours", {}),
        ("/api/v1/reliability", {}),
    ]
    if viewer == "admin":
        listings += [("/api/v1/audit", {"limit": 1000}), ("/api/v1/projects/pa/tokens", {})]
        listings += [("/api/v1/projects/pa/hosts", {}), ("/api/v1/projects/pa/credentials", {})]
    by_id = [
        f"/api/v1/projects/{world.b.project['id']}",
        "/api/v1/projects/pb",
        "/api/v1/projects/pb/volumes",
        "/api/v1/projects/pb/members",
        f"/api/v1/projects/pb/volumes/{world.b.volume['id']}",
        f"/api/v1/clusters/{world.b.cluster['id']}",
        f"/api/v1/clusters/{world.b.cluster['id']}/access",
        f"/api/v1/nodes/{world.b.node['id']}",
        f"/api/v1/nodes/{world.b.node['id']}/commands/{world.b.command_id}",
        f"/api/v1/repairs/{world.b.repair_id}",
        f"/api/v1/checks/{world.b.check_id}",
        f"/api/v1/acceptance/{world.b.acceptance_id}",
        f"/api/v1/projects/pb/hosts/{world.b.host}",
        f"/api/v1/projects/pb/credentials/{world.b.credential}",
    ]
    async with world.client(viewer) as client:
        seen: set[str] = set()
        for url, params in listings:
            response = await client.get(url, params=params)
            assert response.status_code == 200, (url, response.text)
            seen |= {i for i in b_ids if i in response.text}
            assert "pb" not in _names(response.json()), url
        assert not seen, f"{viewer} of pa saw pb's objects: {seen}"
        for url in by_id:
            response = await client.get(url)
            assert response.status_code == 404, (url, response.status_code)
            never = await client.get(url.replace(_id_in(url, b_ids), new_id()).replace("pb", "zz"))
            assert never.status_code == 404
            assert response.json()["error"]["code"] == never.json()["error"]["code"]
        for url in [
            f"/api/v1/clusters/{world.b.cluster['id']}",
            f"/api/v1/projects/pb/volumes/{world.b.volume['id']}",
            f"/api/v1/tokens/{world.b.token_id}",
        ]:
            assert (await client.delete(url)).status_code == 404, url
    assert (await app.client.get(f"/api/v1/clusters/{world.b.cluster['id']}")).json()[
        "status"
    ] == "ready"


def _names(body: Any) -> set[str]:
    items = body.get("items", body) if isinstance(body, dict) else body
    if not isinstance(items, list):
        return set()
    return {str(i.get("name")) for i in items if isinstance(i, dict)}


def _id_in(url: str, ids: set[str]) -> str:
    return next((i for i in ids if i in url), "pb")


async def test_a_node_token_reaches_only_its_own_node(app: RunningApp) -> None:
    """pa's node token: its own cluster's access, none of pb's commands, no user route."""
    world = await build_world(app)
    async with world.client("node") as node:
        access = await node.get("/api/v1/agent/access")
        assert access.json()["cluster_id"] == world.a.cluster["id"]
        result = {**_command_result(world, {}), "id": world.b.command_id}
        foreign = await node.post(
            f"/api/v1/agent/commands/{world.b.command_id}/result", json=result
        )
        assert foreign.status_code == 404, foreign.text
        for url in (f"/api/v1/nodes/{world.a.node['id']}", "/api/v1/me", "/api/v1/projects"):
            assert (await node.get(url)).status_code == 401, url
    record = await app.client.get(
        f"/api/v1/nodes/{world.b.node['id']}/commands/{world.b.command_id}"
    )
    assert record.json()["status"] == "pending"


# Credential routes asked for more than the caller's token holds: (identity, method, url
# builder, body) → the refusal's field. Each must be a 403 that says which limit.
STRONGER: list[tuple[str, str, Callable[[World], str], dict[str, Any] | None, str]] = [
    ("capped", "POST", lambda _w: "/api/v1/tokens", {"project": "pa", "role": "admin"}, "role"),
    ("capped", "POST", lambda _w: "/api/v1/tokens", {"expires_in_days": 30}, "expires_in_days"),
    ("capped", "POST", lambda _w: "/api/v1/tokens", {"project": "pb"}, "project"),
    (
        "capped",
        "DELETE",
        lambda w: f"/api/v1/tokens/{w.token_ids['capped-full']}",
        None,
        "token_id",
    ),
    ("expiring", "POST", lambda _w: "/api/v1/tokens", {"expires_in_days": 2}, "expires_in_days"),
    (
        "expiring",
        "DELETE",
        lambda w: f"/api/v1/tokens/{w.token_ids['expiring-full']}",
        None,
        "token_id",
    ),
    ("expiring", "DELETE", lambda w: f"/api/v1/tokens/{w.token_ids['admin']}", None, "token_id"),
]


async def test_limited_tokens_never_reach_past_their_limits(app: RunningApp) -> None:
    """The capped and expiring callers on the credential routes: what they may not create
    or revoke is refused with a 403 naming the limit; within it, they keep working."""
    world = await build_world(app)
    wrong: list[str] = []
    for identity, method, url, body, field in STRONGER:
        async with world.client(identity) as client:
            response = await client.request(method, url(world), json=body)
        status, got = response.status_code, response.json().get("error", {}).get("field")
        # pb is another project to pa's tokens: 404 (its existence does not leak).
        want = 404 if field == "project" else 403
        if status != want or (want == 403 and got != field):
            wrong.append(f"{identity} {method} {body}: {status} {response.text[:200]}")
    assert not wrong, "\n".join(wrong)
    async with world.client("capped") as client:
        made = await client.post("/api/v1/tokens", json={})
        assert made.status_code == 201, made.text
        assert made.json()["info"]["role"] == "member"
    async with world.client("admin") as client:  # the stronger tokens are still there
        assert (await client.get("/api/v1/me")).status_code == 200
        listed = await client.get("/api/v1/projects/pa/tokens")
    live = {t["id"] for t in listed.json()}
    assert {world.token_ids[k] for k in ("admin", "capped-full", "expiring-full")} <= live
