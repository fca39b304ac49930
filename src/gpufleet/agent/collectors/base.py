"""What a collector is, and what it hands the detectors.

A collector reads one source (NVML, the kernel log, sysfs, Slurm) and returns plain
values; it never decides what is a failure. The detectors do that from the catalog, so
a threshold lives in one place (``core/signatures/catalog.toml``) and collectors stay
small and easy to fake.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpufleet.core.enums import FindingSource, RepairAction, Severity

Scope = Literal["gpu", "node", "port"]


@dataclass(frozen=True, slots=True)
class Sample:
    """Readings of one GPU, one port or the node at one instant.

    ``values`` uses the catalog's metric field names (``METRIC_FIELDS``) plus the
    telemetry the wire and the exporter need (``utilization_pct``, ``temperature_c``,
    ``power_w``, ``sm_clock_mhz``, ``memory_used_mib``, ``memory_total_mib``, ...). A
    field the hardware does not support is absent, never zero.
    """

    scope: Scope
    values: Mapping[str, float]
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None  # normalised "0000:3b:00.0"
    component: str | None = None  # "mlx5_0/1" for a port
    serial: str | None = None
    model: str | None = None
    minor_number: int | None = None  # /dev/nvidia<N>: dcgm-exporter's `device` label


@dataclass(frozen=True, slots=True)
class Condition:
    """A named state (a catalog ``StateRule.condition``) that holds or not right now.

    Collectors report a condition every cycle they can observe it, active or not, so
    the detectors can count clean samples and clear with hysteresis. ``attrs`` carries
    what a rule's params test (e.g. the Slurm ``state`` and ``reason``).
    """

    condition: str
    active: bool
    evidence: str = ""
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    component: str | None = None
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened once (a kernel-log match, an NVML Xid event)."""

    signature_id: str
    at: dt.datetime
    source: FindingSource
    evidence: str
    severity: Severity | None = None  # None: the catalog's
    action: RepairAction | None = None
    xid: int | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    component: str | None = None


@dataclass(slots=True)
class CollectorResult:
    samples: list[Sample] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def extend(self, other: CollectorResult) -> None:
        self.samples.extend(other.samples)
        self.conditions.extend(other.conditions)
        self.events.extend(other.events)


class Collector(Protocol):
    """One source of observations, sampled by the agent's loop.

    ``collect`` must not block the event loop for long: slow or blocking reads (NVML,
    subprocesses) run in a thread. It may raise; the loop logs it and goes on, so one
    broken source never stops the others. ``close`` releases handles and threads.
    """

    name: str

    async def collect(self, now: dt.datetime) -> CollectorResult: ...

    async def close(self) -> None: ...


class EventSource(Protocol):
    """A collector that also pushes events as they happen (kernel log, NVML events).

    ``run`` loops until cancelled, calling ``emit`` for each batch of events, so a
    finding leaves the node within a second of the line being written.
    """

    name: str

    async def run(self, emit: EmitEvents) -> None: ...


class EmitEvents(Protocol):
    async def __call__(self, events: list[Event]) -> None: ...
