"""Commands on a node, for people: read them (members), run and cancel (admins).

Running a command is root on the node, so it takes ``node.action`` (project admins, who
hold sudo on their clusters anyway) and is audited with the full argv. Active checks for
members go through check runs, which only queue the check programs.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

import gpufleet.server.services.node_commands as commands_services
from gpufleet.core.agent_protocol import CommandRecord, CommandStatus
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.schemas.node_commands import CancelCommandRequest, RunCommandRequest
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.command_records import command_row_to_record

router = APIRouter(prefix="/nodes/{node_id}/commands", tags=["commands"])

Reader = Annotated[Caller, Allow(Permission.NODE_READ)]
Admin = Annotated[Caller, Allow(Permission.NODE_ACTION)]


@router.get("")
async def list_node_commands(
    node_id: str,
    caller: Reader,
    ctx: CtxDep,
    status: CommandStatus | None = None,
    output: bool = Query(default=True, description="Include each result's stdout/stderr."),
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=50, ge=1, le=500),
) -> Page[CommandRecord]:
    """Newest first."""
    async with ctx.db.reader() as session:
        return await commands_services.list_commands_for_node(
            session,
            node_id=node_id,
            caller=caller,
            status=status,
            cursor=cursor,
            limit=limit,
            with_output=output,
        )


@router.get("/{command_id}")
async def get_node_command(
    node_id: str, command_id: str, caller: Reader, ctx: CtxDep
) -> CommandRecord:
    async with ctx.db.reader() as session:
        return await commands_services.get_command(
            session, command_id=command_id, caller=caller, node_id=node_id
        )


@router.post("", status_code=status.HTTP_201_CREATED)
async def run_node_command(
    node_id: str, body: RunCommandRequest, caller: Admin, ctx: CtxDep
) -> CommandRecord:
    """Queue a command for the node's agent; poll the command for its result."""
    async with ctx.db.transaction() as session:
        row = await commands_services.enqueue_command(
            session,
            node_id=node_id,
            argv=body.argv,
            timeout_s=body.timeout_s,
            env=body.env,
            cwd=body.cwd,
            max_output_bytes=body.max_output_bytes,
            expires_in_s=body.expires_in_s,
            purpose=body.purpose,
            requested_by=caller.actor,
            caller=caller,
            now=ctx.clock.now(),
        )
        return command_row_to_record(row)


@router.post("/{command_id}/cancel")
async def cancel_node_command(
    node_id: str,
    command_id: str,
    caller: Admin,
    ctx: CtxDep,
    body: CancelCommandRequest | None = None,
) -> CommandRecord:
    async with ctx.db.transaction() as session:
        await commands_services.get_command(
            session, command_id=command_id, caller=caller, node_id=node_id
        )
        return await commands_services.cancel_command(
            session,
            command_id=command_id,
            actor=caller.actor,
            reason=body.reason if body else "",
            caller=caller,
            now=ctx.clock.now(),
        )
