"""The agent's side of the command channel: hand commands out, store their results.

The node comes resolved from its token (``services/node_callers.py``); a command is only
ever handed to, or answered by, the node it was queued for. The long poll around
``claim_commands`` is ``routers/agent_commands.py``; the queue is
``services/node_commands.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import CursorResult, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import (
    CommandPoll,
    CommandResult,
    CommandResultAck,
    CommandStatus,
    NodeCommand,
    status_of_result,
)
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.ids import is_id
from gpufleet.core.transitions import FINAL_COMMAND_STATUSES
from gpufleet.server.db.tables import NodeCommandRow
from gpufleet.server.services.command_records import (
    ANSWER_GRACE_S,
    command_label,
    command_of,
    outcome_of,
    switch_command_status,
)
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_callers import NodeCaller, node_of_caller


async def claim_commands(
    session: AsyncSession,
    *,
    caller: NodeCaller,
    boot_id: str,
    have: Sequence[str],
    max_commands: int,
    now: dt.datetime,
) -> tuple[CommandPoll, bool]:
    """What the node's agent should start now, and what it should stop.

    Hands out again, first, any command taken earlier and neither answered nor listed in
    ``have`` (the answer that carried it was lost), then pending ones, oldest first, up to
    ``max_commands`` in all; marks them sent to ``boot_id``. ``cancel``: ids in ``have``
    that were cancelled or expired. Returns the poll and whether pending ones are left.
    ``Unauthorized`` if the caller's token stopped working (the long poll claims again
    after each wake).
    """
    node = await node_of_caller(session, caller)
    project_id = caller.project_id
    held = set(have)
    cancel: list[str] = []
    if held:
        cancel = list(
            await session.scalars(
                select(NodeCommandRow.id).where(
                    NodeCommandRow.node_id == node.id,
                    NodeCommandRow.id.in_(held),
                    NodeCommandRow.status.in_(
                        [CommandStatus.CANCELLED.value, CommandStatus.EXPIRED.value]
                    ),
                    NodeCommandRow.result_at.is_(None),
                )
            )
        )
    commands: list[NodeCommand] = []
    lost = (
        (
            await session.scalars(
                select(NodeCommandRow)
                .where(
                    NodeCommandRow.node_id == node.id,
                    NodeCommandRow.status == CommandStatus.SENT.value,
                    NodeCommandRow.result_at.is_(None),
                    NodeCommandRow.expires_at > now,
                )
                .order_by(NodeCommandRow.id)
                .limit(max_commands + len(held))
            )
        ).all()
        if max_commands > 0
        else []
    )
    for row in [r for r in lost if r.id not in held][:max_commands]:
        _mark_sent(row, boot_id=boot_id, now=now)
        record_event(
            session,
            kind=EventKind.NODE_COMMAND,
            message=f"command {command_label(row)} handed out again (delivery {row.deliveries}): "
            "the agent did not list it as taken",
            project_id=project_id,
            cluster_id=row.cluster_id,
            node_id=row.node_id,
            actor=f"agent:{node.id}",
            data={"command_id": row.id, "deliveries": row.deliveries, "boot_id": boot_id},
            ts=now,
        )
        commands.append(command_of(row))
    room = max_commands - len(commands)
    pending = (
        (
            await session.scalars(
                select(NodeCommandRow)
                .where(
                    NodeCommandRow.node_id == node.id,
                    NodeCommandRow.status == CommandStatus.PENDING.value,
                    NodeCommandRow.expires_at > now,
                )
                .order_by(NodeCommandRow.id)
                .limit(room + 1)
            )
        ).all()
        if room > 0
        else []
    )
    for row in pending[:room]:
        taken = await session.execute(
            update(NodeCommandRow)
            .where(
                NodeCommandRow.id == row.id, NodeCommandRow.status == CommandStatus.PENDING.value
            )
            .values(updated_at=now)
        )
        assert isinstance(taken, CursorResult)
        if taken.rowcount != 1:
            continue  # another poll of this node took it first
        _mark_sent(row, boot_id=boot_id, now=now)
        switch_command_status(
            session,
            row=row,
            project_id=project_id,
            target=CommandStatus.SENT,
            actor=f"agent:{node.id}",
            reason=f"taken by agent {boot_id}",
            now=now,
        )
        commands.append(command_of(row))
    # With no room nothing was looked at: say "maybe", so the hint is not cleared.
    more = len(pending) > room if room > 0 else True
    return CommandPoll(commands=commands, cancel=cancel), more


def _mark_sent(row: NodeCommandRow, *, boot_id: str, now: dt.datetime) -> None:
    row.sent_at = now
    row.deadline_at = now + dt.timedelta(seconds=row.timeout_s + ANSWER_GRACE_S)
    row.agent_boot_id = boot_id
    row.deliveries += 1
    row.updated_at = now


async def record_command_result(
    session: AsyncSession,
    *,
    caller: NodeCaller,
    command_id: str,
    result: CommandResult,
    now: dt.datetime,
) -> CommandResultAck:
    """Store the agent's result once. The same (or any) result again: ``duplicate``, and
    nothing changes. After a cancel or an expiry: stored as ``late``, status kept.
    ``NotFound`` for a command that is not this node's."""
    node_id, project_id = caller.node_id, caller.project_id
    if result.id != command_id:
        raise InvalidInput("the result's id is not the command id in the path", field="id")
    row = (
        await session.scalars(
            select(NodeCommandRow)
            .where(NodeCommandRow.id == command_id, NodeCommandRow.node_id == node_id)
            .with_for_update()
        )
        if is_id(command_id)
        else None
    )
    found = row.first() if row is not None else None
    if found is None:
        raise NotFound(f"command {command_id!r} not found for this node", field="command_id")
    if found.result is not None:
        return CommandResultAck(
            id=found.id, status=CommandStatus(found.status), duplicate=True, late=found.late_result
        )
    actor = f"agent:{node_id}"
    if found.status == CommandStatus.PENDING.value:
        # Only if an answer was lost and the store lost the claim with it: taken anyway.
        _mark_sent(found, boot_id=result.agent_boot_id, now=now)
        switch_command_status(
            session,
            row=found,
            project_id=project_id,
            target=CommandStatus.SENT,
            actor=actor,
            reason=f"answered by agent {result.agent_boot_id}",
            now=now,
        )
    found.result = _storable(result).model_dump(mode="json")
    found.result_at = now
    found.updated_at = now
    late = CommandStatus(found.status) in FINAL_COMMAND_STATUSES
    if late:
        found.late_result = True
        record_event(
            session,
            kind=EventKind.NODE_COMMAND,
            message=f"command {command_label(found)}: result after it was {found.status}: "
            f"{outcome_of(result)} (kept; status unchanged)",
            project_id=project_id,
            cluster_id=found.cluster_id,
            node_id=found.node_id,
            actor=actor,
            data={"command_id": found.id, "late": True, "outcome": outcome_of(result)},
            ts=now,
        )
    else:
        switch_command_status(
            session,
            row=found,
            project_id=project_id,
            target=status_of_result(result),
            actor=actor,
            reason=outcome_of(result),
            now=now,
        )
    return CommandResultAck(
        id=found.id, status=CommandStatus(found.status), duplicate=False, late=late
    )


def _storable(result: CommandResult) -> CommandResult:
    # PostgreSQL text cannot hold NUL; a binary's output may.
    fields = ("stdout", "stderr", "error")
    dirty = {f: getattr(result, f) for f in fields if "\x00" in (getattr(result, f) or "")}
    if not dirty:
        return result
    return result.model_copy(update={f: v.replace("\x00", "\ufffd") for f, v in dirty.items()})
