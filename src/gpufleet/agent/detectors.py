"""Turn observations into finding changes: fold repeats, clear with hysteresis. Pure.

Every input carries its time; the detector never reads a clock, so tests drive it with
a fake one. What it returns is what must reach the server (the spool gives each change
its ``seq``).

Folding: one finding per *key* = signature + where (PCI address, else GPU UUID, else
port, else the node). A repeat adds to ``count`` and moves ``last_seen``. Repeats of a
log event are sent at once unless the previous send of that finding was under
``fold_emit_interval_s`` ago (an Xid storm of thousands of lines would otherwise be
thousands of requests); :meth:`Detector.tick` sends the folded count after that. The
same Xid seen through NVML's event API and the kernel log within
``cross_source_window_s`` counts once.

Clearing follows the signature's ``clear`` rule in the catalog:

* ``samples`` — N evaluations in a row where the rule does not hold (hysteresis);
* ``quiet`` — no recurrence for ``quiet_s`` (log-only signatures such as most Xids:
  a log line has no "it went away" line, so silence is the only evidence);
* ``repair`` / ``manual`` — never cleared by the agent: the server clears them when a
  repair is verified or an operator acts. The agent forgets them locally after
  ``local_ttl_s`` without a recurrence, sending nothing, so a GPU swapped long ago does
  not fold new faults into an old finding.

Without a ``clear`` rule: events clear after 1 h quiet, conditions after 3 clean samples.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.agent.collectors.base import CollectorResult, Condition, Event, Sample
from gpufleet.agent.findings import FindingChange
from gpufleet.agent.rules import MetricTracker, StateTracker
from gpufleet.core.agent_protocol import FindingState
from gpufleet.core.enums import FindingSource, Severity, worse
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.matcher import Match
from gpufleet.core.signatures.models import (
    Catalog,
    ClearRule,
    KernelLogRule,
    MetricRule,
    Signature,
    StateRule,
)

_DEFAULT_EVENT_CLEAR = ClearRule(mode="quiet", quiet_s=3600)
_DEFAULT_CONDITION_CLEAR = ClearRule(mode="samples", samples=3)


@dataclass(slots=True)
class _Open:
    finding: FindingChange
    clear: ClearRule
    clean: int = 0  # evaluations in a row where the rule did not hold
    active: bool = True  # the rule held at the last evaluation
    last_emit_s: float = 0.0
    dirty: bool = False  # folded repeats not sent yet
    last_event_source: FindingSource | None = None


@dataclass(slots=True)
class _Where:
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    component: str | None = None

    def key(self, signature_id: str) -> str:
        return f"{signature_id}@{self.pci_bus_id or self.gpu_uuid or self.component or 'node'}"


@dataclass(slots=True)
class _Trackers:
    metric: dict[str, MetricTracker] = field(default_factory=dict)
    state: dict[str, StateTracker] = field(default_factory=dict)


class Detector:
    def __init__(
        self,
        catalog: Catalog | None = None,
        *,
        fold_emit_interval_s: float = 10.0,
        cross_source_window_s: float = 5.0,
        local_ttl_s: float = 86_400.0,
    ) -> None:
        self._catalog = catalog or get_catalog()
        self._fold_emit_s = fold_emit_interval_s
        self._cross_source_s = cross_source_window_s
        self._local_ttl_s = local_ttl_s
        self._metric_rules: dict[str, list[Signature]] = {"gpu": [], "node": [], "port": []}
        self._state_rules: dict[str, list[Signature]] = {}
        for sig in self._catalog.signatures:
            if isinstance(sig.match, MetricRule):
                self._metric_rules[sig.match.scope].append(sig)
            elif isinstance(sig.match, StateRule):
                self._state_rules.setdefault(sig.match.condition, []).append(sig)
        self._open: dict[str, _Open] = {}
        self._trackers = _Trackers()
        self._gpus_by_pci: dict[str, tuple[int | None, str | None]] = {}

    # -- inputs ---------------------------------------------------------------------

    def observe(self, result: CollectorResult, now: dt.datetime) -> list[FindingChange]:
        out: list[FindingChange] = []
        for sample in result.samples:
            self._learn(sample)
            out.extend(self._sample(sample, now))
        for cond in result.conditions:
            out.extend(self._condition(cond, now))
        out.extend(self.events(result.events, now))
        return out

    def events(self, events: Iterable[Event], now: dt.datetime) -> list[FindingChange]:
        out: list[FindingChange] = []
        for event in events:
            change = self._event(event, now)
            if change is not None:
                out.append(change)
        return out

    def tick(self, now: dt.datetime) -> list[FindingChange]:
        """Time passing: quiet clears, local expiry, folded repeats that waited."""
        t = now.timestamp()
        out: list[FindingChange] = []
        for key, entry in list(self._open.items()):
            since = t - entry.finding.last_seen.timestamp()
            clear = entry.clear
            if clear.mode == "quiet" and clear.quiet_s is not None and since >= clear.quiet_s:
                out.append(self._close(key, now))
            elif clear.mode in ("repair", "manual") and since >= self._local_ttl_s:
                del self._open[key]
            elif entry.dirty and t - entry.last_emit_s >= self._fold_emit_s:
                out.append(self._emit(entry, t))
        return out

    # -- state ---------------------------------------------------------------------

    def open_findings(self) -> list[FindingChange]:
        return [entry.finding for entry in self._open.values()]

    def unsent_keys(self) -> list[str]:
        """Open findings with folded repeats not sent yet (they wait for :meth:`tick`)."""
        return [key for key, entry in self._open.items() if entry.dirty]

    def restore(self, findings: Iterable[FindingChange], *, unsent: Iterable[str] = ()) -> None:
        """Reload the findings open before a restart, so they fold and clear as before.

        ``unsent``: keys whose folded repeats had not been sent when the agent stopped
        (their log lines are already behind the checkpoint); the next tick sends them."""
        waiting = set(unsent)
        for finding in findings:
            sig = self._catalog.get(finding.signature_id)
            if sig is not None:
                event = isinstance(sig.match, KernelLogRule)
                entry = _Open(finding, self._clear_rule(sig, event=event))
                entry.dirty = finding.key in waiting
                self._open[finding.key] = entry

    # -- internals -----------------------------------------------------------------

    def _learn(self, sample: Sample) -> None:
        if sample.scope == "gpu" and sample.pci_bus_id:
            self._gpus_by_pci[sample.pci_bus_id] = (sample.gpu_index, sample.gpu_uuid)

    def _sample(self, sample: Sample, now: dt.datetime) -> list[FindingChange]:
        where = _Where(sample.gpu_index, sample.gpu_uuid, sample.pci_bus_id, sample.component)
        out: list[FindingChange] = []
        t = now.timestamp()
        for sig in self._metric_rules[sample.scope]:
            assert isinstance(sig.match, MetricRule)
            key = where.key(sig.id)
            tracker = self._trackers.metric.get(key)
            if tracker is None:
                tracker = self._trackers.metric[key] = MetricTracker(sig.match)
            verdict = tracker.evaluate(sample.values, t)
            if verdict is not None:
                out.extend(self._evaluated(sig, where, verdict, now))
        return out

    def _condition(self, cond: Condition, now: dt.datetime) -> list[FindingChange]:
        where = _Where(cond.gpu_index, cond.gpu_uuid, cond.pci_bus_id, cond.component)
        out: list[FindingChange] = []
        for sig in self._state_rules.get(cond.condition, ()):
            assert isinstance(sig.match, StateRule)
            key = where.key(sig.id)
            tracker = self._trackers.state.get(key)
            if tracker is None:
                tracker = self._trackers.state[key] = StateTracker(sig.match)
            verdict = tracker.evaluate(cond, now.timestamp())
            out.extend(self._evaluated(sig, where, verdict, now))
        return out

    def _evaluated(
        self, sig: Signature, where: _Where, verdict: tuple[bool, str], now: dt.datetime
    ) -> list[FindingChange]:
        active, evidence = verdict
        key = where.key(sig.id)
        entry = self._open.get(key)
        t = now.timestamp()
        if entry is None:
            if not active:
                return []
            finding = _new(sig, key, where, sig.source, evidence, now=now, severity=sig.severity)
            entry = self._open[key] = _Open(finding, self._clear_rule(sig, event=False))
            return [self._emit(entry, t)]
        if active:
            recurred = not entry.active
            entry.active, entry.clean = True, 0
            # A condition that holds on is one occurrence; it counts again only after it
            # went away and came back. last_seen moves locally and is sent with the clear.
            count = entry.finding.count + (1 if recurred else 0)
            entry.finding = entry.finding.model_copy(
                update={"last_seen": now, "count": count, "evidence": evidence}
            )
            if recurred:
                return [self._emit(entry, t)]
            return []
        entry.active = False
        entry.clean += 1
        clear = entry.clear
        if clear.mode == "samples" and clear.samples is not None and entry.clean >= clear.samples:
            return [self._close(key, now, evidence=evidence)]
        return []

    def _event(self, event: Event, now: dt.datetime) -> FindingChange | None:
        sig = self._catalog.get(event.signature_id)
        if sig is None:
            return None
        where = _Where(event.gpu_index, event.gpu_uuid, event.pci_bus_id, event.component)
        if where.pci_bus_id and where.pci_bus_id in self._gpus_by_pci:
            index, uuid = self._gpus_by_pci[where.pci_bus_id]
            where.gpu_index = where.gpu_index if where.gpu_index is not None else index
            where.gpu_uuid = where.gpu_uuid or uuid
        key = where.key(sig.id)
        severity = event.severity or sig.severity
        t = now.timestamp()
        entry = self._open.get(key)
        if entry is None:
            finding = _new(
                sig, key, where, event.source, event.evidence, now=event.at, severity=severity
            )
            entry = self._open[key] = _Open(finding, self._clear_rule(sig, event=True))
            entry.last_event_source = event.source
            return self._emit(entry, t)
        old = entry.finding
        same_fault = (
            entry.last_event_source is not None
            and entry.last_event_source is not event.source
            and (event.at - old.last_seen).total_seconds() <= self._cross_source_s
        )
        update: dict[str, object] = {
            "last_seen": max(old.last_seen, event.at),
            "severity": worse(old.severity, severity),
        }
        if not same_fault:
            update["count"] = old.count + 1
        if event.source is FindingSource.KERNEL_LOG or not same_fault:
            # The log line says more than an NVML event number: prefer it as evidence.
            update["evidence"] = event.evidence
        entry.finding = old.model_copy(update=update)
        entry.last_event_source = event.source
        if t - entry.last_emit_s >= self._fold_emit_s:
            return self._emit(entry, t)
        entry.dirty = True
        return None

    def _emit(self, entry: _Open, t: float) -> FindingChange:
        entry.last_emit_s, entry.dirty = t, False
        return entry.finding

    def _close(self, key: str, now: dt.datetime, *, evidence: str | None = None) -> FindingChange:
        entry = self._open.pop(key)
        update: dict[str, object] = {"state": FindingState.CLEARED}
        if evidence:
            update["evidence"] = f"cleared: {evidence}"
        del now  # the clear keeps last_seen: when the fault was last observed
        return entry.finding.model_copy(update=update)

    @staticmethod
    def _clear_rule(sig: Signature, *, event: bool) -> ClearRule:
        if sig.clear is not None:
            return sig.clear
        return _DEFAULT_EVENT_CLEAR if event else _DEFAULT_CONDITION_CLEAR


def _new(
    sig: Signature,
    key: str,
    where: _Where,
    source: FindingSource,
    evidence: str,
    *,
    now: dt.datetime,
    severity: Severity,
) -> FindingChange:
    return FindingChange(
        key=key,
        signature_id=sig.id,
        state=FindingState.OPEN,
        severity=severity,
        source=source,
        title=sig.title[:200],
        gpu_uuid=where.gpu_uuid,
        gpu_index=where.gpu_index,
        pci_bus_id=where.pci_bus_id,
        component=where.component,
        evidence=evidence[:4000],
        count=1,
        first_seen=now,
        last_seen=now,
    )


def event_from_match(match: Match, *, at: dt.datetime) -> Event:
    """A kernel-log match as a detector event. ``at``: when the agent read the line."""
    return Event(
        signature_id=match.signature,
        at=at,
        source=FindingSource.KERNEL_LOG,
        evidence=match.line[:4000],
        severity=match.severity,
        action=match.action,
        xid=match.xid,
        gpu_index=match.gpu_index,
        gpu_uuid=match.gpu_uuid,
        pci_bus_id=match.pci,
    )


def count_open(findings: Iterable[FindingChange]) -> Mapping[tuple[str, str], int]:
    """Open findings by (signature, severity), for the exporter."""
    counts: dict[tuple[str, str], int] = {}
    for f in findings:
        k = (f.signature_id, f.severity.value)
        counts[k] = counts.get(k, 0) + 1
    return counts
