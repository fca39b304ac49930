"""A project's members page: who is in it with which role; admins add people, change
roles and remove them (through ``services/members.py``, as ``/api/v1/projects/{p}/members``
does). Memberships an IdP group grants follow the group and are shown, not edited."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

import gpufleet.server.services.members as members_services
import gpufleet.server.services.projects as projects_services
from gpufleet.core.access import GROUP_SOURCE
from gpufleet.core.enums import Role
from gpufleet.core.errors import InvalidInput
from gpufleet.server.deps import CtxDep
from gpufleet.server.errors import describe_validation_errors
from gpufleet.server.schemas.projects import AddMemberRequest, UpdateMemberRequest
from gpufleet.server.web.context import permissions
from gpufleet.server.web.routing import HtmlRoute, redirect, render_page
from gpufleet.server.web.session import WebUserDep, first, read_form, set_flash

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)


def _role(form: dict[str, list[str]]) -> Role:
    try:
        return UpdateMemberRequest(role=Role(first(form, "role"))).role
    except (ValueError, ValidationError):
        raise InvalidInput("role is admin or member", field="role") from None


@router.get("/projects/{project_ref}/members")
async def members_page(
    project_ref: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    async with ctx.db.reader() as session:
        project = await projects_services.get_project(session, caller=user.caller, ref=project_ref)
        members = await members_services.list_members(
            session, caller=user.caller, project_ref=project.id
        )
    return render_page(
        request,
        "members.html",
        {
            "user": user,
            "project": project,
            "members": members,
            "can": permissions(user.caller, project.id),
            "roles": list(Role),
            "group_source": GROUP_SOURCE,
            "base": f"/projects/{project.name}/members",
            "now": ctx.clock.now(),
        },
    )


@router.post("/projects/{project_ref}/members")
async def add_member(project_ref: str, request: Request, ctx: CtxDep, user: WebUserDep) -> Response:
    form = await read_form(request, csrf=user.csrf)
    request.state.form_next = f"/projects/{project_ref}/members"
    try:
        body = AddMemberRequest(user=first(form, "user").strip(), role=_role(form))
    except ValidationError as exc:
        raise InvalidInput(describe_validation_errors(list(exc.errors()))[0]) from None
    async with ctx.db.transaction() as session:
        added = await members_services.add_member(
            session, caller=user.caller, project_ref=project_ref, user_ref=body.user,
            role=body.role,
        )  # fmt: skip
    response = redirect(f"/projects/{project_ref}/members")
    set_flash(response, text=f"{added.user_name} is now a {added.role.value} of the project.")
    return response


@router.post("/projects/{project_ref}/members/{user_id}/role")
async def change_role(
    project_ref: str, user_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    form = await read_form(request, csrf=user.csrf)
    request.state.form_next = f"/projects/{project_ref}/members"
    role = _role(form)
    async with ctx.db.transaction() as session:
        changed = await members_services.change_member_role(
            session, caller=user.caller, project_ref=project_ref, user_ref=user_id, role=role
        )
    response = redirect(f"/projects/{project_ref}/members")
    set_flash(response, text=f"{changed.user_name} is now a {changed.role.value}.")
    return response


@router.post("/projects/{project_ref}/members/{user_id}/remove")
async def remove(
    project_ref: str, user_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    await read_form(request, csrf=user.csrf)
    request.state.form_next = f"/projects/{project_ref}/members"
    async with ctx.db.transaction() as session:
        removed = await members_services.remove_member(
            session, caller=user.caller, project_ref=project_ref, user_ref=user_id
        )
    response = redirect(f"/projects/{project_ref}/members")
    set_flash(response, text=f"{removed.user_name} is no longer in the project.")
    return response
