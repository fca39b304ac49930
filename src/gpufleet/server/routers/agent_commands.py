"""The agent's side of the command channel; node tokens only, their own node only.

``GET /agent/commands`` is a long poll: with ``wait_s`` it is held open until a command
for the node is queued (or one it runs is cancelled), or ``wait_s`` passes. The store is
read when the poll starts and after each wake, in short transactions: nothing is held
while waiting (see ``services/command_signals.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gpufleet.core.agent_protocol import (
    COMMAND_WAIT_MAX_S,
    MAX_CLAIM,
    MAX_HAVE,
    CommandPoll,
    CommandResult,
    CommandResultAck,
)
from gpufleet.core.errors import InvalidInput
from gpufleet.core.ids import is_id
from gpufleet.server.context import AppContext
from gpufleet.server.deps import CtxDep, JsonBody, NodeCallerDep, body_schema
from gpufleet.server.services.agent_commands import claim_commands, record_command_result
from gpufleet.server.services.command_signals import signals_for
from gpufleet.server.services.node_callers import NodeCaller

router = APIRouter(prefix="/agent", tags=["agent"])

BootId = Annotated[
    str,
    Query(
        pattern=r"^[A-Za-z0-9._:-]{1,64}$",
        description="The agent run asking: a new one each time the agent starts.",
    ),
]


@router.get("/commands")
async def poll_commands(
    caller: NodeCallerDep,
    ctx: CtxDep,
    boot_id: BootId,
    wait_s: float = Query(
        default=0.0,
        ge=0,
        le=COMMAND_WAIT_MAX_S,
        description="Hold the poll open this long when there is nothing to hand out.",
    ),
    max_commands: int = Query(
        default=1, ge=0, le=MAX_CLAIM, alias="max", description="Commands to take now."
    ),
    have: list[str] = Query(
        default=[],
        max_length=MAX_HAVE,
        description="Ids the agent runs or holds a result for (never handed out again).",
    ),
) -> CommandPoll:
    bad = next((h for h in have if not is_id(h)), None)
    if bad is not None:
        raise InvalidInput(f"have: {bad!r} is not a command id", field="have")
    poll = await _claim(ctx, caller, boot_id, have, max_commands)
    if poll.commands or poll.cancel or wait_s <= 0:
        return poll
    signals = signals_for(ctx.db, clock=ctx.clock)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    with signals.watch(caller.node_id) as woken:
        # Queued between the first look and the watch: the in-process hint has it.
        if max_commands > 0 and signals.is_pending(caller.node_id):
            woken.set()
        while (remaining := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=remaining)
            if not woken.is_set():
                break
            woken.clear()
            poll = await _claim(ctx, caller, boot_id, have, max_commands)
            if poll.commands or poll.cancel:
                return poll
    return poll


async def _claim(
    ctx: AppContext, caller: NodeCaller, boot_id: str, have: list[str], max_commands: int
) -> CommandPoll:
    # Shielded: a poll given up while it claims (the agent went away, the server stops)
    # still ends its transaction cleanly; what it took is handed out again next time.
    return await asyncio.shield(_claim_now(ctx, caller, boot_id, have, max_commands))


async def _claim_now(
    ctx: AppContext, caller: NodeCaller, boot_id: str, have: list[str], max_commands: int
) -> CommandPoll:
    async with ctx.db.transaction() as session:
        poll, more = await claim_commands(
            session,
            caller=caller,
            boot_id=boot_id,
            have=have,
            max_commands=max_commands,
            now=ctx.clock.now(),
        )
    if not more:
        signals_for(ctx.db, clock=ctx.clock).claimed_all(caller.node_id)
    return poll


@router.post("/commands/{command_id}/result", openapi_extra=body_schema(CommandResult))
async def post_command_result(
    command_id: str,
    caller: NodeCallerDep,
    body: Annotated[CommandResult, Depends(JsonBody(CommandResult))],
    ctx: CtxDep,
) -> CommandResultAck:
    """Idempotent: the same result again is 200 with ``duplicate``, stored once."""
    async with ctx.db.transaction() as session:
        return await record_command_result(
            session,
            caller=caller,
            command_id=command_id,
            result=body,
            now=ctx.clock.now(),
        )
