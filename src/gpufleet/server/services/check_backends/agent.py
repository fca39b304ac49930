"""Checks through the agent command channel (``services/node_commands.py``): each
invocation is one command for its node's agent; a multi-node NCCL run is one mpirun
command on the first node. Used on clusters without Slurm, and on sim clusters (whose
simulated agents run the sim's check programs, ``sim/check_programs.py``).

Only the store is touched (commands are rows the agents poll for), so every method runs
its own short transaction. Commands carry ``ref = "check_run:<id>"`` and the invocation id
in their purpose, so ``start`` after a crash finds the commands it queued before.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.aggregate import InvocationOutput
from gpufleet.checks.runners import Invocation, Launcher
from gpufleet.core.agent_protocol import (
    MAX_OUTPUT_BYTES,
    CommandRecord,
    CommandStatus,
)
from gpufleet.core.clock import Clock
from gpufleet.core.errors import Conflict
from gpufleet.core.transitions import FINAL_COMMAND_STATUSES
from gpufleet.server.db.engine import Database
from gpufleet.server.services.check_backends.base import BackendJob, Polled
from gpufleet.server.services.node_commands import (
    cancel_command,
    enqueue_command,
    list_commands,
)

ACTOR = "system:checks"
# An ib_write_bw client starts this long after its server was handed to the agent, so
# the server listens by then (perftest's client does not retry a refused connection).
CLIENT_DELAY_S = 2.0
# A command no agent took by then expired: the node's agent is down.
EXPIRES_IN_S = 600.0


def command_ref(run_id: str) -> str:
    return f"check_run:{run_id}"


def _purpose(job: BackendJob, inv: Invocation) -> str:
    return f"check {job.plan.kind.value} {job.run_id[-8:]}:{inv.id}"


def _invocation_of(record: CommandRecord) -> str:
    return record.purpose.rsplit(":", 1)[-1]


def output_of(inv_id: str, record: CommandRecord) -> InvocationOutput | None:
    """The invocation's output once its command ended; None while it runs."""
    result = record.result
    if record.status not in FINAL_COMMAND_STATUSES and result is None:
        return None
    if result is None:
        return InvocationOutput(
            id=inv_id, error=f"command {record.status.value}: {record.status_reason}"
        )
    took = (
        (result.finished_at - result.started_at).total_seconds()
        if result.started_at is not None
        else None
    )
    return InvocationOutput(
        id=inv_id,
        stdout=result.stdout,
        stderr=result.stderr,
        exit_code=result.exit_code if result.signal is None else 128 + result.signal,
        timed_out=result.timed_out,
        error=result.error,
        duration_s=took,
    )


def _ready_for_follower(before: CommandRecord, now: dt.datetime, delay_s: float) -> bool:
    """Whether the invocation that must start first (an ib_write_bw server) is far
    enough along: taken by its agent ``delay_s`` ago (listening by now), or ended well
    (a simulated server answers at once)."""
    if before.status is CommandStatus.SENT:
        return before.sent_at is not None and (now - before.sent_at).total_seconds() >= delay_s
    return before.status is CommandStatus.SUCCEEDED


class AgentBackend:
    name = "agent"
    launcher = Launcher.MPIRUN

    def __init__(self, db: Database, *, clock: Clock, client_delay_s: float = CLIENT_DELAY_S):
        self.db = db
        self.clock = clock
        self.client_delay_s = client_delay_s

    async def start(self, job: BackendJob) -> dict[str, Any]:
        async with self.db.transaction() as session:
            await self._advance(session, job, self.clock.now())
        return {"ref": command_ref(job.run_id)}

    async def poll(self, job: BackendJob, handles: Mapping[str, Any]) -> Polled:
        now = self.clock.now()
        async with self.db.transaction() as session:
            records = await self._advance(session, job, now)
        outputs: dict[str, InvocationOutput] = {}
        waiting = 0
        for inv in job.plan.invocations:
            record = records.get(inv.id)
            if record is None and inv.after is not None:
                before = records.get(inv.after)
                if (
                    before is not None
                    and before.status in FINAL_COMMAND_STATUSES
                    and not _ready_for_follower(before, now, self.client_delay_s)
                ):
                    outputs[inv.id] = InvocationOutput(
                        id=inv.id,
                        error=f"not started: {inv.after} ended first "
                        f"({before.status.value}: {before.status_reason})",
                    )
                    continue
            output = output_of(inv.id, record) if record is not None else None
            if output is None:
                waiting += 1
            else:
                outputs[inv.id] = output
        note = f"{waiting} of {len(job.plan.invocations)} command(s) still running"
        return Polled(done=waiting == 0, outputs=outputs, handles=dict(handles), note=note)

    async def cancel(
        self, job: BackendJob, handles: Mapping[str, Any]
    ) -> dict[str, InvocationOutput]:
        del handles  # the commands are found by their ref
        now = self.clock.now()
        outputs: dict[str, InvocationOutput] = {}
        async with self.db.transaction() as session:
            for inv_id, record in (await self._records(session, job)).items():
                if record.status not in FINAL_COMMAND_STATUSES:
                    try:
                        record = await cancel_command(
                            session,
                            command_id=record.id,
                            actor=ACTOR,
                            reason=f"check run {job.run_id} stopped",
                            now=now,
                        )
                    except Conflict:
                        continue  # it ended meanwhile
                output = output_of(inv_id, record)
                if output is not None:
                    outputs[inv_id] = output
        return outputs

    async def _advance(
        self, session: AsyncSession, job: BackendJob, now: dt.datetime
    ) -> dict[str, CommandRecord]:
        """Queue what may start now; returns every command of the run.

        An agent runs one command at a time by default (``command_concurrency``), so a
        node gets the next command of a run only once its last one ended. An
        ib_write_bw server starts only when its client's node is free too, and that node
        is kept for the client (which follows once the server listens): a ring of
        servers each waiting for a client stuck behind another server cannot form.
        """
        records = await self._records(session, job)
        invocations = job.plan.invocations
        follower = {i.after: i for i in invocations if i.after is not None}
        busy = {
            records[i.id].node_id
            for i in invocations
            if i.id in records and records[i.id].status not in FINAL_COMMAND_STATUSES
        }
        kept = {
            job.node_ids[f.node]
            for f in follower.values()
            if f.after in records and f.id not in records
        }
        for inv in invocations:
            if inv.id in records:
                continue
            node = job.node_ids[inv.node]
            if inv.after is not None:
                before = records.get(inv.after)
                if before is None or not _ready_for_follower(before, now, self.client_delay_s):
                    continue
                if node in busy and node != before.node_id:
                    continue
            else:
                partner = follower.get(inv.id)
                nodes = {node} | ({job.node_ids[partner.node]} if partner else set())
                if nodes & (busy | kept):
                    continue
                if partner is not None:
                    kept.add(job.node_ids[partner.node])
            await self._enqueue(session, job, inv)
            busy.add(node)
        return await self._records(session, job)

    async def _records(self, session: AsyncSession, job: BackendJob) -> dict[str, CommandRecord]:
        records = await list_commands(session, ref=command_ref(job.run_id))
        return {_invocation_of(r): r for r in records}

    async def _enqueue(self, session: AsyncSession, job: BackendJob, inv: Invocation) -> None:
        await enqueue_command(
            session,
            node_id=job.node_ids[inv.node],
            argv=list(inv.argv),
            env=dict(inv.env),
            timeout_s=inv.timeout_s,
            purpose=_purpose(job, inv),
            requested_by=ACTOR,
            max_output_bytes=MAX_OUTPUT_BYTES,
            expires_in_s=EXPIRES_IN_S,
            ref=command_ref(job.run_id),
            now=self.clock.now(),
        )
