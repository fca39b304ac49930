"""Projects and their members."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

import gpufleet.server.services.members as members_services
import gpufleet.server.services.projects as projects_services
from gpufleet.core.access import Member
from gpufleet.core.models import Page, Project
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep, SignedIn
from gpufleet.server.schemas.projects import (
    AddMemberRequest,
    CreateProjectRequest,
    UpdateMemberRequest,
)
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/projects", tags=["projects"])


@router.get("")
async def list_projects(caller: SignedIn, ctx: CtxDep) -> Page[Project]:
    """The projects the caller is in (the owner: all)."""
    async with ctx.db.reader() as session:
        return await projects_services.list_projects(session, caller=caller)


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_project(
    body: CreateProjectRequest,
    caller: Annotated[Caller, Allow(Permission.PROJECT_CREATE)],
    ctx: CtxDep,
) -> Project:
    async with ctx.db.transaction() as session:
        return await projects_services.create_project(
            session,
            caller=caller,
            name=body.name,
            description=body.description,
            first_admin=body.first_admin,
        )


@router.get("/{project_ref}")
async def get_project(
    project_ref: str, caller: Annotated[Caller, Allow(Permission.PROJECT_READ)], ctx: CtxDep
) -> Project:
    async with ctx.db.reader() as session:
        return await projects_services.get_project(session, caller=caller, ref=project_ref)


@router.get("/{project_ref}/members")
async def list_members(
    project_ref: str, caller: Annotated[Caller, Allow(Permission.MEMBER_READ)], ctx: CtxDep
) -> list[Member]:
    async with ctx.db.reader() as session:
        return await members_services.list_members(session, caller=caller, project_ref=project_ref)


@router.post("/{project_ref}/members", status_code=status.HTTP_201_CREATED)
async def add_member(
    project_ref: str,
    body: AddMemberRequest,
    caller: Annotated[Caller, Allow(Permission.MEMBER_MANAGE)],
    ctx: CtxDep,
) -> Member:
    """Add an existing user (by id or name); 409 if they are in the project already."""
    async with ctx.db.transaction() as session:
        return await members_services.add_member(
            session, caller=caller, project_ref=project_ref, user_ref=body.user, role=body.role
        )


@router.patch("/{project_ref}/members/{user_ref}")
async def change_member_role(
    project_ref: str,
    user_ref: str,
    body: UpdateMemberRequest,
    caller: Annotated[Caller, Allow(Permission.MEMBER_MANAGE)],
    ctx: CtxDep,
) -> Member:
    """409 for the last admin, and for a role an IdP group grants."""
    async with ctx.db.transaction() as session:
        return await members_services.change_member_role(
            session, caller=caller, project_ref=project_ref, user_ref=user_ref, role=body.role
        )


@router.delete("/{project_ref}/members/{user_ref}")
async def remove_member(
    project_ref: str,
    user_ref: str,
    caller: Annotated[Caller, Allow(Permission.MEMBER_MANAGE)],
    ctx: CtxDep,
) -> Member:
    """409 for the last admin, and for a membership an IdP group grants."""
    async with ctx.db.transaction() as session:
        return await members_services.remove_member(
            session, caller=caller, project_ref=project_ref, user_ref=user_ref
        )
