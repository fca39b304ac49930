"""The agent's loops: sample, follow, detect, spool, send. Wiring lives in ``main``.

* the sample loop calls every collector each ``sample_interval_s``; a collector that
  raises is logged (once per distinct error) and skipped, the others go on;
* each event source (kernel log, NVML events) runs in its own task, restarted with a
  delay if it crashes;
* every finding change is spooled (fsync) and the sender woken at once; an open one
  first gets the optional ``context`` line (Kubernetes mode: the pods on the node);
* every ``report_interval_s`` the latest GPU readings become one metrics report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from gpufleet.agent.collectors.base import (
    Collector,
    CollectorResult,
    Condition,
    Event,
    EventSource,
    Sample,
)
from gpufleet.agent.detectors import Detector
from gpufleet.agent.findings import FindingChange, with_context
from gpufleet.agent.sender import Sender, SendStatus
from gpufleet.agent.spool import Spool
from gpufleet.agent.xids import XidCounter
from gpufleet.core.agent_protocol import FindingState, GpuSample, NodeReport
from gpufleet.core.clock import Clock

log = logging.getLogger(__name__)

SOURCE_RESTART_S = 5.0  # a crashed event source is restarted after this long

# What the node looks like now, as one line for an open finding's evidence (None: nothing
# known). Called as the finding is spooled, so it must be quick and never block.
FindingContext = Callable[[], str | None]
_CONTEXT = "(finding context)"  # its failures are remembered beside the collectors'


class SampleCheck(Protocol):
    """Looks at a whole sample (every collector's result) and reports conditions: what
    needs two views at once, like Slurm's GPUs against the hardware's."""

    async def observe(self, result: CollectorResult) -> list[Condition]: ...


class Agent:
    def __init__(
        self,
        *,
        collectors: Sequence[Collector],
        sources: Sequence[EventSource],
        detector: Detector,
        spool: Spool,
        sender: Sender,
        status: SendStatus,
        clock: Clock,
        state_dir: Path,
        sample_interval_s: float,
        checks: Sequence[SampleCheck] = (),
        context: FindingContext | None = None,
    ) -> None:
        self.collectors = list(collectors)
        self.checks = list(checks)
        self.sources = list(sources)
        self.detector = detector
        self.spool = spool
        self.sender = sender
        self.status = status
        self._clock = clock
        self._snapshot = state_dir / "open-findings.json"
        self._sample_s = sample_interval_s
        self.latest: dict[str, Sample] = {}  # by GPU UUID / port, for reports and /metrics
        self.xids = XidCounter()  # every Xid event, for /metrics
        self._report_seq = 0
        self._errors: dict[str, str] = {}
        self._context = context
        findings, unsent = load_open_findings(self._snapshot)
        self.detector.restore(findings, unsent=unsent)

    # -- one step each (tests drive these directly) ---------------------------------

    async def sample_once(self) -> list[FindingChange]:
        result = CollectorResult()
        for collector in self.collectors:
            try:
                result.extend(await collector.collect(self._clock.now()))
            except Exception as exc:  # noqa: BLE001 - one broken collector must not stop the rest
                self._collector_failed(collector.name, exc)
            else:
                self._errors.pop(collector.name, None)
        for check in self.checks:
            try:
                result.conditions.extend(await check.observe(result))
            except Exception as exc:  # noqa: BLE001 - like a collector: log, go on
                self._collector_failed(type(check).__name__, exc)
        now = self._clock.now()
        for sample in result.samples:
            self.latest[sample.gpu_uuid or sample.component or "node"] = sample
        self.xids.learn(result.samples)
        self.xids.observe(result.events)
        changes = self.detector.observe(result, now) + self.detector.tick(now)
        return self.submit(changes)

    async def on_events(self, events: list[Event]) -> None:
        self.xids.observe(events)
        changes = self.detector.events(events, self._clock.now())
        if events and not changes:
            # Repeats folded for a later tick: their lines are checkpointed once we
            # return, so the snapshot must hold them or a crash would lose the count.
            self._save_snapshot()
        self.submit(changes)

    def submit(self, changes: list[FindingChange]) -> list[FindingChange]:
        """Spool durably, then wake the sender: the server hears of it at once. Returns
        the changes as spooled (open ones with the context line)."""
        if not changes:
            return changes
        changes = self._with_context(changes)
        self.spool.findings.add(changes)
        self._save_snapshot()
        self.sender.wake_findings()
        return changes

    def _with_context(self, changes: list[FindingChange]) -> list[FindingChange]:
        # Only on what goes out: the detector keeps the bare evidence, so a repeat gets
        # the context of its own moment, never a second line. A clear gets none.
        if self._context is None or all(c.state is FindingState.CLEARED for c in changes):
            return changes
        try:
            line = self._context()
        except Exception as exc:  # the finding matters more than its context
            if self._errors.get(_CONTEXT) != repr(exc):
                log.exception("finding context failed; findings go without it (logged once)")
                self._errors[_CONTEXT] = repr(exc)
            return changes
        self._errors.pop(_CONTEXT, None)
        if not line:
            return changes
        return [with_context(c, line) if c.state is FindingState.OPEN else c for c in changes]

    def _save_snapshot(self) -> None:
        save_open_findings(
            self._snapshot, self.detector.open_findings(), unsent=self.detector.unsent_keys()
        )

    def report_once(self) -> NodeReport:
        report = NodeReport(
            seq=self._next_report_seq(),
            sampled_at=self._clock.now(),
            gpus=[gpu_sample(s) for s in self.latest.values() if s.scope == "gpu"][:64],
        )
        self.spool.metrics.add(report)
        self.sender.wake_metrics()
        return report

    def _next_report_seq(self) -> int:
        # Wall-clock µs, like the simulated agents: grows across restarts without state.
        self._report_seq = max(time.time_ns() // 1000, self._report_seq + 1)
        return self._report_seq

    def _collector_failed(self, name: str, exc: Exception) -> None:
        text = repr(exc)
        if self._errors.get(name) != text:
            log.exception("collector %s failed (logged once until it changes)", name)
            self._errors[name] = text

    # -- loops ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [
            asyncio.create_task(self._sample_loop(), name="sample"),
            asyncio.create_task(self._report_loop(), name="report"),
            asyncio.create_task(self.sender.run_findings(), name="send-findings"),
            asyncio.create_task(self.sender.run_metrics(), name="send-metrics"),
            asyncio.create_task(self.sender.run_events(), name="send-events"),
            *(
                asyncio.create_task(self._supervise(s), name=f"source-{s.name}")
                for s in self.sources
            ),
        ]
        self.sender.wake_findings()  # replay what an earlier run left in the spool
        self.sender.wake_metrics()
        self.sender.wake_events()
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for collector in self.collectors:
                with contextlib.suppress(Exception):
                    await collector.close()

    async def _sample_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.sample_once()
            except Exception:  # a detector or spool bug: log it, keep sampling
                log.exception("sample cycle failed")
            # Fixed cadence, not fixed gaps: a slow NVML read does not drift the samples.
            next_at = max(next_at + self._sample_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.status.report_interval_s)
            if self.latest:
                self.report_once()

    async def _supervise(self, source: EventSource) -> None:
        while True:
            try:
                await source.run(self.on_events)
                log.warning("event source %s ended; restarting", source.name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event source %s crashed; restarting", source.name)
            await asyncio.sleep(SOURCE_RESTART_S)


def gpu_sample(sample: Sample) -> GpuSample:
    """The wire form. The wire requires every reading, so an unsupported one is 0."""
    v = sample.values

    def get(name: str, lo: float, hi: float) -> float:
        return min(hi, max(lo, v.get(name, 0.0)))

    return GpuSample(
        index=sample.gpu_index or 0,
        uuid=sample.gpu_uuid or f"unknown-{sample.gpu_index}",
        serial=sample.serial,
        model=sample.model,
        utilization_pct=get("utilization_pct", 0, 100),
        memory_used_mib=get("memory_used_mib", 0, 10_000_000),
        memory_total_mib=get("memory_total_mib", 0, 10_000_000),
        temperature_c=get("temperature_c", -50, 200),
        power_w=get("power_w", 0, 10_000),
        sm_clock_mhz=get("sm_clock_mhz", 0, 10_000),
        ecc_sbe_volatile=int(get("ecc_sbe_volatile", 0, 2**53)),
        ecc_dbe_volatile=int(get("ecc_dbe_volatile", 0, 2**53)),
        ecc_sbe_aggregate=int(get("ecc_sbe_aggregate", 0, 2**53)),
        ecc_dbe_aggregate=int(get("ecc_dbe_aggregate", 0, 2**53)),
    )


def save_open_findings(
    path: Path, findings: list[FindingChange], *, unsent: list[str] | None = None
) -> None:
    """``{"open": [finding, ...], "unsent": [key, ...]}``: the open findings and the keys
    of those with folded repeats not yet sent (spooled by the next tick)."""
    data = {"open": [f.model_dump(mode="json") for f in findings], "unsent": unsent or []}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def load_open_findings(path: Path) -> tuple[list[FindingChange], list[str]]:
    """The open findings and the unsent keys; a bare list is the older format."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, list):
            data = {"open": data, "unsent": []}
        findings = [FindingChange.model_validate(item) for item in data["open"]]
        return findings, [str(key) for key in data.get("unsent", [])]
    except FileNotFoundError:
        return [], []
    except (ValueError, KeyError, TypeError):
        log.warning("%s is unreadable; starting with no open findings", path)
        return [], []
