"""InfiniBand / RoCE ports from sysfs: state, rate and error counters.

Reads ``<root>/<device>/ports/<n>/{state,phys_state,rate,counters/*}`` (failure
signatures §5). Counters are lifetime values that persist until a reboot or
``perfquery -R``; the detectors' delta rules want increases, so this collector reports
the raw counters (``ib_link_downed`` ...) and also the increase since its previous
sample (``ib_link_downed_delta``, for the exporter and for humans). A counter that went
down was reset or wrapped (32-bit ``port_rcv_errors`` on old HCAs): the delta is 0.

The expected rate of a port is the highest rate it has been seen at since the agent
started, or ``expected_gbps`` if set; a lower rate is a downgrade.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.collectors.base import CollectorResult, Sample

COUNTERS = {
    "link_downed": "ib_link_downed",
    "symbol_error": "ib_symbol_error",
    "port_rcv_errors": "ib_port_rcv_errors",
    "link_error_recovery": "ib_link_error_recovery",
}
_NUM = re.compile(r"^\s*(\d+)")
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def parse_state(text: str | None) -> int | None:
    """``"4: ACTIVE"`` → 4."""
    m = _NUM.match(text or "")
    return int(m[1]) if m else None


def parse_rate(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` → 400.0."""
    m = _RATE.match(text or "")
    return float(m[1]) if m else None


@dataclass
class InfinibandCollector:
    root: Path = Path("/sys/class/infiniband")
    exclude: tuple[str, ...] = ()
    expected_gbps: float | None = None
    name: str = "infiniband"
    _last: dict[str, dict[str, int]] = field(default_factory=dict)
    _best_rate: dict[str, float] = field(default_factory=dict)

    async def collect(self, now: dt.datetime) -> CollectorResult:
        # sysfs reads do not block on disk, but there can be hundreds of files.
        return await asyncio.to_thread(self.collect_sync, now)

    def collect_sync(self, now: dt.datetime) -> CollectorResult:
        del now
        result = CollectorResult()
        if not self.root.is_dir():
            return result
        for port in sorted(self.root.glob("*/ports/*")):
            device = port.parent.parent.name
            if device in self.exclude:
                continue
            sample = self._port(f"{device}/{port.name}", port)
            if sample is not None:
                result.samples.append(sample)
        return result

    def _port(self, component: str, port: Path) -> Sample | None:
        values: dict[str, float] = {}
        state = parse_state(_read(port / "state"))
        phys = parse_state(_read(port / "phys_state"))
        if state is None and phys is None:
            return None
        if state is not None:
            values["ib_port_state"] = state
        if phys is not None:
            values["ib_phys_state"] = phys
        rate = parse_rate(_read(port / "rate"))
        if rate is not None:
            values["ib_rate_gbps"] = rate
            best = max(self._best_rate.get(component, 0.0), rate)
            self._best_rate[component] = best
            values["ib_rate_expected_gbps"] = self.expected_gbps or best
        previous = self._last.get(component, {})
        current: dict[str, int] = {}
        for filename, metric in COUNTERS.items():
            raw = _read(port / "counters" / filename)
            if raw is None or not raw.isdigit():
                continue
            value = int(raw)
            current[metric] = value
            values[metric] = value
            before = previous.get(metric)
            # A decrease is a reset or wrap: nothing new is known to have happened.
            values[f"{metric}_delta"] = 0 if before is None or value < before else value - before
        self._last[component] = current
        return Sample("port", values, component=component)

    async def close(self) -> None:
        return None
