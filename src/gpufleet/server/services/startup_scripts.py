"""Startup scripts: a cluster's shell scripts, run in order on every node start.

A node start (a new machine, a reboot, a reprovision, a failover to a new host, an
admin's retry) gets one ``node_startup`` row with the scripts as they were then. The
scripts run one at a time through the agent command channel as ``/bin/sh -c SCRIPT``,
each with a timeout; each one's exit code and the tail of its output become a
``node.startup_script`` event on the node's timeline. The first script that fails (exit
code not 0, killed at its timeout, never taken by the agent) ends the start as failed:
the node is held out of service with the error in its ``state_detail`` until the next
start or an admin's ``retry_startup``.

Whoever starts a node creates the row (``ensure_startup``: the provisioning loop, the
repair verifying step) and waits for its outcome; ``advance_startup`` moves a row one
step and is driven by the acceptance loop. Every step is load → apply in one
transaction, the row re-read under lock: the command is queued in the same transaction
that records its id, so a crash never runs a script twice or loses one.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import CommandStatus, script_argv
from gpufleet.core.enums import EventKind, NodeState, StartupStatus
from gpufleet.core.errors import Conflict
from gpufleet.core.ids import new_id
from gpufleet.core.rbac import Permission
from gpufleet.core.transitions import FINAL_COMMAND_STATUSES, STARTUP_RUN
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, NodeCommandRow, NodeRow, NodeStartupRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_commands import cancel_command, enqueue_command
from gpufleet.server.services.nodes import get_node_row_or_error
from gpufleet.server.services.transitions import Subject, transition

# A script's time limit unless its first lines say otherwise (``# gpufleet-timeout: 300``):
# long enough for a package install or an image pull, short enough that a hung mount
# does not hold a node for hours.
DEFAULT_SCRIPT_TIMEOUT_S = 900.0
MAX_SCRIPT_TIMEOUT_S = 6 * 3600.0
OUTPUT_BYTES = 16_384  # kept per stream by the agent
EVENT_TAIL_CHARS = 4_000  # of each stream, on the node's timeline
_TIMEOUT_DIRECTIVE = re.compile(r"^#\s*gpufleet-timeout:\s*(\d+(?:\.\d+)?)\s*s?\s*$", re.M)
ACTOR = "system:startup"


class StartupTrigger(StrEnum):
    PROVISION = "provision"
    REBOOT = "reboot"
    REPROVISION = "reprovision"
    FAILOVER = "failover"  # the node moved to a new machine
    RETRY = "retry"  # an admin asked again after a failure


OPEN = StartupStatus.RUNNING.value


def script_timeout_s(script: str) -> float:
    """The script's own limit from a ``# gpufleet-timeout: N`` line in its first 20 lines
    (seconds, at most 6 h), else ``DEFAULT_SCRIPT_TIMEOUT_S``."""
    head = "\n".join(script.splitlines()[:20])
    found = _TIMEOUT_DIRECTIVE.search(head)
    if found is None:
        return DEFAULT_SCRIPT_TIMEOUT_S
    return min(max(float(found.group(1)), 1.0), MAX_SCRIPT_TIMEOUT_S)


def boot_key(instance_id: str | None, booted_at: dt.datetime | None) -> str:
    """One start of one machine: a reboot or a new host is a new key."""
    when = booted_at.isoformat() if booted_at is not None else "?"
    return f"{instance_id or '?'}@{when}"[:200]


async def latest_startup(session: AsyncSession, *, node_id: str) -> NodeStartupRow | None:
    return await session.scalar(
        select(NodeStartupRow)
        .where(NodeStartupRow.node_id == node_id)
        .order_by(NodeStartupRow.created_at.desc(), NodeStartupRow.id.desc())
        .limit(1)
    )


async def ensure_startup(
    session: AsyncSession,
    *,
    node: NodeRow,
    cluster: ClusterRow,
    trigger: StartupTrigger,
    key: str,
    actor: str,
    now: dt.datetime,
    repair_id: str | None = None,
) -> NodeStartupRow | None:
    """The startup run of this start of the node (made now if there is none yet); None
    when the cluster has no scripts. A run of an earlier start still open is cancelled."""
    scripts = [str(s) for s in cluster.startup_scripts or []]
    latest = await latest_startup(session, node_id=node.id)
    if latest is not None and latest.boot_key == key:
        return latest  # this start's run (or an admin's retry of it)
    if not scripts:
        return None
    if latest is not None and latest.status == OPEN:
        await _end(
            session,
            run=latest,
            node=node,
            project_id=cluster.project_id,
            status=StartupStatus.CANCELLED,
            error="superseded by a newer start of the node",
            now=now,
        )
    return start_startup(
        session,
        node=node,
        cluster=cluster,
        scripts=scripts,
        trigger=trigger,
        key=key,
        actor=actor,
        now=now,
        repair_id=repair_id,
    )


def start_startup(
    session: AsyncSession,
    *,
    node: NodeRow,
    cluster: ClusterRow,
    scripts: Sequence[str],
    trigger: StartupTrigger,
    key: str,
    actor: str,
    now: dt.datetime,
    repair_id: str | None = None,
) -> NodeStartupRow:
    run = NodeStartupRow(
        id=new_id(),
        node_id=node.id,
        cluster_id=cluster.id,
        trigger=trigger.value,
        boot_key=key,
        status=OPEN,
        scripts=list(scripts),
        current=0,
        command_id=None,
        results=[],
        error="",
        repair_id=repair_id,
        created_by=actor,
        created_at=now,
        updated_at=now,
        finished_at=None,
    )
    session.add(run)
    record_event(
        session,
        kind=EventKind.NODE_STARTUP_SCRIPT,
        message=f"node {node.name}: running {len(scripts)} startup script(s) ({trigger.value})",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        node_id=node.id,
        actor=actor,
        data={"startup_id": run.id, "trigger": trigger.value, "scripts": len(scripts)},
        ts=now,
    )
    return run


async def advance_startup(db: Database, run_id: str, *, now: dt.datetime) -> None:
    """One step of one startup run: queue the next script, or take in the result of the
    one running. Safe to repeat and to interrupt (the row is re-read under lock)."""
    async with db.transaction() as session:
        run = await session.get(NodeStartupRow, run_id, with_for_update=True)
        if run is None or run.status != OPEN:
            return
        node = await session.get(NodeRow, run.node_id)
        cluster = await session.get(ClusterRow, run.cluster_id)
        if node is None or cluster is None:
            return
        if NodeState(node.state) in (NodeState.REMOVING, NodeState.REMOVED):
            await _end(
                session,
                run=run,
                node=node,
                project_id=cluster.project_id,
                status=StartupStatus.CANCELLED,
                error="the node was removed",
                now=now,
            )
            return
        if run.command_id is None:
            await _send_next(session, run=run, node=node, now=now)
            return
        command = await session.get(NodeCommandRow, run.command_id)
        if command is None or CommandStatus(command.status) not in FINAL_COMMAND_STATUSES:
            return
        await _take_result(session, run=run, node=node, cluster=cluster, command=command, now=now)


async def _send_next(
    session: AsyncSession, *, run: NodeStartupRow, node: NodeRow, now: dt.datetime
) -> None:
    script = str(run.scripts[run.current])
    timeout = script_timeout_s(script)
    command = await enqueue_command(
        session,
        node_id=node.id,
        argv=script_argv(script),
        timeout_s=timeout,
        purpose=f"startup script {run.current + 1}/{len(run.scripts)} ({run.trigger})",
        requested_by=ACTOR,
        max_output_bytes=OUTPUT_BYTES,
        # The agent of a freshly booted machine needs a moment to come up; a script not
        # taken within its own limit plus 10 minutes is a node that never came up.
        expires_in_s=600.0 + timeout,
        ref=f"startup:{run.id}:{run.current}",
        now=now,
    )
    run.command_id = command.id
    run.updated_at = now


async def _take_result(
    session: AsyncSession,
    *,
    run: NodeStartupRow,
    node: NodeRow,
    cluster: ClusterRow,
    command: NodeCommandRow,
    now: dt.datetime,
) -> None:
    index, total = run.current, len(run.scripts)
    result: dict[str, Any] = dict(command.result or {})
    status = CommandStatus(command.status)
    exit_code = result.get("exit_code")
    stdout = _tail(result.get("stdout"))
    stderr = _tail(result.get("stderr"))
    ok = status is CommandStatus.SUCCEEDED
    how = _how(status, result, timeout_s=command.timeout_s, reason=command.status_reason)
    entry = {
        "index": index,
        "command_id": command.id,
        "status": status.value,
        "exit_code": exit_code,
        "signal": result.get("signal"),
        "timed_out": bool(result.get("timed_out")),
        "error": result.get("error") or (None if ok else how),
        "stdout_tail": stdout,
        "stderr_tail": stderr,
        "started_at": result.get("started_at"),
        "finished_at": result.get("finished_at"),
    }
    run.results = [*(run.results or []), entry]
    run.command_id = None
    run.updated_at = now
    record_event(
        session,
        kind=EventKind.NODE_STARTUP_SCRIPT,
        message=f"node {node.name}: startup script {index + 1}/{total} {how}"
        + (f": {_last_line(stderr) or _last_line(stdout)}" if not ok else ""),
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        node_id=node.id,
        actor=ACTOR,
        data={"startup_id": run.id, **entry},
        ts=now,
    )
    if not ok:
        error = f"startup script {index + 1}/{total} {how}"
        detail = _last_line(stderr) or _last_line(stdout)
        await _end(
            session,
            run=run,
            node=node,
            project_id=cluster.project_id,
            status=StartupStatus.FAILED,
            error=f"{error}: {detail}" if detail else error,
            now=now,
        )
        node.state_detail = run.error
        node.updated_at = now
        return
    run.current = index + 1
    if run.current >= total:
        await _end(
            session, run=run, node=node, project_id=cluster.project_id,
            status=StartupStatus.SUCCEEDED, error="", now=now,
        )  # fmt: skip


def _how(status: CommandStatus, result: dict[str, Any], *, timeout_s: float, reason: str) -> str:
    if status is CommandStatus.SUCCEEDED:
        return "exited 0"
    if status is CommandStatus.TIMED_OUT:
        return f"timed out after {timeout_s:.0f} s (killed)"
    if status is CommandStatus.EXPIRED:
        return f"never ran to an end: {reason or 'the agent did not answer'}"
    if status is CommandStatus.CANCELLED:
        return f"cancelled: {reason or 'cancelled'}"
    if result.get("exit_code") is not None:
        return f"exited {result['exit_code']}"
    if result.get("signal") is not None:
        return f"killed by signal {result['signal']}"
    return f"failed: {result.get('error') or reason or 'no result'}"


async def _end(
    session: AsyncSession,
    *,
    run: NodeStartupRow,
    node: NodeRow,
    project_id: str,
    status: StartupStatus,
    error: str,
    now: dt.datetime,
    actor: str = ACTOR,
) -> None:
    if run.command_id is not None and status is StartupStatus.CANCELLED:
        command = await session.get(NodeCommandRow, run.command_id)
        if command is not None and CommandStatus(command.status) not in FINAL_COMMAND_STATUSES:
            await cancel_command(session, command_id=command.id, actor=ACTOR, reason=error, now=now)
    switch_startup_status(
        session, run=run, node=node, project_id=project_id, target=status, actor=actor,
        reason=error or f"{len(run.scripts)} startup script(s) ran", now=now,
    )  # fmt: skip
    run.error = error


def switch_startup_status(
    session: AsyncSession,
    *,
    run: NodeStartupRow,
    node: NodeRow,
    project_id: str,
    target: StartupStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> bool:
    """The one way a startup run changes status: checked, evented, audited. False if
    unchanged."""
    subject = Subject(
        object_id=run.id,
        label=f"node {node.name}: startup run {run.id} ({run.trigger})",
        project_id=project_id,
        cluster_id=run.cluster_id,
        node_id=run.node_id,
        ids={"startup_id": run.id},
    )
    if not transition(
        session, lifecycle=STARTUP_RUN, row=run, subject=subject, target=target, actor=actor,
        reason=reason, now=now,
    ):  # fmt: skip
        return False
    run.updated_at = now
    if target is not StartupStatus.RUNNING:
        run.finished_at = now
    return True


def _tail(value: object) -> str:
    text = value if isinstance(value, str) else ""
    return text[-EVENT_TAIL_CHARS:]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


async def open_startup_ids(session: AsyncSession) -> list[str]:
    return list(
        await session.scalars(
            select(NodeStartupRow.id)
            .where(NodeStartupRow.status == OPEN)
            .order_by(NodeStartupRow.created_at)
        )
    )


async def retry_startup(
    db: Database, *, caller: Caller, node_id: str, reason: str, now: dt.datetime
) -> NodeStartupRow:
    """An admin runs a node's startup scripts again after they failed. Only for a node
    held in ``provisioning`` by a failed start: a repaired node's next start is the next
    repair (its verifying step runs the scripts again)."""
    async with db.transaction() as session:
        seen, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
        require(caller, Permission.NODE_ACTION, cluster.project_id)
        node = await session.get(NodeRow, seen.id, with_for_update=True, populate_existing=True)
        assert node is not None
        latest = await latest_startup(session, node_id=node.id)
        if (
            NodeState(node.state) is not NodeState.PROVISIONING
            or latest is None
            or (latest.status != StartupStatus.FAILED.value)
        ):
            shown = "none ran" if latest is None else f"the last start {latest.status}"
            raise Conflict(
                f"node {node.name} is {node.state} and {shown}: retry_startup is for a node "
                "held in provisioning by a failed startup script",
                field="action",
            )
        scripts = [str(s) for s in cluster.startup_scripts or []]
        if not scripts:
            # The scripts were removed meanwhile: nothing to run, the node may go on.
            run = start_startup(
                session,
                node=node,
                cluster=cluster,
                scripts=[],
                trigger=StartupTrigger.RETRY,
                key=latest.boot_key or "?",
                actor=caller.actor,
                now=now,
            )
            await _end(
                session, run=run, node=node, project_id=cluster.project_id,
                status=StartupStatus.SUCCEEDED, error="", now=now, actor=caller.actor,
            )  # fmt: skip
        else:
            run = start_startup(
                session,
                node=node,
                cluster=cluster,
                scripts=scripts,
                trigger=StartupTrigger.RETRY,
                key=latest.boot_key or "?",
                actor=caller.actor,
                now=now,
            )
        node.state_detail = f"startup scripts running again ({caller.actor}: {reason})"
        node.updated_at = now
        record_event(
            session,
            kind=EventKind.NODE_ACTION,
            message=f"node {node.name}: retry_startup by {caller.actor}: {reason}",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=node.id,
            actor=caller.actor,
            data={"action": "retry_startup", "reason": reason, "startup_id": run.id},
            ts=now,
        )
        record_audit(
            session,
            actor=caller.actor,
            action="node.retry_startup",
            object_type="node",
            object_id=node.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={"reason": reason, "startup_id": run.id, "failed": latest.error},
            ts=now,
        )
        return run
