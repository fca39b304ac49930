"""How a node command reads, and the one way its status changes.

Shared by the queue (``services/node_commands.py``: enqueue, cancel, expire, read) and the
agent's side (``services/agent_commands.py``: claim, result). Statuses and their changes
are ``core.transitions.NODE_COMMAND``; every change writes one ``node.command`` event and
one ``command.status`` audit row.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import (
    CommandKind,
    CommandRecord,
    CommandResult,
    CommandStatus,
    NodeCommand,
)
from gpufleet.core.transitions import NODE_COMMAND
from gpufleet.server.db.tables import NodeCommandRow
from gpufleet.server.services.transitions import Subject, transition

# After the timeout: the agent's SIGTERM→SIGKILL grace (10 s), reading the last output,
# and a few retries of the result POST. A later result is kept as late.
ANSWER_GRACE_S = 120.0


def describe_argv(argv: Sequence[str], limit: int = 160) -> str:
    """The command as a shell would show it, cut to ``limit`` characters."""
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def command_label(row: NodeCommandRow) -> str:
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
        label=f"command {command_label(row)}",
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
