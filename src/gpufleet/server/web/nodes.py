"""The Nodes tab, a node's page (GPUs, findings with their evidence, repairs, jobs,
telemetry, events) and the node actions, each behind a confirmation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from pydantic import ValidationError

import gpufleet.server.services.events as events_services
import gpufleet.server.services.findings as findings_services
import gpufleet.server.services.nodes as nodes_services
import gpufleet.server.services.repair_actions as actions
import gpufleet.server.services.repairs as repairs_services
from gpufleet.core.enums import Health, NodeState
from gpufleet.core.errors import DriverError, InvalidInput, NotFound
from gpufleet.core.models import Cluster, Node, NodeAction
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import CtxDep
from gpufleet.server.errors import describe_validation_errors
from gpufleet.server.schemas.repairs import REPAIR_NODE_ACTIONS, NodeActionRequest
from gpufleet.server.services.auth import require
from gpufleet.server.services.console import node_version
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.services.telemetry_history import HISTORY_WINDOWS, load_node_history
from gpufleet.server.web.charts import node_charts
from gpufleet.server.web.context import ClusterPage, load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import WebUser, WebUserDep, first, read_form, set_flash

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

NODES_PAGE = 100


@dataclass(frozen=True)
class ActionInfo:
    kind: NodeAction
    label: str
    explain: str  # what happens, in the confirmation dialog
    danger: bool


ACTIONS: dict[NodeAction, ActionInfo] = {
    a.kind: a
    for a in (
        ActionInfo(NodeAction.CORDON, "Cordon",
                   "No new jobs start on {node}; running jobs go on.", False),
        ActionInfo(NodeAction.UNCORDON, "Uncordon",
                   "{node} takes jobs again.", False),
        ActionInfo(NodeAction.DRAIN, "Drain",
                   "{node} is cordoned and its running jobs are left to finish. No job is "
                   "killed.", False),
        ActionInfo(NodeAction.REBOOT, "Reboot",
                   "Runs as a repair: cordon, drain (jobs finish, or the policy's drain "
                   "timeout), reboot, verify, back in service.", True),
        ActionInfo(NodeAction.REPROVISION, "Reprovision",
                   "Runs as a repair: cordon, drain, wipe and reinstall {node} (startup "
                   "scripts run again), verify, back in service.", True),
        ActionInfo(NodeAction.REPLACE, "Replace",
                   "Runs as a repair: cordon, drain, then a new host takes {node}'s place "
                   "(failover) and the old host is released.", True),
        ActionInfo(NodeAction.REMOVE, "Remove",
                   "Runs as a repair: cordon, drain, then {node} leaves the cluster and is "
                   "flagged for hardware service. The cluster has one node fewer.", True),
        ActionInfo(NodeAction.RESET_GPU, "Reset GPU",
                   "Runs as a repair: cordon, drain, reset GPU {gpu} of {node}, verify, back "
                   "in service.", True),
    )
}  # fmt: skip

_HOLD_FROM = {
    NodeAction.CORDON: {NodeState.IN_SERVICE},
    NodeAction.UNCORDON: {NodeState.CORDONED, NodeState.DRAINING, NodeState.DRAINED},
    NodeAction.DRAIN: {NodeState.IN_SERVICE, NodeState.CORDONED},
}
_REPAIRABLE = {
    NodeState.IN_SERVICE,
    NodeState.CORDONED,
    NodeState.DRAINING,
    NodeState.DRAINED,
    NodeState.ACCEPTANCE,
}


def offered_actions(state: NodeState, *, repairing: bool) -> list[ActionInfo]:
    """The actions that make sense now (the service refuses the others anyway)."""
    out = [ACTIONS[k] for k, states in _HOLD_FROM.items() if state in states and not repairing]
    if state in _REPAIRABLE and not repairing:
        out += [ACTIONS[k] for k in REPAIR_NODE_ACTIONS if k is not NodeAction.RESET_GPU]
    return out


async def _jobs_by_node(ctx: CtxDep, cluster: Cluster) -> dict[str, list[str]] | str:
    """Scheduler node name → job ids, read once for the page; or why it could not be read
    (never shown as "no jobs")."""
    try:
        nodes = await scheduler_for(ctx.drivers, cluster).list_nodes()
    except (DriverError, InvalidInput) as exc:
        return f"job state unreadable: {exc.message}"
    return {n.name: list(n.job_ids) for n in nodes}


@router.get("/clusters/{cluster_id}/nodes")
async def nodes_tab(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    state: NodeState | None = None,
    health: Health | None = None,
    name: Annotated[str, Query(max_length=63)] = "",
    cursor: Annotated[str, Query(max_length=36)] = "",
) -> Response:
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        if name:
            found = await nodes_services.find_node_id(
                session, cluster_id=page.cluster.id, name=name
            )
            if found is not None:
                return redirect(f"/clusters/{page.cluster.id}/nodes/{found}")
        listed = await nodes_services.list_nodes(
            session,
            caller=user.caller,
            staleness_s=ctx.settings.staleness_s,
            now=now,
            cluster_id=page.cluster.id,
            state=state,
            health=health,
            cursor=cursor or None,
            limit=NODES_PAGE,
            with_gpus=True,
        )
    jobs = await _jobs_by_node(ctx, page.cluster)
    filters = [(k, v) for k, v in (("state", state), ("health", health)) if v is not None]
    base = f"/clusters/{page.cluster.id}"
    query = [(k, v.value) for k, v in filters]
    next_url = (
        f"{base}/nodes?{urlencode([*query, ('cursor', listed.next_cursor)])}"
        if listed.next_cursor
        else None
    )
    return render_page(
        request,
        "tab_nodes.html",
        page.context(
            user,
            "nodes",
            nodes=listed.items,
            jobs=jobs,
            state=state,
            health=health,
            name=name,
            not_found=bool(name),
            states=list(NodeState),
            healths=list(Health),
            next_url=next_url,
            first_url=f"{base}/nodes?{urlencode(query)}" if cursor else None,
            now=now,
        ),
    )


async def _node_page(
    ctx: CtxDep, user: WebUser, cluster_id: str, node_id: str
) -> tuple[ClusterPage, Node]:
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        node = await nodes_services.get_node(
            session,
            caller=user.caller,
            node_id=node_id,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
        )
    if node.cluster_id != page.cluster.id:
        raise NotFound(f"node {node_id!r} not found in this cluster", field="node_id")
    return page, node


@router.get("/clusters/{cluster_id}/nodes/{node_id}")
async def node_page(
    cluster_id: str,
    node_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    window: Annotated[str, Query(max_length=4)] = "1h",
) -> Response:
    if window not in HISTORY_WINDOWS:
        raise InvalidInput(f"window must be one of {', '.join(HISTORY_WINDOWS)}", field="window")
    now = ctx.clock.now()
    page, node = await _node_page(ctx, user, cluster_id, node_id)
    async with ctx.db.reader() as session:
        open_findings = await findings_services.list_findings(
            session, caller=user.caller, node_id=node.id, is_open=True, limit=200
        )
        cleared = await findings_services.list_findings(
            session, caller=user.caller, node_id=node.id, is_open=False, limit=10
        )
        repairs = await repairs_services.list_repairs(
            session, caller=user.caller, node_id=node.id, limit=10
        )
        events = await events_services.list_events(
            session, project_ids=[page.cluster.project_id], cluster_id=page.cluster.id,
            node_id=node.id, limit=20,
        )  # fmt: skip
        history = await load_node_history(
            session, node_id=node.id, since=now - HISTORY_WINDOWS[window], until=now
        )
        versions = {**page.versions, "node": await node_version(session, node.id)}
    jobs = await repairs_services.jobs_on_node(ctx.drivers, cluster=page.cluster, node=node)
    repairing = any(r.status.value in _ACTIVE for r in repairs.items)
    base = f"/clusters/{page.cluster.id}"
    return render_page(
        request,
        "node.html",
        page.context(
            user,
            "nodes",
            node=node,
            findings=open_findings.items,
            cleared=cleared.items,
            findings_by_gpu=_by_gpu(open_findings.items),
            repairs=repairs.items,
            events=events.items,
            jobs=jobs,
            actions=offered_actions(node.state, repairing=repairing) if page.can["act"] else [],
            reset_gpu=ACTIONS[NodeAction.RESET_GPU],
            repairing=repairing,
            charts=node_charts(history, now=now, window=HISTORY_WINDOWS[window]),
            window=window,
            windows=list(HISTORY_WINDOWS),
            node_url=f"{base}/nodes/{node.id}",
            now=now,
            versions=versions,
        ),
    )


_ACTIVE = {"approved", "cordoning", "draining", "acting", "verifying"}


def _by_gpu(findings: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for f in findings:
        if f.gpu_index is not None:
            out.setdefault(f.gpu_index, []).append(f)
    return out


def _action_or_404(action: str) -> ActionInfo:
    try:
        return ACTIONS[NodeAction(action)]
    except ValueError:
        raise NotFound(f"no node action {action!r}", field="action") from None


@router.get("/clusters/{cluster_id}/nodes/{node_id}/actions/{action}")
async def confirm_action_page(
    cluster_id: str,
    node_id: str,
    action: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    gpu: Annotated[int | None, Query(ge=0, lt=64)] = None,
) -> Response:
    """The confirmation without JavaScript (with it, a dialog asks on the node's page)."""
    info = _action_or_404(action)
    page, node = await _node_page(ctx, user, cluster_id, node_id)
    require(user.caller, Permission.NODE_ACTION, page.cluster.project_id)
    return render_page(
        request,
        "confirm.html",
        page.context(
            user,
            "nodes",
            heading=f"{info.label} {node.name}" + (f", GPU {gpu}" if gpu is not None else ""),
            explain=info.explain.format(node=node.name, gpu=gpu),
            action_url=f"/clusters/{page.cluster.id}/nodes/{node.id}/actions",
            fields={"action": info.kind.value}
            | ({"gpu_index": str(gpu)} if gpu is not None else {}),
            reason="required",
            submit=info.label,
            danger=info.danger,
            back=f"/clusters/{page.cluster.id}/nodes/{node.id}",
        ),
    )


@router.post("/clusters/{cluster_id}/nodes/{node_id}/actions")
async def node_action(
    cluster_id: str, node_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form = await read_form(request, csrf=user.csrf)
    page, node = await _node_page(ctx, user, cluster_id, node_id)
    back = request.state.form_next or f"/clusters/{page.cluster.id}/nodes/{node.id}"
    request.state.form_next = back
    require(user.caller, Permission.NODE_ACTION, page.cluster.project_id)
    gpu = first(form, "gpu_index")
    try:
        body = NodeActionRequest(
            action=NodeAction(first(form, "action")),
            reason=first(form, "reason").strip(),
            gpu_index=int(gpu) if gpu.strip() else None,
        )
    except (ValueError, ValidationError) as exc:
        message = (
            describe_validation_errors(list(exc.errors()))[0]
            if isinstance(exc, ValidationError)
            else f"not a node action: {first(form, 'action')!r}"
        )
        raise InvalidInput(message) from None
    result = await actions.node_action(
        ctx.db, caller=user.caller, node_id=node.id, request=body, drivers=ctx.drivers,
        default_policy=ctx.default_repair_policy, staleness_s=ctx.settings.staleness_s,
        now=ctx.clock.now(),
    )  # fmt: skip
    repair = result.repair
    info = ACTIONS[body.action]
    text = f"{info.label}: {node.name} is now {result.node.state.value.replace('_', ' ')}."
    if repair is not None:
        text = (
            f"{info.label} of {node.name} runs as repair {repair.id} ({repair.status.value}); "
            "follow it on the Repairs tab."
        )
    response = redirect(back)
    set_flash(response, text=text)
    return response
