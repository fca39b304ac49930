"""What a simulated agent tells the server about its machine's faults, and when.

The moment a fault opens, folds (seen again) or clears, the agent sends the change to
``POST /api/v1/agent/findings`` — it does not wait for the next metrics batch. Changes
are queued in order and leave the queue only when the server's ack covers their ``seq``,
so a send that failed is resent, in order, and never lost. The queue is bounded without
dropping anything: it holds at most two changes (open, clear) per fault the world keeps,
and the world keeps a bounded number of faults per machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence

from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import (
    MAX_REPORTS_PER_BATCH,
    FindingBatch,
    FindingReport,
    FindingState,
)
from gpufleet.sim.fabric import NICS_PER_NODE
from gpufleet.sim.faults import (
    SimFault,
    hca_index,
    kernel_log_message,
    pci_bus_id,
    signature_or_error,
)
from gpufleet.sim.models import SimInstance

log = logging.getLogger(__name__)

_RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # after failed sends, then every 5 s


def fold_key(signature_id: str, gpu_uuid: str | None) -> str:
    return f"{signature_id}/{gpu_uuid or 'node'}"


class FindingSender:
    """One machine's finding changes. Lives as long as the machine (across its reboots),
    so a change queued just before a reboot is still sent after it."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.pending: list[FindingReport] = []
        self._last: dict[str, FindingReport] = {}  # fault id -> the last change queued
        self._last_seq = 0
        self._failures = 0

    def _next_seq(self) -> int:
        # Wall-clock microseconds keep seq growing across restarts of this process (which
        # keeps no state), the bump keeps it strictly growing within one.
        seq = max(time.time_ns() // 1000, self._last_seq + 1)
        self._last_seq = seq
        return seq

    def plan(self, instance: SimInstance, faults: Sequence[SimFault], *, now: dt.datetime) -> int:
        """Queue the changes between what was last queued and ``faults`` (the machine's
        faults, cleared ones included). Clears go first: a fault cleared by a reboot and
        one injected after it may share a fold key. Returns how many were queued."""
        before = len(self.pending)
        seen = {f.fault_id for f in faults}
        for fault_id, queued in list(self._last.items()):
            if fault_id not in seen and queued.state is FindingState.OPEN:
                # Gone from the world's short history while we still had it open.
                update = {"state": FindingState.CLEARED, "last_seen": now}
                self._queue(fault_id, queued.model_copy(update=update))
        for fault in faults:
            last = self._last.get(fault.fault_id)
            if not fault.active and (last is None or last.state is FindingState.OPEN):
                self._queue(fault.fault_id, self._change(instance, fault, FindingState.CLEARED))
        for fault in faults:
            last = self._last.get(fault.fault_id)
            if fault.active and (last is None or last.count != fault.count):
                self._queue(fault.fault_id, self._change(instance, fault, FindingState.OPEN))
        for fault_id in [k for k in self._last if k not in seen]:
            del self._last[fault_id]
        return len(self.pending) - before

    def _queue(self, fault_id: str, change: FindingReport) -> None:
        change = change.model_copy(update={"seq": self._next_seq()})
        self._last[fault_id] = change
        self.pending.append(change)

    @staticmethod
    def _change(instance: SimInstance, fault: SimFault, state: FindingState) -> FindingReport:
        signature = signature_or_error(fault.signature_id)
        gpu = next((g for g in instance.gpus if g.index == fault.gpu_index), None)
        hca = hca_index(fault, nics=NICS_PER_NODE)  # the port the fabric model takes down
        return FindingReport(
            seq=1,  # set when queued
            key=fold_key(signature.id, gpu.uuid if gpu else None),
            signature_id=signature.id,
            state=state,
            severity=signature.severity,
            source=signature.source,
            title=signature.title,
            gpu_uuid=gpu.uuid if gpu else None,
            gpu_index=fault.gpu_index if gpu else None,
            pci_bus_id=pci_bus_id(gpu.index) if gpu else None,
            component=f"mlx5_{hca}/1" if signature.category == "infiniband" else None,
            evidence=kernel_log_message(signature, gpu_index=fault.gpu_index, hca=hca),
            count=fault.count,
            first_seen=fault.started_at,
            last_seen=fault.cleared_at or fault.last_seen,
        )

    async def flush(self, client: AgentClient) -> int:
        """Send what is queued, oldest first, until the queue is empty or a send fails
        (``ApiError``/``ServerUnreachable`` propagate; the queue keeps the changes).
        Returns how many changes the server newly stored."""
        sent = 0
        while self.pending:
            chunk = self.pending[:MAX_REPORTS_PER_BATCH]
            ack = await client.send_findings(FindingBatch(findings=chunk))
            # The ack says what the server holds: everything up to last_seq is stored.
            self.pending = [c for c in self.pending if c.seq > ack.last_seq]
            sent += ack.accepted
            if len(self.pending) >= len(chunk) and self.pending[0].seq == chunk[0].seq:
                raise ApiError(409, "not_stored", f"findings up to {chunk[-1].seq} not stored")
        self._failures = 0
        return sent

    def retry_delay_s(self) -> float:
        delay = _RETRY_S[min(self._failures, len(_RETRY_S) - 1)]
        self._failures += 1
        return delay


async def send_pass(
    sender: FindingSender,
    *,
    instance: SimInstance,
    faults_of: Callable[[], Sequence[SimFault]],
    now: Callable[[], dt.datetime],
    client: Callable[[], AgentClient],
    on_error: Callable[[Exception], None],
    on_sent: Callable[[int], None],
) -> float | None:
    """Queue the changes since the last pass and send them. Returns None when all went
    out, else the seconds to wait before trying again (backing off)."""
    sender.plan(instance, faults_of(), now=now())
    if not sender.pending:
        return None
    try:
        on_sent(await sender.flush(client()))
    except asyncio.CancelledError:
        raise
    except (ApiError, ServerUnreachable) as exc:
        on_error(exc)
        log.debug("sim agent %s: findings not sent: %s", instance.node_name, exc)
        return sender.retry_delay_s()
    except Exception as exc:
        on_error(exc)
        log.exception("sim agent %s: findings send failed", instance.node_name)
        return sender.retry_delay_s()
    return None


async def run_sender(
    sender: FindingSender,
    *,
    instance: SimInstance,
    faults_of: Callable[[], Sequence[SimFault]],
    now: Callable[[], dt.datetime],
    client: Callable[[], AgentClient],
    wake: asyncio.Event,
    resync_s: float,
    on_error: Callable[[Exception], None],
    on_sent: Callable[[int], None],
) -> None:
    """Until cancelled: on every wake (a fault changed) or every ``resync_s``, queue the
    changes and send them at once; after a failure, retry soon with backoff."""
    while True:
        wake.clear()  # before reading the world, so a change after the read wakes us again
        retry = await send_pass(
            sender,
            instance=instance,
            faults_of=faults_of,
            now=now,
            client=client,
            on_error=on_error,
            on_sent=on_sent,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=resync_s if retry is None else retry)
