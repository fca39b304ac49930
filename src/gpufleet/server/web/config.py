"""The Configuration tab: the cluster's spec, its provider's configuration, startup
scripts, acceptance tests (on, or opted out) and autoscaling bounds. Admins change the
provider configuration through ``set_provider_config`` (the service behind ``PUT
/api/v1/clusters/{id}/provider-config``: a JSON object in a text box), and the rest
through ``update_cluster``, the service behind ``PATCH /api/v1/clusters/{id}``."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

import gpufleet.server.services.autoscale as autoscale_services
import gpufleet.server.services.autoscale_settings as autoscale_settings
import gpufleet.server.services.cluster_provider_config as provider_config_services
import gpufleet.server.services.clusters as clusters_services
from gpufleet.core.autoscaling import AutoscaleMode
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.core.rbac import Permission
from gpufleet.server.context import AppContext
from gpufleet.server.deps import CtxDep
from gpufleet.server.errors import describe_validation_errors
from gpufleet.server.schemas.autoscale import SetAutoscaleRequest
from gpufleet.server.schemas.clusters import UpdateClusterRequest
from gpufleet.server.services.auth import require
from gpufleet.server.web.context import ClusterPage, load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import WebUser, WebUserDep, first, read_form, set_flash

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)


def _bound(form: dict[str, list[str]], name: str) -> int | None:
    text = first(form, name).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"{name.replace('_', ' ')} must be a whole number", field=name) from None


@router.get("/clusters/{cluster_id}/configuration")
async def configuration_tab(
    cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        cluster = await clusters_services.get_cluster(
            session, caller=user.caller, cluster_id=page.cluster.id,
            staleness_s=ctx.settings.staleness_s, now=ctx.clock.now(),
        )  # fmt: skip
        autoscale = await autoscale_settings.get_autoscale(
            session, caller=user.caller, cluster_id=page.cluster.id
        )
        actions = await autoscale_services.list_autoscale_actions(
            session, caller=user.caller, cluster_id=page.cluster.id, limit=10, cursor=None
        )
        try:
            provider = await provider_config_services.get_provider_config(
                session, caller=user.caller, cluster_id=page.cluster.id
            )
            provider_error = ""
        except Conflict as exc:  # a stored configuration that no longer reads: say so
            provider, provider_error = None, exc.message
    values = provider.config.model_dump(mode="json") if provider else {}
    provider_rows = list(values.items())
    return render_page(
        request,
        "tab_configuration.html",
        page.context(
            user, "configuration", cluster=cluster, now=ctx.clock.now(),
            provider_rows=provider_rows, provider_error=provider_error,
            provider_json=json.dumps(values, indent=2), autoscale=autoscale,
            autoscale_actions=actions.items, autoscale_modes=[m.value for m in AutoscaleMode],
        ),
    )  # fmt: skip


async def _admin_form(
    cluster_id: str, request: Request, ctx: AppContext, user: WebUser
) -> tuple[dict[str, list[str]], ClusterPage, str]:
    """A configuration form posted by someone who may change the cluster: the form, the
    cluster's page and where to go back (errors go there too)."""
    form = await read_form(request, csrf=user.csrf)
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
    back = f"/clusters/{page.cluster.id}/configuration"
    request.state.form_next = back
    require(user.caller, Permission.CLUSTER_CREATE, page.cluster.project_id)
    return form, page, back


@router.post("/clusters/{cluster_id}/configuration")
async def update_configuration(
    cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form, page, back = await _admin_form(cluster_id, request, ctx, user)
    # A checkbox sends nothing when unticked: a hidden "0" comes first, the box's "1" after.
    acceptance = form.get("acceptance_tests", ["0"])[-1] == "1"
    scripts = [s.replace("\r\n", "\n") for s in form.get("script", []) if s.strip()]
    try:
        body = UpdateClusterRequest(
            acceptance_tests=acceptance,
            startup_scripts=scripts,
            autoscale_min=_bound(form, "autoscale_min"),
            autoscale_max=_bound(form, "autoscale_max"),
            reason=first(form, "reason").strip(),
        )
    except ValidationError as exc:
        raise InvalidInput(describe_validation_errors(list(exc.errors()))[0]) from None
    async with ctx.db.transaction() as session:
        await clusters_services.update_cluster(
            session, caller=user.caller, cluster_id=page.cluster.id, request=body,
            staleness_s=ctx.settings.staleness_s, now=ctx.clock.now(),
        )  # fmt: skip
    response = redirect(back)
    set_flash(response, text=f"Configuration of {page.cluster.name} saved.")
    return response


@router.post("/clusters/{cluster_id}/provider-config")
async def update_provider_config(
    cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form, page, back = await _admin_form(cluster_id, request, ctx, user)
    try:
        raw = json.loads(first(form, "provider_config") or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"provider configuration: not valid JSON ({exc.msg}, line {exc.lineno})",
            field="provider_config",
        ) from None
    if not isinstance(raw, dict):
        raise InvalidInput(
            'provider configuration: a JSON object, e.g. {"region": "us-east-1", ...}',
            field="provider_config",
        )
    async with ctx.db.transaction() as session:
        await provider_config_services.set_provider_config(
            session, caller=user.caller, cluster_id=page.cluster.id, raw=raw,
            reason=first(form, "reason").strip(), now=ctx.clock.now(),
        )  # fmt: skip
    response = redirect(back)
    set_flash(response, text=f"Provider configuration of {page.cluster.name} saved.")
    return response


@router.post("/clusters/{cluster_id}/autoscale")
async def update_autoscale(
    cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    """The autoscaling form: every field, as ``PUT /api/v1/clusters/{id}/autoscale``."""
    form, page, back = await _admin_form(cluster_id, request, ctx, user)
    fields: dict[str, object] = {
        "mode": first(form, "mode").strip() or "off",
        "min_nodes": _bound(form, "min_nodes"),
        "max_nodes": _bound(form, "max_nodes"),
        "reason": first(form, "reason").strip(),
    }
    for name in ("scale_up_after_s", "scale_down_after_s", "up_cooldown_s", "down_cooldown_s"):
        text = first(form, name).strip()
        if text:
            try:
                fields[name] = float(text)
            except ValueError:
                raise InvalidInput(f"{name} must be a number of seconds", field=name) from None
    step = _bound(form, "max_step")
    if step is not None:
        fields["max_step"] = step
    try:
        body = SetAutoscaleRequest.model_validate(fields)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_errors(list(exc.errors()))[0]) from None
    async with ctx.db.transaction() as session:
        await autoscale_settings.set_autoscale(
            session, caller=user.caller, cluster_id=page.cluster.id, request=body,
            now=ctx.clock.now(),
        )  # fmt: skip
    response = redirect(f"{back}#autoscaling")
    set_flash(response, text=f"Autoscaling of {page.cluster.name} saved.")
    return response
