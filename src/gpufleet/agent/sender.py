"""Deliver the spool to the server: findings at once, metrics each report interval.

Two tasks, so a slow metrics POST never holds a finding back. While the server is
unreachable (or answers 5xx) each task backs off exponentially with jitter up to
``retry_max_s`` and the spool keeps everything; when it answers again the spool is
replayed oldest first. The server acknowledges the highest ``seq`` it holds and drops
repeats, so a batch resent after a timeout whose answer was lost does no harm.

A 4xx is not retried quickly: it will fail the same way until someone fixes the token or
the agent. Findings are still kept (never dropped) and retried at the slow pace.

With several server replicas (``server_url`` a comma-separated list) the client has
already tried each of them before a send fails here (``client/http.py``): a batch cut off
by a dying replica goes to the next one at once, and only "no replica answered" or a
5xx from the last one reaches the backoff. The replicas share one store, so the ``seq``
dedupe holds across them (docs/high-availability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.outbox import Outbox
from gpufleet.agent.spool import Spool
from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import (
    MAX_REPORTS_PER_BATCH,
    EventBatch,
    FindingBatch,
    NodeIdentity,
    ReportBatch,
)

log = logging.getLogger(__name__)

# Metrics replay in batches well under the protocol's cap: a day of spooled reports
# then goes in ~90 requests that each stay small for the server.
METRIC_BATCH = 100
# The outbox is also filled by other processes (the Slurm epilog): look every few seconds.
OUTBOX_POLL_S = 2.0


@dataclass(slots=True)
class SendStatus:
    """What the exporter shows about delivery."""

    last_finding_send: float | None = None  # unix time of the last acknowledged POST
    last_report_send: float | None = None
    consecutive_failures: int = 0
    report_interval_s: float = 10.0


class Backoff:
    def __init__(self, *, initial_s: float, max_s: float, rng: random.Random | None = None):
        self._initial, self._max = initial_s, max_s
        self._next = initial_s
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security

    def next(self) -> float:
        delay = self._next
        self._next = min(self._max, self._next * 2)
        # Full jitter on the upper half: 2,000 nodes do not return in lockstep.
        return delay / 2 + self._rng.random() * delay / 2

    def reset(self) -> None:
        self._next = self._initial

    def slowest(self) -> float:
        self._next = self._max
        return self._max


class Sender:
    def __init__(
        self,
        client: AgentClient,
        spool: Spool,
        *,
        identity: NodeIdentity,
        retry_initial_s: float,
        retry_max_s: float,
        status: SendStatus,
        outbox: Outbox | None = None,
        node_state_file: Path | None = None,
    ) -> None:
        self._client = client
        self._node_state_file = node_state_file
        self._node_state: str | None = None
        self._spool = spool
        self._outbox = outbox
        self._identity = identity
        self._retry = (retry_initial_s, retry_max_s)
        self._status = status
        self._findings_wake = asyncio.Event()
        self._metrics_wake = asyncio.Event()
        self._events_wake = asyncio.Event()
        self._identity_sent = {"findings": False, "reports": False, "events": False}

    def wake_findings(self) -> None:
        self._findings_wake.set()

    def wake_metrics(self) -> None:
        self._metrics_wake.set()

    def wake_events(self) -> None:
        self._events_wake.set()

    async def run_findings(self) -> None:
        await self._loop("findings", self._findings_wake, self.send_findings_once)

    async def run_metrics(self) -> None:
        await self._loop("reports", self._metrics_wake, self.send_metrics_once)

    async def run_events(self) -> None:
        await self._loop("events", self._events_wake, self.send_events_once, idle_s=OUTBOX_POLL_S)

    async def _loop(
        self,
        what: str,
        wake: asyncio.Event,
        send: Callable[[], Awaitable[bool]],
        *,
        idle_s: float | None = None,
    ) -> None:
        backoff = Backoff(initial_s=self._retry[0], max_s=self._retry[1])
        delay: float | None = idle_s  # None: wait for a wake-up
        while True:
            if delay is None:
                await wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=delay)
            wake.clear()
            try:
                more = await send()
            except ServerUnreachable as exc:
                delay = backoff.next()
                self._status.consecutive_failures += 1
                log.warning("server unreachable sending %s (retry in %.1fs): %s", what, delay, exc)
                continue
            except ApiError as exc:
                self._status.consecutive_failures += 1
                if exc.status >= 500 or exc.status == 429:
                    delay = backoff.next()
                else:
                    delay = backoff.slowest()
                log.error("server refused %s (retry in %.0fs): %s", what, delay, exc)
                continue
            backoff.reset()
            self._status.consecutive_failures = 0
            delay = 0.0 if more else idle_s

    async def send_findings_once(self) -> bool:
        """Send the oldest pending changes. Returns whether more are pending."""
        pending = self._spool.findings.pending(MAX_REPORTS_PER_BATCH)
        if not pending:
            return False
        identity = None if self._identity_sent["findings"] else self._identity
        ack = await self._client.send_findings(FindingBatch(identity=identity, findings=pending))
        self._identity_sent["findings"] = True
        self._spool.findings.ack(min(ack.last_seq, pending[-1].seq))
        self._status.last_finding_send = time.time()
        return self._spool.findings.depth() > 0

    async def send_metrics_once(self) -> bool:
        pending = self._spool.metrics.pending(METRIC_BATCH)
        if not pending:
            return False
        identity = None if self._identity_sent["reports"] else self._identity
        ack = await self._client.send_reports(ReportBatch(identity=identity, reports=pending))
        self._identity_sent["reports"] = True
        self._spool.metrics.ack(max(ack.last_seq, pending[-1].seq))
        if ack.report_interval_s > 0:
            self._status.report_interval_s = ack.report_interval_s
        if ack.node_state is not None:
            self._keep_node_state(ack.node_state)
        self._status.last_report_send = time.time()
        return self._spool.metrics.depth() > 0

    def _keep_node_state(self, state: str) -> None:
        """Write the node's state in gpufleet to ``node_state_file`` when it changed
        (whole: a reader never sees half a word). A boot gate reads it: a cloud node's
        ``slurmd`` starts once it says ``in_service``. Never fatal to reporting."""
        if self._node_state_file is None or state == self._node_state:
            return
        try:
            tmp = self._node_state_file.with_name(self._node_state_file.name + ".tmp")
            tmp.write_text(state + "\n")
            os.replace(tmp, self._node_state_file)
        except OSError as exc:
            log.warning("cannot write %s: %s", self._node_state_file, exc)
            return
        if self._node_state is not None:
            log.info("node state in gpufleet: %s → %s", self._node_state, state)
        self._node_state = state

    async def send_events_once(self) -> bool:
        """Send the oldest queued events; delete their files once acknowledged."""
        if self._outbox is None:
            return False
        pending = self._outbox.pending(MAX_REPORTS_PER_BATCH)
        if not pending:
            return False
        identity = None if self._identity_sent["events"] else self._identity
        await self._client.send_events(
            EventBatch(identity=identity, events=[event for _, event in pending])
        )
        self._identity_sent["events"] = True
        self._outbox.ack([path for path, _ in pending])
        return self._outbox.depth() > 0
