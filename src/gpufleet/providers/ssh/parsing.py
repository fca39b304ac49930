"""Parsers of what the ssh provider reads on a host. Pure: no I/O."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from gpufleet.core.errors import DriverError


@dataclass(frozen=True, slots=True)
class BootProbe:
    boot_id: str  # the kernel's random id of this boot: it changes at every boot
    uptime_s: float


def parse_probe(text: str, *, host: str) -> BootProbe:
    """The output of ``PROBE_COMMAND``: a boot id line, then ``/proc/uptime``
    (``"350735.47 234388.90"``: seconds up, seconds idle summed over CPUs).

    Raises ``DriverError`` naming the host when the output is not that.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        boot_id = str(uuid.UUID(lines[0]))
        uptime_s = float(lines[1].split()[0])
    except (IndexError, ValueError):
        shown = text.strip()[:200] or "(no output)"
        raise DriverError(
            f"ssh: host {host}: unexpected boot id / uptime output: {shown!r}"
        ) from None
    if not (math.isfinite(uptime_s) and uptime_s >= 0):
        raise DriverError(f"ssh: host {host}: unexpected uptime {uptime_s}")
    return BootProbe(boot_id=boot_id, uptime_s=uptime_s)
