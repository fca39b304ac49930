"""Commands for node agents, the queue: queue one, cancel, expire, prune, read.

For other server code (check runs, acceptance, startup scripts):

* ``enqueue_command(session, node_id=..., argv=..., timeout_s=..., purpose=...,
  requested_by=...)`` → the row, status ``pending``; its agent takes it within about a
  second (``GET /agent/commands`` long poll). ``ref`` is your key for finding it again
  (``list_commands(session, ref=...)``), e.g. ``"check_run:<id>"``.
* ``get_command`` / ``list_commands`` / ``list_commands_for_node`` → ``CommandRecord``
  with the agent's ``CommandResult`` once it has ended.
* ``cancel_command`` → ``cancelled``; an agent running it is told to kill it.
* ``expire_commands`` (the ``CommandExpiryLoop``) → ``expired``: not taken by
  ``expires_at``, or taken and not answered by ``deadline_at`` (the command's timeout
  plus ``ANSWER_GRACE_S``).

The agent's side (hand out, store the result) is ``services/agent_commands.py``; how a
command reads and ``switch_command_status``, shared by both, ``services/command_records.py``.
Statuses and their changes are ``core.transitions.COMMAND_TRANSITIONS``; every change
writes one ``node.command`` event and one ``command.status`` audit row. A result that
comes after the command was cancelled or expired is kept (``late_result``) and changes
nothing else. Pass ``caller`` where a person asks; server code passes none.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import (
    DEFAULT_EXPIRES_IN_S,
    DEFAULT_OUTPUT_BYTES,
    MAX_EXPIRES_IN_S,
    CommandRecord,
    CommandStatus,
    NodeCommand,
)
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.core.transitions import FINAL_COMMAND_STATUSES
from gpufleet.server.db.tables import ClusterRow, NodeCommandRow, NodeRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.command_records import (
    ANSWER_GRACE_S,
    command_label,
    command_row_to_record,
    describe_argv,
    switch_command_status,
)
from gpufleet.server.services.command_signals import notify_after_commit
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_callers import REFUSED_NODE_STATES
from gpufleet.server.services.nodes import get_node_row_or_error

SWEEP_BATCH = 500
# Ended commands (with their output) are kept this long, then deleted: a month of
# acceptance runs on a 1,000-node fleet is ~100k rows; their events and audit rows stay.
RETENTION_S = 30 * 86_400.0


# -- queue ------------------------------------------------------------------------------


async def enqueue_command(
    session: AsyncSession,
    *,
    node_id: str,
    argv: Sequence[str],
    timeout_s: float,
    purpose: str,
    requested_by: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    max_output_bytes: int = DEFAULT_OUTPUT_BYTES,
    expires_in_s: float = DEFAULT_EXPIRES_IN_S,
    ref: str | None = None,
    caller: Caller | None = None,
    now: dt.datetime | None = None,
) -> NodeCommandRow:
    """Queue ``argv`` for the node's agent. A script is ``script_argv(text)``.

    Raises ``InvalidInput`` (naming the field; nothing written), ``NotFound`` (no such
    node, or not visible to ``caller``), ``Forbidden`` (``caller`` may not act on nodes),
    ``Conflict`` (the node is being removed). The row is flushed, not committed.
    """
    now = now or utcnow()
    if not 0 < expires_in_s <= MAX_EXPIRES_IN_S:
        raise InvalidInput(
            f"expires_in_s must be in (0, {MAX_EXPIRES_IN_S:.0f}] seconds", field="expires_in_s"
        )
    if ref is not None and not 0 < len(ref) <= 128:
        raise InvalidInput("ref must be 1 to 128 characters", field="ref")
    if not 0 < len(requested_by) <= 128:
        raise InvalidInput("requested_by must be 1 to 128 characters", field="requested_by")
    command_id = new_id()
    try:
        command = NodeCommand(
            id=command_id,
            argv=list(argv),
            env=dict(env or {}),
            cwd=cwd,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            purpose=purpose,
            created_at=now,
            expires_at=now + dt.timedelta(seconds=expires_in_s),
        )
    except ValidationError as exc:
        raise _invalid(exc) from None
    node, project_id = await _node_for(session, node_id=node_id, caller=caller)
    if caller is not None:
        require(caller, Permission.NODE_ACTION, project_id)
    if node.state in REFUSED_NODE_STATES:  # its agent could not take it
        raise Conflict(f"node {node.name} is {node.state}: it takes no commands", field="node_id")
    row = NodeCommandRow(
        id=command.id,
        node_id=node.id,
        cluster_id=node.cluster_id,
        kind=command.kind.value,
        argv=command.argv,
        env=command.env,
        cwd=command.cwd,
        timeout_s=command.timeout_s,
        max_output_bytes=command.max_output_bytes,
        purpose=command.purpose,
        ref=ref,
        requested_by=requested_by,
        status=CommandStatus.PENDING.value,
        status_reason="queued",
        created_at=now,
        updated_at=now,
        expires_at=command.expires_at,
        deliveries=0,
        late_result=False,
    )
    session.add(row)
    detail = {"argv": describe_argv(command.argv), "purpose": purpose, "ref": ref}
    record_event(
        session,
        kind=EventKind.NODE_COMMAND,
        message=f"command {command_label(row)} queued for node {node.name} by {requested_by}",
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=requested_by,
        data={"command_id": row.id, "status": row.status, **detail},
        ts=now,
    )
    record_audit(
        session,
        actor=requested_by,
        action="command.create",
        object_type="node_command",
        object_id=row.id,
        project_id=project_id,
        source_ip=caller.source_ip if caller else None,
        detail={**detail, "node_id": node.id, "timeout_s": timeout_s},
        ts=now,
    )
    await session.flush()
    notify_after_commit(session, node.id, pending=True)
    return row


def _invalid(exc: ValidationError) -> InvalidInput:
    first = exc.errors(include_url=False)[0]
    loc = [str(p) for p in first["loc"]]
    field = loc[0] if loc else "command"
    message = str(first["msg"]).removeprefix("Value error, ")
    return InvalidInput(f"{'.'.join(loc) or 'command'}: {message}", field=field)


async def _node_for(
    session: AsyncSession, *, node_id: str, caller: Caller | None
) -> tuple[NodeRow, str]:
    if caller is not None:
        node, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
        return node, cluster.project_id
    found = (
        await session.execute(
            select(NodeRow, ClusterRow.project_id)
            .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
            .where(NodeRow.id == node_id)
        )
        if is_id(node_id)
        else None
    )
    first = found.first() if found is not None else None
    if first is None:
        raise NotFound(f"node {node_id!r} not found", field="node_id")
    return first[0], first[1]


async def cancel_command(
    session: AsyncSession,
    *,
    command_id: str,
    actor: str,
    reason: str = "",
    caller: Caller | None = None,
    now: dt.datetime | None = None,
) -> CommandRecord:
    """Cancel a pending or running command; an agent running it kills it at its next
    poll and still sends what it got (kept as a late result). Cancelling a cancelled
    command changes nothing; one that has ended is a ``Conflict``."""
    now = now or utcnow()
    row, project_id = await _command_for(session, command_id=command_id, caller=caller)
    if caller is not None:
        require(caller, Permission.NODE_ACTION, project_id)
    was_sent = row.status == CommandStatus.SENT.value
    why = f"cancelled by {actor}" + (f": {reason}" if reason else "")
    changed = switch_command_status(
        session,
        row=row,
        project_id=project_id,
        target=CommandStatus.CANCELLED,
        actor=actor,
        reason=why,
        now=now,
    )
    if changed and was_sent:
        notify_after_commit(session, row.node_id, pending=False)
    if not changed:  # asked again: nothing changes, but the ask is on record
        record_audit(
            session,
            actor=actor,
            action="command.cancel",
            object_type="node_command",
            object_id=row.id,
            project_id=project_id,
            detail={"status": row.status, "changed": False, "reason": reason},
            ts=now,
        )
    return command_row_to_record(row)


async def expire_commands(session: AsyncSession, *, now: dt.datetime) -> int:
    """Expire commands no agent took by ``expires_at`` or answered by ``deadline_at``.
    Returns how many (at most ``SWEEP_BATCH`` per call)."""
    rows = (
        await session.execute(
            select(NodeCommandRow, ClusterRow.project_id)
            .join(ClusterRow, ClusterRow.id == NodeCommandRow.cluster_id)
            .where(
                (
                    (NodeCommandRow.status == CommandStatus.PENDING.value)
                    & (NodeCommandRow.expires_at <= now)
                )
                | (
                    (NodeCommandRow.status == CommandStatus.SENT.value)
                    & (NodeCommandRow.deadline_at <= now)
                )
            )
            .order_by(NodeCommandRow.id)
            .limit(SWEEP_BATCH)
            .with_for_update(skip_locked=True, of=NodeCommandRow)
        )
    ).all()
    for row, project_id in rows:
        if row.status == CommandStatus.PENDING.value:
            reason = (
                f"no agent took it by {row.expires_at.isoformat(timespec='seconds')} "
                "(is the node's agent running?)"
            )
        else:
            reason = (
                f"agent {row.agent_boot_id} took it at "
                f"{row.sent_at.isoformat(timespec='seconds') if row.sent_at else '?'} and "
                f"sent no result within its {row.timeout_s:g} s timeout + {ANSWER_GRACE_S:g} s"
            )
        switch_command_status(
            session,
            row=row,
            project_id=project_id,
            target=CommandStatus.EXPIRED,
            actor="system:node-commands",
            reason=reason,
            now=now,
        )
        if row.sent_at is not None:
            notify_after_commit(session, row.node_id, pending=False)
    return len(rows)


async def prune_commands(session: AsyncSession, *, now: dt.datetime) -> int:
    """Delete ended commands last changed more than ``RETENTION_S`` ago (at most
    ``SWEEP_BATCH`` per call). Returns how many."""
    cutoff = now - dt.timedelta(seconds=RETENTION_S)
    ids = list(
        await session.scalars(
            select(NodeCommandRow.id)
            .where(
                NodeCommandRow.status.in_([s.value for s in FINAL_COMMAND_STATUSES]),
                NodeCommandRow.updated_at < cutoff,
            )
            .limit(SWEEP_BATCH)
        )
    )
    if ids:
        await session.execute(delete(NodeCommandRow).where(NodeCommandRow.id.in_(ids)))
    return len(ids)


async def _command_for(
    session: AsyncSession, *, command_id: str, caller: Caller | None, node_id: str | None = None
) -> tuple[NodeCommandRow, str]:
    query = (
        select(NodeCommandRow, ClusterRow.project_id)
        .join(ClusterRow, ClusterRow.id == NodeCommandRow.cluster_id)
        .where(NodeCommandRow.id == command_id)
    )
    if node_id is not None:
        query = query.where(NodeCommandRow.node_id == node_id)
    found = (await session.execute(query)).first() if is_id(command_id) else None
    if found is None or (caller is not None and not caller.can(Permission.NODE_READ, found[1])):
        raise NotFound(f"command {command_id!r} not found", field="command_id")
    return found[0], found[1]


async def get_command(
    session: AsyncSession,
    *,
    command_id: str,
    caller: Caller | None = None,
    node_id: str | None = None,
) -> CommandRecord:
    """One command. ``NotFound`` if there is none (on ``node_id``, when given) or the
    caller may not see its node."""
    row, _project = await _command_for(
        session, command_id=command_id, caller=caller, node_id=node_id
    )
    return command_row_to_record(row)


async def list_commands(
    session: AsyncSession,
    *,
    ref: str | None = None,
    command_ids: Sequence[str] | None = None,
) -> list[CommandRecord]:
    """Commands by the caller's ``ref`` and/or ids, oldest first (server code only)."""
    if ref is None and command_ids is None:
        raise InvalidInput("give ref or command_ids", field="ref")
    query = select(NodeCommandRow)
    if ref is not None:
        query = query.where(NodeCommandRow.ref == ref)
    if command_ids is not None:
        query = query.where(NodeCommandRow.id.in_([i for i in command_ids if is_id(i)]))
    rows = (await session.scalars(query.order_by(NodeCommandRow.id))).all()
    return [command_row_to_record(r) for r in rows]


async def list_commands_for_node(
    session: AsyncSession,
    *,
    node_id: str,
    caller: Caller | None = None,
    status: CommandStatus | None = None,
    cursor: str | None = None,
    limit: int = 50,
    with_output: bool = True,
) -> Page[CommandRecord]:
    """The node's commands, newest first; ``cursor``: the last id of the previous page."""
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    node, project_id = await _node_for(session, node_id=node_id, caller=caller)
    if caller is not None:
        require(caller, Permission.NODE_READ, project_id)
    query = select(NodeCommandRow).where(NodeCommandRow.node_id == node.id)
    if status is not None:
        query = query.where(NodeCommandRow.status == status.value)
    if cursor is not None:
        query = query.where(NodeCommandRow.id < cursor)
    rows = (await session.scalars(query.order_by(NodeCommandRow.id.desc()).limit(limit + 1))).all()
    items = [command_row_to_record(r, with_output=with_output) for r in rows[:limit]]
    return Page[CommandRecord](items=items, next_cursor=items[-1].id if len(rows) > limit else None)
