"""Group commit for agent reports.

Each request hands its batch to the ingestor and waits for its own ack. One writer task
takes everything that queued up while the previous write ran and stores it in a single
transaction, so throughput grows with load while every ack still means "durably stored"
(an agent never drops a report the server did not commit). A batch that fails inside a
group is retried alone, so one bad report cannot fail its neighbours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from gpufleet.core.agent_protocol import ReportAck, ReportBatch
from gpufleet.core.clock import Clock, SystemClock
from gpufleet.core.errors import GpufleetError, Unavailable
from gpufleet.server.db.engine import Database
from gpufleet.server.services.agent_reports import PendingBatch, apply_report_batches

log = logging.getLogger(__name__)


class IngestUnavailable(Unavailable):
    """The ingestor is stopped or the store failed; the agent should retry later."""


@dataclass
class _Item:
    pending: PendingBatch
    future: asyncio.Future[ReportAck]


@dataclass
class IngestStats:
    groups: int = 0
    batches: int = 0
    reports: int = 0
    failures: int = 0


class ReportIngestor:
    def __init__(
        self,
        db: Database,
        *,
        staleness_s: float,
        report_interval_s: float,
        max_group: int = 500,
        writers: int = 2,
        clock: Clock | None = None,
    ) -> None:
        self._db = db
        self._staleness_s = staleness_s
        self._report_interval_s = report_interval_s
        self._max_group = max_group
        # SQLite has one writer whatever we do; PostgreSQL gains from a second one.
        self._writers = 1 if db.is_sqlite else writers
        self._clock = clock or SystemClock()
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = IngestStats()

    async def start(self) -> None:
        for i in range(self._writers):
            self._tasks.append(asyncio.create_task(self._run(), name=f"ingest-writer-{i}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if not item.future.done():
                item.future.set_exception(IngestUnavailable("server is shutting down"))

    async def submit(self, *, token_hash: str, batch: ReportBatch) -> ReportAck:
        """Store one batch; returns once it is committed. Raises the batch's domain error."""
        if not self._tasks:
            raise IngestUnavailable("ingest is not running; retry")
        future: asyncio.Future[ReportAck] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Item(PendingBatch(token_hash=token_hash, batch=batch), future))
        return await future

    async def drained(self) -> None:
        """Return once every batch queued so far has been written (or dropped)."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            taken = [await self._queue.get()]
            while len(taken) < self._max_group and not self._queue.empty():
                taken.append(self._queue.get_nowait())
            # A batch whose request went away (the agent gave up waiting) is not written:
            # the agent never saw an ack and sends it again, and a late write of it would
            # land after the agent was stopped.
            group = [item for item in taken if not item.future.done()]
            try:
                if group:
                    await self._write_group(group)
            except Exception:  # keep the writer alive whatever happened
                log.exception("ingest writer failed on a group of %d", len(group))
                for item in group:
                    if not item.future.done():
                        item.future.set_exception(IngestUnavailable("store write failed"))
            finally:
                for _ in taken:
                    self._queue.task_done()

    async def _write_group(self, group: list[_Item]) -> None:
        try:
            results = await self._apply([i.pending for i in group])
        except Exception:
            if len(group) == 1:
                self.stats.failures += 1
                raise
            log.warning("group of %d failed; retrying each batch alone", len(group))
            for item in group:
                try:
                    await self._write_group([item])
                except Exception:
                    log.exception("batch failed alone")
                    if not item.future.done():
                        item.future.set_exception(IngestUnavailable("store write failed"))
            return
        self.stats.groups += 1
        for item, result in zip(group, results, strict=True):
            if item.future.done():  # the request was cancelled (client went away)
                continue
            if isinstance(result, GpufleetError):
                item.future.set_exception(result)
            else:
                self.stats.batches += 1
                self.stats.reports += result.accepted
                item.future.set_result(result)

    async def _apply(self, pendings: list[PendingBatch]) -> list[ReportAck | GpufleetError]:
        async with self._db.transaction() as session:
            return await apply_report_batches(
                session,
                items=pendings,
                now=self._clock.now(),
                staleness_s=self._staleness_s,
                report_interval_s=self._report_interval_s,
            )
