"""The Repairs tab: the queue with its evidence and recommended action, approve or
dismiss (admins, each behind a confirmation), a repair's page, and the breaker."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

import gpufleet.server.services.events as events_services
import gpufleet.server.services.repair_actions as actions
import gpufleet.server.services.repairs as repairs_services
from gpufleet.core.enums import EventKind, RepairStatus
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.models import Repair
from gpufleet.core.rbac import Permission
from gpufleet.core.repair.models import ACTIVE_STATUSES
from gpufleet.server.deps import CtxDep
from gpufleet.server.errors import describe_validation_errors
from gpufleet.server.schemas.repairs import (
    ApproveRepairRequest,
    DismissRepairRequest,
    ResetBreakerRequest,
)
from gpufleet.server.services.auth import require
from gpufleet.server.web.context import ClusterPage, load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import WebUser, WebUserDep, first, read_form, set_flash

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

RECENT_REPAIRS = 50
_ACTION_EXPLAIN = {
    "reset_gpu": "reset the GPU",
    "reboot": "reboot the node",
    "reprovision": "wipe and reinstall the node",
    "failover": "replace the node with a new host",
    "remove": "take the node out of the cluster for hardware service",
    "restart_workload": "restart the workload",
    "none": "do nothing to the node",
}


def approve_text(repair: Repair) -> str:
    what = _ACTION_EXPLAIN.get(repair.action.value, repair.action.value)
    return (
        f"gpufleet will cordon {repair.node_name}, wait for its jobs to finish (the policy's "
        f"drain timeout), {what}, verify it, and return it to service."
    )


def _validated(
    model: type[ApproveRepairRequest | DismissRepairRequest | ResetBreakerRequest], reason: str
) -> ApproveRepairRequest | DismissRepairRequest | ResetBreakerRequest:
    try:
        return model(reason=reason)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_errors(list(exc.errors()))[0]) from None


@router.get("/clusters/{cluster_id}/repairs")
async def repairs_tab(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
) -> Response:
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        open_ = await repairs_services.list_repairs(
            session, caller=user.caller, cluster_id=page.cluster.id, open_only=True, limit=500
        )
        recent = await repairs_services.list_repairs(
            session, caller=user.caller, cluster_id=page.cluster.id, limit=RECENT_REPAIRS
        )
    breaker = await actions.show_breaker(
        ctx.db, caller=user.caller, cluster_id=page.cluster.id,
        default_policy=ctx.default_repair_policy,
    )  # fmt: skip
    proposed = [r for r in open_.items if r.status is RepairStatus.PROPOSED]
    running = [r for r in open_.items if r.status in ACTIVE_STATUSES]
    ended = [r for r in recent.items if r.status not in ACTIVE_STATUSES and
             r.status is not RepairStatus.PROPOSED]  # fmt: skip
    return render_page(
        request,
        "tab_repairs.html",
        page.context(
            user,
            "repairs",
            proposed=proposed,
            running=running,
            ended=ended,
            breaker=breaker,
            approve_text=approve_text,
            now=now,
        ),
    )


async def _repair(
    ctx: CtxDep, user: WebUser, cluster_id: str, repair_id: str
) -> tuple[ClusterPage, Repair]:
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        repair = await repairs_services.get_repair(
            session, caller=user.caller, repair_id=repair_id, drivers=ctx.drivers
        )
    if repair.cluster_id != page.cluster.id:
        raise NotFound(f"repair {repair_id!r} not found in this cluster", field="repair_id")
    return page, repair


@router.get("/clusters/{cluster_id}/repairs/{repair_id}")
async def repair_page(
    cluster_id: str, repair_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    now = ctx.clock.now()
    page, repair = await _repair(ctx, user, cluster_id, repair_id)
    events = []
    if repair.node_id is not None:
        async with ctx.db.reader() as session:
            listed = await events_services.list_events(
                session, project_ids=[page.cluster.project_id], cluster_id=page.cluster.id,
                node_id=repair.node_id, since=repair.created_at, limit=200,
                kinds=[EventKind.REPAIR_PROPOSED, EventKind.REPAIR_UPDATED,
                       EventKind.REPAIR_STATUS, EventKind.REPAIR_STEP, EventKind.NODE_STATE,
                       EventKind.NODE_HEALTH],
            )  # fmt: skip
        events = listed.items
    return render_page(
        request,
        "repair.html",
        page.context(
            user, "repairs", repair=repair, events=events, approve_text=approve_text, now=now
        ),
    )


@router.get("/clusters/{cluster_id}/repairs/{repair_id}/{decision}")
async def confirm_decision_page(
    cluster_id: str,
    repair_id: str,
    decision: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
) -> Response:
    """The approve/dismiss confirmation without JavaScript."""
    if decision not in ("approve", "dismiss"):
        raise NotFound(f"no repair decision {decision!r}")
    page, repair = await _repair(ctx, user, cluster_id, repair_id)
    require(user.caller, Permission.REPAIR_APPROVE, page.cluster.project_id)
    base = f"/clusters/{page.cluster.id}"
    approve = decision == "approve"
    return render_page(
        request,
        "confirm.html",
        page.context(
            user,
            "repairs",
            heading=(
                f"{'Approve' if approve else 'Dismiss'} {repair.action.value.replace('_', ' ')} "
                f"of {repair.node_name or repair.incident_key}"
            ),
            explain=approve_text(repair) if approve else
            "The recommendation is closed without action; the findings stay open.",
            action_url=f"{base}/repairs/{repair.id}/{decision}",
            fields={},
            reason="optional" if approve else "required",
            submit="Approve" if approve else "Dismiss",
            danger=not approve,
            back=f"{base}/repairs",
        ),
    )  # fmt: skip


@router.post("/clusters/{cluster_id}/repairs/{repair_id}/approve")
async def approve(
    cluster_id: str, repair_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form = await read_form(request, csrf=user.csrf)
    page, repair = await _repair(ctx, user, cluster_id, repair_id)
    request.state.form_next = request.state.form_next or f"/clusters/{page.cluster.id}/repairs"
    require(user.caller, Permission.REPAIR_APPROVE, page.cluster.project_id)
    body = _validated(ApproveRepairRequest, first(form, "reason").strip())
    assert isinstance(body, ApproveRepairRequest)
    done = await actions.approve_repair(
        ctx.db, caller=user.caller, repair_id=repair.id, request=body,
        default_policy=ctx.default_repair_policy, now=ctx.clock.now(),
    )  # fmt: skip
    response = redirect(request.state.form_next)
    set_flash(
        response,
        text=f"Approved: {done.action.value.replace('_', ' ')} of {done.node_name}. "
        "gpufleet cordons, drains, acts and verifies; watch it here.",
    )
    return response


@router.post("/clusters/{cluster_id}/repairs/{repair_id}/dismiss")
async def dismiss(
    cluster_id: str, repair_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form = await read_form(request, csrf=user.csrf)
    page, repair = await _repair(ctx, user, cluster_id, repair_id)
    request.state.form_next = request.state.form_next or f"/clusters/{page.cluster.id}/repairs"
    require(user.caller, Permission.REPAIR_APPROVE, page.cluster.project_id)
    body = _validated(DismissRepairRequest, first(form, "reason").strip())
    assert isinstance(body, DismissRepairRequest)
    done = await actions.dismiss_repair(
        ctx.db, caller=user.caller, repair_id=repair.id, request=body, now=ctx.clock.now()
    )
    response = redirect(request.state.form_next)
    set_flash(response, text=f"Dismissed: {done.action.value.replace('_', ' ')} of "
                             f"{done.node_name or done.incident_key}.")  # fmt: skip
    return response


@router.post("/clusters/{cluster_id}/repair-breaker/reset")
async def reset_breaker(
    cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form = await read_form(request, csrf=user.csrf)
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
    request.state.form_next = request.state.form_next or f"/clusters/{page.cluster.id}/repairs"
    require(user.caller, Permission.POLICY_MANAGE, page.cluster.project_id)
    body = _validated(ResetBreakerRequest, first(form, "reason").strip())
    assert isinstance(body, ResetBreakerRequest)
    await actions.reset_cluster_breaker(
        ctx.db, caller=user.caller, cluster_id=page.cluster.id, request=body,
        default_policy=ctx.default_repair_policy, now=ctx.clock.now(),
    )  # fmt: skip
    response = redirect(request.state.form_next)
    set_flash(response, text="The repair breaker is reset; repairs may start again.")
    return response
