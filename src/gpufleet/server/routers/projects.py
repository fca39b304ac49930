from __future__ import annotations

from fastapi import APIRouter, status

import gpufleet.server.services.projects as projects_services
from gpufleet.core.models import Page, Project
from gpufleet.server.deps import CallerDep, CtxDep
from gpufleet.server.schemas.projects import CreateProjectRequest

router = APIRouter(prefix="/projects", tags=["projects"])


@router.get("")
async def list_projects(caller: CallerDep, ctx: CtxDep) -> Page[Project]:
    async with ctx.db.transaction() as session:
        return await projects_services.list_projects(session, caller=caller)


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_project(body: CreateProjectRequest, caller: CallerDep, ctx: CtxDep) -> Project:
    async with ctx.db.transaction() as session:
        return await projects_services.create_project(
            session, caller=caller, name=body.name, description=body.description
        )


@router.get("/{project_ref}")
async def get_project(project_ref: str, caller: CallerDep, ctx: CtxDep) -> Project:
    async with ctx.db.transaction() as session:
        return await projects_services.get_project(session, caller=caller, ref=project_ref)
