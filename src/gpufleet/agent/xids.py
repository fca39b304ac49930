"""Xid events counted per GPU and Xid code, for ``gpufleet_gpu_xid_errors_total``.

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is a gauge of the *last* Xid, so two Xid 79s
in a row look like one and an Xid 13 hides an earlier Xid 48; ``increase()`` over a
counter per code does not. Every Xid event the agent learns of counts — kernel-log lines
and NVML events, whether or not the catalog knows the code — except that a report of
the same Xid on the same GPU from the other source within ``cross_source_window_s``
pairs with one already counted (each report pairs once, so two Xids a second apart,
each seen by both sources, count 2). Counts start at 0 when the agent starts (a
Prometheus counter reset).

A GPU is keyed by its PCI address when known (kernel-log lines carry only that), else
by UUID, else by index; what the GPU samples taught maps one to the other. A report
that names no GPU at all (a saved log's Xid line with its address redacted) counts for
the node, and pairs with the other source's report of the same Xid on any GPU.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.agent.collectors.base import Event, Sample
from gpufleet.core.enums import FindingSource


@dataclass(frozen=True, slots=True)
class XidCount:
    xid: int
    count: int
    pci_bus_id: str | None
    gpu_uuid: str | None
    gpu_index: int | None


class XidCounter:
    def __init__(self, *, cross_source_window_s: float = 5.0) -> None:
        self._window_s = cross_source_window_s
        self._counts: dict[tuple[str, int], int] = {}
        self._where: dict[str, tuple[str | None, str | None, int | None]] = {}
        # occurrences counted from one source that no report from another source has
        # matched yet: a report from the other source within the window pairs with one
        self._unmatched: dict[tuple[str, int], list[tuple[FindingSource, dt.datetime]]] = {}
        self._pci_by_uuid: dict[str, str] = {}
        self._pci_by_index: dict[int, str] = {}

    def learn(self, samples: Iterable[Sample]) -> None:
        for s in samples:
            if s.scope == "gpu" and s.pci_bus_id:
                if s.gpu_uuid:
                    self._pci_by_uuid[s.gpu_uuid] = s.pci_bus_id
                if s.gpu_index is not None:
                    self._pci_by_index[s.gpu_index] = s.pci_bus_id

    def observe(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.xid is not None:
                self._one(event, event.xid)

    def counts(self) -> list[XidCount]:
        out = []
        for (key, xid), n in sorted(self._counts.items()):
            pci, uuid, index = self._where[key]
            out.append(XidCount(xid, n, pci, uuid, index))
        return out

    def _one(self, event: Event, xid: int) -> None:
        pci = event.pci_bus_id
        if pci is None and event.gpu_uuid:
            pci = self._pci_by_uuid.get(event.gpu_uuid)
        if pci is None and event.gpu_index is not None:
            pci = self._pci_by_index.get(event.gpu_index)
        if pci:
            key = f"pci:{pci}"
        elif event.gpu_uuid:
            key = f"uuid:{event.gpu_uuid}"
        elif event.gpu_index is not None:
            key = f"index:{event.gpu_index}"
        else:
            key = "node"
        # what each report says of the GPU, paired or not
        known = self._where.get(key, (None, None, None))
        self._where[key] = (
            pci or known[0],
            event.gpu_uuid or known[1],
            event.gpu_index if event.gpu_index is not None else known[2],
        )
        # A report that names no GPU (a kernel-log line whose address was redacted or cut)
        # pairs with the other source's report of the same Xid on any GPU, and a report
        # that names one pairs with the other source's GPU-less report.
        if key == "node":
            keys = [key, *(k for k, x in self._unmatched if x == xid and k != key)]
        else:
            keys = [key, "node"]
        for k in keys:
            if self._pair(k, xid, event):
                return
        pending = self._unmatched.get((key, xid), [])
        pending.append((event.source, event.at))
        self._unmatched[(key, xid)] = pending
        self._counts[(key, xid)] = self._counts.get((key, xid), 0) + 1

    def _pair(self, key: str, xid: int, event: Event) -> bool:
        """Pair ``event`` with the other source's report of a counted occurrence, if one
        within the window waits under ``key``; reports out of the window are dropped."""
        pending = [
            (source, at)
            for source, at in self._unmatched.get((key, xid), [])
            if abs((event.at - at).total_seconds()) <= self._window_s
        ]
        match = next((p for p in pending if p[0] is not event.source), None)
        if match is not None:
            pending.remove(match)
        if pending or (key, xid) in self._unmatched:
            self._unmatched[(key, xid)] = pending
        return match is not None
