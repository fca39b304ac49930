"""InfiniBand port model: what one simulated node's HCA ports read, sample after sample.
Pure.

Each node has ``NICS_PER_NODE`` compute-fabric HCAs (``mlx5_0`` ... ``mlx5_7``, one rail
per GPU as on an HGX H100), port 1 each, read as the agent reads sysfs
(``failure-signatures.md`` §5): ``state``, ``phys_state``, ``rate`` and lifetime
counters that only grow until the next boot. ``port_xmit_data`` / ``port_rcv_data``
count 4-octet words, as the kernel's do.

Traffic follows the node's jobs (``NodeLoad.ib_gbps``, per port and direction): a
multi-node training job moves hundreds of Gb/s per rail, a single-node job next to
nothing, an idle node only subnet-management packets. Faults on the node's fabric
override that where they apply, on the HCA the fault picked (``faults.hca_index``, the
same one the simulated ``ib_write_bw`` finds slow):

- ``ib-link-down`` / ``ib-kmsg-link-down``: the port is DOWN (phys_state Disabled) and
  moves nothing; ``link_downed`` counts the drop once;
- ``ib-port-init``: the link trained but no subnet manager configured it (INIT,
  LinkUp): no traffic;
- ``ib-link-flap``: ``link_downed`` and ``link_error_recovery`` grow every few minutes;
- ``ib-rate-downgrade``: the port trained at 200 Gb/s (2X), traffic capped there;
- ``ib-symbol-error-rate`` / ``ib-rcv-error-rate`` / ``ib-link-error-recovery``: the
  matching error counter grows at a rate the catalog's rule sees within its window.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpufleet.sim.faults import SimFault, hca_index, poisson

NICS_PER_NODE = 8
LINE_RATE_GBPS = 400.0
DOWNGRADED_RATE_GBPS = 200.0
# sysfs ``state`` and ``phys_state`` numbers.
STATE_DOWN, STATE_INIT, STATE_ACTIVE = 1, 2, 4
PHYS_DISABLED, PHYS_LINK_UP = 3, 5

_BYTES_PER_WORD = 4
_BULK_PACKET_BYTES = 4096  # NDR's 4 KiB MTU: bulk RDMA traffic fills it
_MAD_BYTES = 256  # subnet-management packets, the only traffic of an idle port
_MADS_PER_S = 0.5
_TRAFFIC_NOISE = 0.05

LINK_DOWN = frozenset({"ib-link-down", "ib-kmsg-link-down"})
PORT_INIT = frozenset({"ib-port-init"})
# Error counters a fault makes grow, per hour: above the catalog rules' thresholds
# (10 symbol or receive errors, 5 recoveries, 1 link drop per its window).
_ERROR_RATES_PER_H: dict[str, dict[str, float]] = {
    "ib-link-flap": {"link_downed": 20.0, "link_error_recovery": 20.0},
    "ib-symbol-error-rate": {"symbol_error": 60.0},
    "ib-rcv-error-rate": {"port_rcv_errors": 60.0},
    "ib-link-error-recovery": {"link_error_recovery": 20.0},
}


_ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors")


@dataclass(frozen=True, slots=True)
class IbPortTelemetry:
    """One HCA port's readings; counters as sysfs names them."""

    device: str  # mlx5_0
    port: int
    state: int
    phys_state: int
    rate_gbps: float
    port_xmit_data: int  # 4-octet words
    port_rcv_data: int
    port_xmit_packets: int
    port_rcv_packets: int
    link_downed: int = 0
    link_error_recovery: int = 0
    symbol_error: int = 0
    port_rcv_errors: int = 0

    @property
    def component(self) -> str:
        """``mlx5_0/1``: how findings and the agent name a port."""
        return f"{self.device}/{self.port}"

    @property
    def counters(self) -> dict[str, int]:
        """The ``counters/`` files of the port, by sysfs name."""
        return {
            "port_xmit_data": self.port_xmit_data,
            "port_rcv_data": self.port_rcv_data,
            "port_xmit_packets": self.port_xmit_packets,
            "port_rcv_packets": self.port_rcv_packets,
            "link_downed": self.link_downed,
            "link_error_recovery": self.link_error_recovery,
            "symbol_error": self.symbol_error,
            "port_rcv_errors": self.port_rcv_errors,
        }


def initial_ports(*, nics: int = NICS_PER_NODE) -> list[IbPortTelemetry]:
    """A freshly booted node's ports: active at line rate, counters at zero."""
    return [
        IbPortTelemetry(
            device=f"mlx5_{i}",
            port=1,
            state=STATE_ACTIVE,
            phys_state=PHYS_LINK_UP,
            rate_gbps=LINE_RATE_GBPS,
            port_xmit_data=0,
            port_rcv_data=0,
            port_xmit_packets=0,
            port_rcv_packets=0,
        )
        for i in range(nics)
    ]


def _faults_by_hca(faults: Sequence[SimFault], nics: int) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for fault in faults:
        if fault.active and fault.signature_id.startswith("ib-"):
            out.setdefault(hca_index(fault, nics=nics), set()).add(fault.signature_id)
    return out


def next_ports(
    previous: Sequence[IbPortTelemetry],
    *,
    gbps: float,
    faults: Sequence[SimFault] = (),
    elapsed_s: float,
    rng: random.Random,
) -> list[IbPortTelemetry]:
    """The ports ``elapsed_s`` after ``previous``, moving ``gbps`` per port and
    direction (the node's jobs' traffic), as the node's active ``faults`` allow."""
    elapsed = max(0.0, elapsed_s)
    hit = _faults_by_hca(faults, len(previous))
    out: list[IbPortTelemetry] = []
    for i, port in enumerate(previous):
        sigs = hit.get(i, set())
        if sigs & LINK_DOWN:
            state, phys = STATE_DOWN, PHYS_DISABLED
        elif sigs & PORT_INIT:
            state, phys = STATE_INIT, PHYS_LINK_UP
        else:
            state, phys = STATE_ACTIVE, PHYS_LINK_UP
        rate = DOWNGRADED_RATE_GBPS if "ib-rate-downgrade" in sigs else LINE_RATE_GBPS
        errors = dict.fromkeys(_ERROR_COUNTERS, 0)
        if port.state != STATE_DOWN and state == STATE_DOWN:
            errors["link_downed"] += 1  # the drop itself, counted once
        for sig in sigs:
            for counter, per_h in _ERROR_RATES_PER_H.get(sig, {}).items():
                errors[counter] += poisson(per_h * elapsed / 3600.0, rng)
        updated = replace(
            port,
            state=state,
            phys_state=phys,
            rate_gbps=rate,
            link_downed=port.link_downed + errors["link_downed"],
            link_error_recovery=port.link_error_recovery + errors["link_error_recovery"],
            symbol_error=port.symbol_error + errors["symbol_error"],
            port_rcv_errors=port.port_rcv_errors + errors["port_rcv_errors"],
        )
        if state == STATE_ACTIVE:
            updated = _move(updated, gbps=min(gbps, rate * 0.97), elapsed_s=elapsed, rng=rng)
        out.append(updated)
    return out


def _move(
    port: IbPortTelemetry, *, gbps: float, elapsed_s: float, rng: random.Random
) -> IbPortTelemetry:
    """Count ``elapsed_s`` of traffic at about ``gbps`` each way, plus the management
    packets every active port exchanges with the subnet manager."""
    mads = _MADS_PER_S * elapsed_s

    def octets() -> float:
        if gbps <= 0:
            return 0.0
        return gbps * 1e9 / 8 * elapsed_s * max(0.0, 1.0 + rng.gauss(0.0, _TRAFFIC_NOISE))

    sent, received = octets(), octets()
    return replace(
        port,
        port_xmit_data=port.port_xmit_data + round((sent + mads * _MAD_BYTES) / _BYTES_PER_WORD),
        port_rcv_data=port.port_rcv_data + round((received + mads * _MAD_BYTES) / _BYTES_PER_WORD),
        port_xmit_packets=port.port_xmit_packets + round(sent / _BULK_PACKET_BYTES + mads),
        port_rcv_packets=port.port_rcv_packets + round(received / _BULK_PACKET_BYTES + mads),
    )
