"""Software stacks (``core.stacks``): the platform owner defines them and marks the
latest; everyone signed in reads them. New clusters take the latest unless pinned."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status

from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.core.stacks import STACK_NAME, Stack
from gpufleet.server.deps import Allow, CtxDep, SignedIn
from gpufleet.server.schemas.stacks import CreateStackRequest
from gpufleet.server.services import stacks as stack_services
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/stacks", tags=["stacks"])

StackName = Annotated[str, Path(pattern=STACK_NAME, max_length=63)]


@router.get("")
async def list_stacks(caller: SignedIn, ctx: CtxDep) -> Page[Stack]:
    """Every stack, newest first; ``latest`` marks the one new clusters take."""
    del caller
    async with ctx.db.reader() as session:
        return await stack_services.list_stacks(session)


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_stack(
    body: CreateStackRequest,
    caller: Annotated[Caller, Allow(Permission.STACK_MANAGE)],
    ctx: CtxDep,
) -> Stack:
    """A new stack (a stack never changes once made: a new version is a new stack)."""
    async with ctx.db.transaction() as session:
        return await stack_services.create_stack(
            session,
            caller=caller,
            name=body.name,
            spec=body.spec(),
            notes=body.notes,
            latest=body.latest,
            now=ctx.clock.now(),
        )


@router.get("/{stack_name}")
async def get_stack(stack_name: StackName, caller: SignedIn, ctx: CtxDep) -> Stack:
    del caller
    async with ctx.db.reader() as session:
        return stack_services.stack_of(await stack_services.get_stack_row(session, stack_name))


@router.post("/{stack_name}/latest")
async def make_latest(
    stack_name: StackName,
    caller: Annotated[Caller, Allow(Permission.STACK_MANAGE)],
    ctx: CtxDep,
) -> Stack:
    """New clusters take this stack from now on (existing clusters keep theirs until
    migrated)."""
    async with ctx.db.transaction() as session:
        return await stack_services.make_latest(
            session, caller=caller, name=stack_name, now=ctx.clock.now()
        )
