"""Faults in the simulated fleet: what they are, how often they happen, what they do.

A fault belongs to one machine (and optionally one GPU of it). It is drawn in the
background at a rate per GPU-day, or injected by hand (``gpufleet inject``). Two kinds:

- *log-style* faults (an Xid, a DBE, a lost GPU) stay until the machine is rebooted,
  reinstalled or replaced through the provider (or its GPU reset), as on real hardware;
- *transient* ones (thermal slowdown, a flapping link) clear by themselves after a
  drawn duration.

Either kind may be *sticky*: hardware that stays bad. A sticky fault never clears by
itself and survives a reboot, a reinstall and a GPU reset: it stays open, and once the
machine (or GPU) is back its log line recurs (``recur``: count + 1, last seen then) a
drawn ``FaultConfig.sticky_recur_s`` later, then every ``sticky_repeat_s`` for
``sticky_repeat_for_s``, so the agent reports it again after the repair whenever the
repair's verification looks. Only a new host (replace, terminate) gets rid of it.

The default rate and mix come from ``performance-anchors.md`` §1.4: about 0.5 unexpected
node-affecting failures per 1,000 GPU-days (Llama 3: 0.47), split by the Llama 3 Table 5
interruption *counts* (not its percentages, which do not add up), each category mapped
to a catalog signature a passive check would raise. Categories no passive check can see
(silent data corruption, SSD, CPU, system memory, software dependencies) are left out
and the rest renormalised, so the configured rate is the rate of *visible* faults.

Pure: no I/O, no clock; the world passes ``now`` and its random stream in.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.core.agent_protocol import GpuSample
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.core.signatures.models import KernelLogRule, MetricRule, Signature

# ~0.5 per 1,000 GPU-days: performance-anchors §1.4 (Llama 3 0.47; RSC-2 0.29, RSC-1 0.81).
DEFAULT_RATE_PER_GPU_DAY = 0.0005
# Faults a machine keeps: a bound on the state file and on what an agent must resend.
MAX_ACTIVE_FAULTS = 32
MAX_CLEARED_FAULTS = 8

# Effects on telemetry, by signature.
OFF_THE_BUS = frozenset({"xid-79", "gpu-fallen-off-bus", "gpu-lost", "gpu-missing"})
THERMAL = frozenset({"thermal-slowdown", "hw-slowdown", "sw-thermal-slowdown"})
DBE = frozenset({"xid-48", "xid-94", "xid-95", "xid-140", "xid-171", "ecc-dbe"})
# How long a transient fault lasts when injected or drawn, seconds.
TRANSIENT_S: dict[str, tuple[float, float]] = {
    **dict.fromkeys(THERMAL, (120.0, 900.0)),
    "power-brake": (60.0, 600.0),
    "ib-link-down": (300.0, 3600.0),  # a reseated cable or a switch coming back
    "ib-link-flap": (300.0, 1800.0),
    "slurm-unexpected-reboot": (600.0, 1800.0),
    "xid-31": (600.0, 1800.0),  # application faults clear once they stop repeating
}
_NODE_CATEGORIES = frozenset({"infiniband", "scheduler", "nvswitch"})
# HGX H100 GPU bus numbers, slot by slot; the sim reuses them for any part.
_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


@dataclass(frozen=True, slots=True)
class MixEntry:
    category: str  # the Llama 3 Table 5 component
    count: int  # its interruption count in Table 5
    signature_id: str


# Llama 3 Table 5 counts (arXiv:2407.21783 §3.3.4), mapped to catalog ids.
LLAMA3_MIX: tuple[MixEntry, ...] = (
    MixEntry("Faulty GPU", 88, "xid-79"),
    MixEntry("Faulty GPU", 60, "xid-119"),
    MixEntry("GPU HBM3 Memory", 36, "xid-48"),
    MixEntry("GPU HBM3 Memory", 18, "xid-94"),
    MixEntry("GPU HBM3 Memory", 18, "row-remap-failure"),
    MixEntry("Software Bug", 54, "xid-31"),
    MixEntry("Network Switch/Cable", 35, "ib-link-down"),
    MixEntry("Host Maintenance", 32, "slurm-unexpected-reboot"),
    MixEntry("GPU SRAM Memory", 19, "xid-95"),
    MixEntry("GPU System Processor", 17, "xid-120"),
    MixEntry("NIC", 7, "ib-link-down"),
    MixEntry("NCCL Watchdog Timeouts", 7, "xid-74"),
    MixEntry("GPU Thermal Interface + Sensor", 6, "thermal-slowdown"),
    MixEntry("Power Supply", 3, "power-brake"),
    MixEntry("IO Expansion Board", 2, "pcie-aer-uncorrected"),
)


@dataclass(frozen=True, slots=True)
class SimFault:
    """One fault on one machine. ``gpu_index`` is None for a node-wide fault."""

    fault_id: str
    instance_id: str
    signature_id: str
    gpu_index: int | None
    started_at: dt.datetime
    last_seen: dt.datetime
    count: int = 1  # the same fault seen again (a repeated inject) folds into this one
    clears_at: dt.datetime | None = None  # transient: clears by itself then
    cleared_at: dt.datetime | None = None
    origin: str = "injected"  # or "background"
    sticky: bool = False  # bad hardware: survives restarts, recurs after each (see above)
    recurs_at: dt.datetime | None = None  # sticky, after a restart: its line shows again then
    recur_until: dt.datetime | None = None  # ... and keeps showing until then

    @property
    def active(self) -> bool:
        return self.cleared_at is None

    def to_json(self) -> list[Any]:
        return [
            self.fault_id,
            self.signature_id,
            self.gpu_index,
            self.started_at.isoformat(),
            self.last_seen.isoformat(),
            self.count,
            None if self.clears_at is None else self.clears_at.isoformat(),
            None if self.cleared_at is None else self.cleared_at.isoformat(),
            self.origin,
            self.sticky,
            None if self.recurs_at is None else self.recurs_at.isoformat(),
            None if self.recur_until is None else self.recur_until.isoformat(),
        ]

    @classmethod
    def from_json(cls, instance_id: str, raw: list[Any]) -> SimFault:
        def ts(value: Any) -> dt.datetime | None:
            return None if value is None else dt.datetime.fromisoformat(str(value))

        return cls(
            fault_id=str(raw[0]),
            instance_id=instance_id,
            signature_id=str(raw[1]),
            gpu_index=None if raw[2] is None else int(raw[2]),
            started_at=dt.datetime.fromisoformat(str(raw[3])),
            last_seen=dt.datetime.fromisoformat(str(raw[4])),
            count=int(raw[5]),
            clears_at=ts(raw[6]),
            cleared_at=ts(raw[7]),
            origin=str(raw[8]),
            # Files written before sticky faults existed have 9 fields: none is sticky.
            sticky=bool(raw[9]) if len(raw) > 9 else False,
            recurs_at=ts(raw[10]) if len(raw) > 10 else None,
            recur_until=ts(raw[11]) if len(raw) > 11 else None,
        )


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """``rate_per_gpu_day``: background faults per GPU per day (0 turns them off).

    ``sticky_share``: the share of drawn log-style (not transient) faults that are sticky,
    0..1. 0 by default, so a repair always fixes a background fault; a demo raises it to
    show repairs that do not help and escalate.

    After a restart (boot done, GPU reset done) a sticky fault's line recurs first after
    ``sticky_recur_s`` (``(low, high)`` seconds: the driver loading, the first job
    touching the part), then every ``sticky_repeat_s`` seconds (0: once) until
    ``sticky_repeat_for_s`` after the restart. The repeats are what make a repair's
    verification see it whatever its timing: the simulator cannot know when the
    control plane noticed the machine back, and a line from before that moment does not
    count as "seen again". 5 s repeats for 2 minutes cover a verification that settles
    in a few seconds (tests) as well as the default 30 s, for at most 24 finding changes
    per restart.
    """

    rate_per_gpu_day: float = DEFAULT_RATE_PER_GPU_DAY
    mix: tuple[MixEntry, ...] = LLAMA3_MIX
    sticky_share: float = 0.0
    sticky_recur_s: tuple[float, float] = (2.0, 5.0)
    sticky_repeat_s: float = 5.0
    sticky_repeat_for_s: float = 120.0

    def __post_init__(self) -> None:
        if self.rate_per_gpu_day < 0:
            raise ValueError(f"rate_per_gpu_day must be >= 0, got {self.rate_per_gpu_day}")
        if not 0.0 <= self.sticky_share <= 1.0:
            raise ValueError(f"sticky_share must be within 0..1, got {self.sticky_share}")
        low, high = self.sticky_recur_s
        if not 0 <= low <= high:
            raise ValueError(f"sticky_recur_s must be 0 <= low <= high, got {(low, high)}")
        for name in ("sticky_repeat_s", "sticky_repeat_for_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def signature_or_error(signature_id: str) -> Signature:
    """The catalog entry; ``ValueError`` naming the id if the catalog has none."""
    signature = get_signature(signature_id)
    if signature is None:
        raise ValueError(f"unknown signature {signature_id!r}: not in the signature catalog")
    return signature


def is_gpu_scoped(signature: Signature) -> bool:
    """Whether the signature names one GPU (an Xid, an NVML reading) or the whole node."""
    if signature.category in _NODE_CATEGORIES or signature.id in ("gpu-missing",):
        return False
    rule = signature.match
    if isinstance(rule, MetricRule):
        return rule.scope == "gpu"
    return signature.source.value in ("kernel-log", "nvml")


def draw_clears_at(
    signature_id: str, *, now: dt.datetime, rng: random.Random
) -> dt.datetime | None:
    span = TRANSIENT_S.get(signature_id)
    if span is None:
        return None
    return now + dt.timedelta(seconds=rng.uniform(*span))


def expire(faults: Sequence[SimFault], *, now: dt.datetime) -> list[SimFault] | None:
    """Transient faults whose time is up become cleared. None when nothing changed."""
    if not any(f.active and f.clears_at is not None and f.clears_at <= now for f in faults):
        return None
    return trim(
        [
            replace(f, cleared_at=f.clears_at)
            if f.active and f.clears_at is not None and f.clears_at <= now
            else f
            for f in faults
        ]
    )


def clear_all(faults: Sequence[SimFault], *, now: dt.datetime) -> list[SimFault] | None:
    """Clear every open fault, sticky ones too. None when none was open."""
    if not any(f.active for f in faults):
        return None
    return trim([replace(f, cleared_at=now) if f.active else f for f in faults])


def restart(
    faults: Sequence[SimFault],
    *,
    now: dt.datetime,
    back_at: dt.datetime,
    config: FaultConfig,
    rng: random.Random,
    gpus: frozenset[int] | None = None,
) -> list[SimFault] | None:
    """A reboot, reinstall (``gpus`` None: every fault) or GPU reset (the faults on
    ``gpus``; node-wide ones stay). Non-sticky faults clear ``now``; sticky ones stay open
    and recur after ``back_at`` (when the machine or GPU is back) as ``config`` says.
    None when nothing changed."""
    out: list[SimFault] = []
    changed = False
    until = back_at + dt.timedelta(seconds=config.sticky_repeat_for_s)
    for fault in faults:
        hit = fault.active and (gpus is None or fault.gpu_index in gpus)
        if hit and fault.sticky:
            at = back_at + dt.timedelta(seconds=rng.uniform(*config.sticky_recur_s))
            fault = replace(fault, recurs_at=at, recur_until=until)
        elif hit:
            fault = replace(fault, cleared_at=now)
        changed = changed or hit
        out.append(fault)
    return trim(out) if changed else None


def recur(
    faults: Sequence[SimFault], *, now: dt.datetime, repeat_s: float
) -> list[SimFault] | None:
    """Sticky faults whose recurrence is due show again, as a repeated log line folds:
    count + 1 per line due by ``now`` (one at ``recurs_at``, then every ``repeat_s`` up
    to ``recur_until``), last seen at the latest. None when none was due."""
    out: list[SimFault] = []
    changed = False
    for fault in faults:
        first = fault.recurs_at
        if not fault.active or first is None or first > now:
            out.append(fault)
            continue
        step = dt.timedelta(seconds=repeat_s)
        until = fault.recur_until
        lines = 1
        if repeat_s > 0 and until is not None and until > first:
            lines += int((min(now, until) - first) / step)
        last = first + step * (lines - 1)
        following = last + step
        keep_on = repeat_s > 0 and until is not None and following <= until
        out.append(
            replace(
                fault,
                count=fault.count + lines,
                last_seen=last,
                recurs_at=following if keep_on else None,
                recur_until=until if keep_on else None,
            )
        )
        changed = True
    return out if changed else None


def trim(faults: list[SimFault]) -> list[SimFault]:
    """Keep the active faults and the newest few cleared ones (the agent's clear needs them
    only until it is sent; the bound keeps the state file small)."""
    cleared = [f for f in faults if not f.active][-MAX_CLEARED_FAULTS:]
    keep = {f.fault_id for f in cleared}
    return [f for f in faults if f.active or f.fault_id in keep]


def poisson(lam: float, rng: random.Random) -> int:
    """A Poisson draw (a normal one past lam 30)."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


@dataclass(frozen=True, slots=True)
class DrawnFault:
    instance_id: str
    signature_id: str
    gpu_index: int | None
    sticky: bool = False


class FaultModel:
    """Background faults: a Poisson process per machine, rate × GPUs × elapsed days."""

    def __init__(self, config: FaultConfig | None = None) -> None:
        self.config = config or FaultConfig()
        self.drawn_at: dt.datetime | None = None  # exposure before this is already drawn
        self._weights = [float(e.count) for e in self.config.mix]

    def draw(
        self, *, now: dt.datetime, rng: random.Random, machines: Iterable[tuple[str, int]]
    ) -> list[DrawnFault]:
        """Faults since the last draw on running ``(instance_id, gpu_count)`` machines."""
        last, self.drawn_at = self.drawn_at, now
        rate = self.config.rate_per_gpu_day
        if last is None or now <= last or rate <= 0 or not self.config.mix:
            return []
        days = (now - last).total_seconds() / 86400.0
        out: list[DrawnFault] = []
        for instance_id, gpus in machines:
            for _ in range(poisson(rate * gpus * days, rng)):
                entry = rng.choices(self.config.mix, weights=self._weights)[0]
                signature = signature_or_error(entry.signature_id)
                gpu = rng.randrange(gpus) if is_gpu_scoped(signature) and gpus else None
                # Draw only when asked for, so a share of 0 keeps the stream of old seeds.
                share = self.config.sticky_share
                sticky = (
                    share > 0 and entry.signature_id not in TRANSIENT_S and rng.random() < share
                )
                out.append(DrawnFault(instance_id, entry.signature_id, gpu, sticky))
        return out


# -- effects on telemetry --------------------------------------------------------------


def apply_effects(samples: list[GpuSample], faults: Sequence[SimFault]) -> list[GpuSample]:
    """The GPU samples as a faulty machine reports them.

    A GPU off the bus is missing from the report (8 GPUs → 7); thermal slowdown heats the
    part and halves its SM clock; a double-bit ECC fault raises the DBE counters.
    """
    active = [f for f in faults if f.active]
    if not active:
        return samples
    out: list[GpuSample] = []
    for sample in samples:
        mine = [f for f in active if f.gpu_index in (sample.index, None)]
        sigs = {f.signature_id for f in mine if f.gpu_index == sample.index}
        if sigs & OFF_THE_BUS:
            continue
        update: dict[str, float | int] = {}
        if sigs & THERMAL:
            update["temperature_c"] = max(sample.temperature_c, 89.0) + (sample.index % 3)
            update["sm_clock_mhz"] = round(sample.sm_clock_mhz * 0.5)
        dbe = sum(f.count for f in mine if f.signature_id in DBE and f.gpu_index == sample.index)
        if dbe:
            update["ecc_dbe_volatile"] = sample.ecc_dbe_volatile + dbe
            update["ecc_dbe_aggregate"] = sample.ecc_dbe_aggregate + dbe
        out.append(sample.model_copy(update=update) if update else sample)
    return out


# -- what the node's logs say ----------------------------------------------------------


def pci_bus_id(gpu_index: int) -> str:
    """The GPU's PCI address, ``0000:18:00.0`` style."""
    bus = _PCI_BUSES[gpu_index] if gpu_index < len(_PCI_BUSES) else f"{0xE0 + gpu_index:02x}"
    return f"0000:{bus}:00.0"


def hca_index(fault: SimFault, *, nics: int) -> int:
    """The HCA (``mlx5_<n>``, of ``nics``) a fabric fault hits: drawn from its id, so the
    port telemetry, the finding and the simulated ``ib_write_bw`` all name the same one."""
    return hashlib.sha256(fault.fault_id.encode()).digest()[0] % nics


def kernel_log_message(
    signature: Signature, *, gpu_index: int | None, pid: int = 1, hca: int = 0
) -> str:
    """The line a node's log (kernel log, or the agent's NVML/IB view) shows for it;
    ``hca``: the HCA a fabric fault hit."""
    gpu = 0 if gpu_index is None else gpu_index
    pci = pci_bus_id(gpu)[:-2]  # the driver prints domain:bus:device, no function
    rule = signature.match
    xid = rule.codes[0] if isinstance(rule, KernelLogRule) and rule.codes else None
    if signature.id in ("xid-79", "gpu-fallen-off-bus"):
        return f"NVRM: Xid (PCI:{pci}): 79, pid={pid}, GPU has fallen off the bus."
    if xid is not None:
        return f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name=python3, {signature.title}."
    if signature.id in THERMAL:
        return f"nvml: GPU {gpu} ({pci}): clocks_event_reasons=0x40 (HW thermal slowdown), 91 C"
    if signature.id in DBE:
        return f"nvml: GPU {gpu} ({pci}): ecc_dbe_volatile increased by 1"
    if signature.category == "infiniband":
        return f"mlx5_core 0000:0c:00.0: mlx5_{hca}/1: Link down (phys_state Disabled)"
    where = f"GPU {gpu} ({pci})" if gpu_index is not None else "node"
    return f"{signature.source.value}: {where}: {signature.title}"


def kernel_log_line(
    signature: Signature, *, gpu_index: int | None, uptime_s: float, pid: int = 1
) -> str:
    """A ``dmesg``-format line (``[  123.456789] NVRM: ...``) for a followed log file."""
    return f"[{uptime_s:12.6f}] " + kernel_log_message(signature, gpu_index=gpu_index, pid=pid)


def add_fault(
    faults: Sequence[SimFault],
    *,
    instance_id: str,
    signature_id: str,
    gpu_index: int | None,
    now: dt.datetime,
    rng: random.Random,
    origin: str,
    sticky: bool = False,
) -> tuple[list[SimFault], SimFault]:
    """The machine's faults with one more. The same signature on the same GPU, still
    open, folds into that fault (count and last-seen grow), as a repeated log line would;
    a sticky repeat makes it sticky. A sticky fault never clears by itself."""
    for i, fault in enumerate(faults):
        if fault.active and (fault.signature_id, fault.gpu_index) == (signature_id, gpu_index):
            folded = replace(
                fault,
                count=fault.count + 1,
                last_seen=now,
                sticky=fault.sticky or sticky,
                clears_at=None if sticky else fault.clears_at,
            )
            return [*faults[:i], folded, *faults[i + 1 :]], folded
    if sum(1 for f in faults if f.active) >= MAX_ACTIVE_FAULTS:
        raise ValueError(f"machine {instance_id} already has {MAX_ACTIVE_FAULTS} open faults")
    fault = SimFault(
        fault_id=f"f-{rng.getrandbits(48):012x}",
        instance_id=instance_id,
        signature_id=signature_id,
        gpu_index=gpu_index,
        started_at=now,
        last_seen=now,
        clears_at=None if sticky else draw_clears_at(signature_id, now=now, rng=rng),
        origin=origin,
        sticky=sticky,
    )
    return trim([*faults, fault]), fault


def clear_matching(
    faults: Sequence[SimFault], *, signature_id: str, gpu_index: int | None, now: dt.datetime
) -> tuple[list[SimFault], list[SimFault]]:
    """Clear the open faults of ``signature_id`` (on ``gpu_index``, or on any GPU if None).
    Returns the new list and the faults cleared."""
    cleared: list[SimFault] = []
    out: list[SimFault] = []
    for fault in faults:
        hit = fault.active and fault.signature_id == signature_id
        if hit and (gpu_index is None or fault.gpu_index == gpu_index):
            fault = replace(fault, cleared_at=now)
            cleared.append(fault)
        out.append(fault)
    return (trim(out) if cleared else out), cleared
