"""Commands for node agents: queue one, hand it out, store its result, cancel, expire.

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

Statuses and their changes are ``core.transitions.COMMAND_TRANSITIONS``; every change
writes one ``node.command`` event and one ``command.status`` audit row. A result that
comes after the command was cancelled or expired is kept (``late_result``) and changes
nothing else. Pass ``caller`` where a person asks; server code passes none.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Mapping, Sequence

from pydantic import ValidationError
from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import (
    DEFAULT_EXPIRES_IN_S,
    DEFAULT_OUTPUT_BYTES,
    MAX_EXPIRES_IN_S,
    CommandKind,
    CommandPoll,
    CommandRecord,
    CommandResult,
    CommandResultAck,
    CommandStatus,
    NodeCommand,
    status_of_result,
)
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import EventKind, NodeState
from gpufleet.core.errors import Conflict, InvalidInput, NotFound, Unauthorized
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.core.transitions import FINAL_COMMAND_STATUSES, NODE_COMMAND
from gpufleet.server.db.tables import ClusterRow, NodeCommandRow, NodeRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.command_signals import notify_after_commit
from gpufleet.server.services.events import record_event
from gpufleet.server.services.nodes import get_node_row_or_error
from gpufleet.server.services.transitions import Subject, transition

# After the timeout: the agent's SIGTERM→SIGKILL grace (10 s), reading the last output,
# and a few retries of the result POST. A later result is kept as late.
ANSWER_GRACE_S = 120.0
SWEEP_BATCH = 500
# Ended commands (with their output) are kept this long, then deleted: a month of
# acceptance runs on a 1,000-node fleet is ~100k rows; their events and audit rows stay.
RETENTION_S = 30 * 86_400.0
_CLOSED_NODES = frozenset({NodeState.REMOVING.value, NodeState.REMOVED.value})


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
    if node.state in _CLOSED_NODES:
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
        message=f"command {_name(row)} queued for node {node.name} by {requested_by}",
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


def describe_argv(argv: Sequence[str], limit: int = 160) -> str:
    """The command as a shell would show it, cut to ``limit`` characters."""
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _name(row: NodeCommandRow) -> str:
    what = row.purpose or describe_argv(row.argv, 60)
    return f"{row.id[-8:]} ({what})"


# -- status changes ---------------------------------------------------------------------


def switch_command_status(
    session: AsyncSession,
    *,
    row: NodeCommandRow,
    project_id: str,
    target: CommandStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> bool:
    """The one way a command changes status: checked, evented, audited. False if it
    already was ``target``."""
    subject = Subject(
        object_id=row.id,
        label=f"command {_name(row)}",
        project_id=project_id,
        cluster_id=row.cluster_id,
        node_id=row.node_id,
        ids={"command_id": row.id},
    )
    if not transition(
        session, lifecycle=NODE_COMMAND, row=row, subject=subject, target=target, actor=actor,
        reason=reason, now=now,
    ):  # fmt: skip
        return False
    row.status_reason = reason[:2000]
    row.updated_at = now
    return True


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


# -- the agent's side -------------------------------------------------------------------


async def node_for_token(session: AsyncSession, *, token_hash: str) -> tuple[NodeRow, str]:
    found = (
        await session.execute(
            select(NodeRow, ClusterRow.project_id)
            .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
            .where(NodeRow.token_hash == token_hash)
        )
    ).first()
    if found is None or found[0].state in _CLOSED_NODES:
        raise Unauthorized("unknown or revoked node token")
    return found[0], found[1]


async def claim_commands(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
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
    """
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
            message=f"command {_name(row)} handed out again (delivery {row.deliveries}): "
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
    node: NodeRow,
    project_id: str,
    command_id: str,
    result: CommandResult,
    now: dt.datetime,
) -> CommandResultAck:
    """Store the agent's result once. The same (or any) result again: ``duplicate``, and
    nothing changes. After a cancel or an expiry: stored as ``late``, status kept.
    ``NotFound`` for a command that is not this node's."""
    if result.id != command_id:
        raise InvalidInput("the result's id is not the command id in the path", field="id")
    row = (
        await session.scalars(
            select(NodeCommandRow)
            .where(NodeCommandRow.id == command_id, NodeCommandRow.node_id == node.id)
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
    actor = f"agent:{node.id}"
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
            message=f"command {_name(found)}: result after it was {found.status}: "
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


def outcome_of(result: CommandResult) -> str:
    """How it ended, in a few words: "exit 0", "timed out after ...", the error."""
    if result.timed_out:
        took = (
            f" after {(result.finished_at - result.started_at).total_seconds():.1f} s"
            if result.started_at
            else ""
        )
        return f"timed out{took}" + (f", killed by signal {result.signal}" if result.signal else "")
    if result.error:
        return result.error[:500]
    if result.signal is not None:
        return f"killed by signal {result.signal}"
    return f"exit {result.exit_code}"


def _storable(result: CommandResult) -> CommandResult:
    # PostgreSQL text cannot hold NUL; a binary's output may.
    fields = ("stdout", "stderr", "error")
    dirty = {f: getattr(result, f) for f in fields if "\x00" in (getattr(result, f) or "")}
    if not dirty:
        return result
    return result.model_copy(update={f: v.replace("\x00", "\ufffd") for f, v in dirty.items()})


def command_of(row: NodeCommandRow) -> NodeCommand:
    return NodeCommand(
        id=row.id,
        kind=CommandKind(row.kind),
        argv=list(row.argv),
        env=dict(row.env),
        cwd=row.cwd,
        timeout_s=row.timeout_s,
        max_output_bytes=row.max_output_bytes,
        purpose=row.purpose,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


# -- reading ----------------------------------------------------------------------------


def command_row_to_record(row: NodeCommandRow, *, with_output: bool = True) -> CommandRecord:
    result = None if row.result is None else CommandResult.model_validate(row.result)
    if result is not None and not with_output:
        result = result.model_copy(update={"stdout": "", "stderr": ""})
    return CommandRecord(
        id=row.id,
        node_id=row.node_id,
        cluster_id=row.cluster_id,
        kind=CommandKind(row.kind),
        argv=list(row.argv),
        env_names=sorted(row.env),
        cwd=row.cwd,
        timeout_s=row.timeout_s,
        max_output_bytes=row.max_output_bytes,
        purpose=row.purpose,
        ref=row.ref,
        requested_by=row.requested_by,
        status=CommandStatus(row.status),
        status_reason=row.status_reason,
        created_at=row.created_at,
        updated_at=row.updated_at,
        expires_at=row.expires_at,
        sent_at=row.sent_at,
        deadline_at=row.deadline_at,
        agent_boot_id=row.agent_boot_id,
        deliveries=row.deliveries,
        result=result,
        result_at=row.result_at,
        late_result=row.late_result,
    )


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
