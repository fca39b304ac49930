"""InfiniBand/RoCE ports and network interfaces from sysfs, under node_exporter's names.

InfiniBand: ``<sys>/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate}``, the
``counters/`` files and the error and congestion subset of mlx5's ``hw_counters/``,
named as node_exporter's ``infiniband`` collector names them (labels ``device``,
``port``). ``port_rcv_data``/``port_xmit_data`` count 4-byte words: ×4, as
node_exporter does. A counter that reads ``N/A (no PMA)`` or is missing is left out.

The sampling collector (``collectors/infiniband.py``) reads state, rate and four error
counters every second for the detectors; this module reads everything, but only when
Prometheus scrapes, and uses the same parsers.

Network interfaces: ``<sys>/class/net/<dev>/{operstate,carrier,carrier_changes,speed,mtu}``
and ``statistics/*`` as node_exporter's ``netclass`` and ``netdev`` name them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.collectors.infiniband import parse_rate, parse_state
from gpufleet.agent.hostio.files import list_dir, read_int, read_line, read_uint

GBIT_BYTES = 125_000_000  # 1 Gb/s in bytes/s, node_exporter's factor

# counters/<file> → node_infiniband_<name>, multiplier
IB_COUNTERS: Mapping[str, tuple[str, int]] = {
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors_total", 1),
    "link_downed": ("link_downed_total", 1),
    "link_error_recovery": ("link_error_recovery_total", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors_total", 1),
    "multicast_rcv_packets": ("multicast_packets_received_total", 1),
    "multicast_xmit_packets": ("multicast_packets_transmitted_total", 1),
    "port_rcv_constraint_errors": ("port_constraint_errors_received_total", 1),
    "port_xmit_constraint_errors": ("port_constraint_errors_transmitted_total", 1),
    "port_rcv_data": ("port_data_received_bytes_total", 4),
    "port_xmit_data": ("port_data_transmitted_bytes_total", 4),
    "port_rcv_discards": ("port_discards_received_total", 1),
    "port_xmit_discards": ("port_discards_transmitted_total", 1),
    "port_rcv_errors": ("port_errors_received_total", 1),
    "port_rcv_packets": ("port_packets_received_total", 1),
    "port_xmit_packets": ("port_packets_transmitted_total", 1),
    "port_rcv_remote_physical_errors": ("port_receive_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("port_receive_switch_relay_errors_total", 1),
    "port_xmit_wait": ("port_transmit_wait_total", 1),
    "symbol_error": ("symbol_error_total", 1),
    "unicast_rcv_packets": ("unicast_packets_received_total", 1),
    "unicast_xmit_packets": ("unicast_packets_transmitted_total", 1),
    "VL15_dropped": ("vl15_dropped_total", 1),
}
# hw_counters/<file> → node_infiniband_<name>: transport errors and RoCE congestion
# (node_exporter ≥ 1.11). The request counters (rx_*_requests) are left out: traffic
# volume is already in the port counters, and each file is one more read per scrape.
IB_HW_COUNTERS: Mapping[str, str] = {
    "duplicate_request": "duplicate_requests_packets_total",
    "implied_nak_seq_err": "implied_nak_seq_errors_total",
    "local_ack_timeout_err": "local_ack_timeout_errors_total",
    "out_of_buffer": "out_of_buffer_drops_total",
    "out_of_sequence": "out_of_sequence_packets_received_total",
    "packet_seq_err": "packet_sequence_errors_total",
    "req_cqe_error": "req_cqes_errors_total",
    "req_cqe_flush_error": "req_cqes_flush_errors_total",
    "req_remote_access_errors": "req_remote_access_errors_total",
    "req_remote_invalid_request": "req_remote_invalid_request_errors_total",
    "resp_cqe_error": "resp_cqes_errors_total",
    "resp_cqe_flush_error": "resp_cqes_flush_errors_total",
    "resp_local_length_error": "resp_local_length_errors_total",
    "resp_remote_access_errors": "resp_remote_access_errors_total",
    "rnr_nak_retry_err": "rnr_nak_retry_packets_received_total",
    "roce_adp_retrans": "roce_adp_retransmits_total",
    "roce_adp_retrans_to": "roce_adp_retransmits_timeout_total",
    "np_cnp_sent": "np_cnp_packets_sent_total",
    "np_ecn_marked_roce_packets": "np_ecn_marked_roce_packets_received_total",
    "rp_cnp_handled": "rp_cnp_packets_handled_total",
    "rp_cnp_ignored": "rp_cnp_ignored_packets_received_total",
    "rx_icrc_encapsulated": "rx_icrc_encapsulated_errors_total",
}
# statistics/<file> → node_network_<name> (netdev's names; sysfs holds the same
# counters as its netlink source)
NET_STATISTICS: Mapping[str, str] = {
    "rx_bytes": "receive_bytes_total",
    "rx_packets": "receive_packets_total",
    "rx_errors": "receive_errs_total",
    "rx_dropped": "receive_drop_total",
    "tx_bytes": "transmit_bytes_total",
    "tx_packets": "transmit_packets_total",
    "tx_errors": "transmit_errs_total",
    "tx_dropped": "transmit_drop_total",
}


@dataclass(frozen=True, slots=True)
class IbDevice:
    name: str
    board_id: str | None
    firmware_version: str | None
    hca_type: str | None


@dataclass(frozen=True, slots=True)
class IbPort:
    device: str
    port: str
    state_id: int | None
    physical_state_id: int | None
    rate_bytes_per_second: int | None
    counters: Mapping[str, int]  # node_infiniband_<key>


@dataclass(frozen=True, slots=True)
class NetInterface:
    device: str
    up: int  # 1: operstate "up"
    carrier: int | None
    carrier_changes: int | None
    speed_bytes: int | None
    mtu_bytes: int | None
    statistics: Mapping[str, int]  # node_network_<key>


def read_infiniband(
    root: Path, *, exclude: Collection[str] = ()
) -> tuple[list[IbDevice], list[IbPort]]:
    """Every HCA under ``root`` (``<sys>/class/infiniband``) and its ports."""
    devices: list[IbDevice] = []
    ports: list[IbPort] = []
    for name in list_dir(root):
        if name in exclude:
            continue
        base = f"{root}/{name}"  # str paths: pathlib's "/" costs more than the read
        port_names = [p for p in list_dir(f"{base}/ports") if p.isdigit()]
        if not port_names:
            continue
        devices.append(
            IbDevice(
                name,
                board_id=read_line(f"{base}/board_id") or None,
                firmware_version=read_line(f"{base}/fw_ver") or None,
                hca_type=read_line(f"{base}/hca_type") or None,
            )
        )
        for port in sorted(port_names, key=int):
            ports.append(read_ib_port(f"{base}/ports/{port}", device=name, port=port))
    return devices, ports


def read_ib_port(path: str, *, device: str, port: str) -> IbPort:
    rate = parse_rate(read_line(f"{path}/rate"))
    counters: dict[str, int] = {}
    # List first and open only what is there: an irdma or restricted port has no
    # counters/, and a failed open costs as much as a read.
    present = set(list_dir(f"{path}/counters"))
    for filename, (metric, factor) in IB_COUNTERS.items():
        if filename in present:
            value = read_uint(f"{path}/counters/{filename}")
            if value is not None:
                counters[metric] = value * factor
    present = set(list_dir(f"{path}/hw_counters"))
    for filename, metric in IB_HW_COUNTERS.items():
        if filename in present:
            value = read_uint(f"{path}/hw_counters/{filename}")
            if value is not None:
                counters[metric] = value
    return IbPort(
        device,
        port,
        state_id=parse_state(read_line(f"{path}/state")),
        physical_state_id=parse_state(read_line(f"{path}/phys_state")),
        rate_bytes_per_second=None if rate is None else int(rate * GBIT_BYTES),
        counters=counters,
    )


def read_net(root: Path, *, exclude: re.Pattern[str] | None = None) -> list[NetInterface]:
    """Every interface under ``root`` (``<sys>/class/net``) but the excluded ones."""
    out: list[NetInterface] = []
    for name in list_dir(root):
        if exclude is not None and exclude.match(name):
            continue
        base = f"{root}/{name}"
        operstate = read_line(f"{base}/operstate")
        if operstate is None:
            continue  # not an interface (e.g. bonding_masters), or gone meanwhile
        speed = read_int(f"{base}/speed")
        stats: dict[str, int] = {}
        for filename, metric in NET_STATISTICS.items():
            value = read_uint(f"{base}/statistics/{filename}")
            if value is not None:
                stats[metric] = value
        out.append(
            NetInterface(
                name,
                up=1 if operstate == "up" else 0,
                carrier=read_uint(f"{base}/carrier"),
                carrier_changes=read_uint(f"{base}/carrier_changes"),
                # Mb/s; -1 (or absent) when the driver does not know: left out.
                speed_bytes=speed * 1_000_000 // 8 if speed is not None and speed >= 0 else None,
                mtu_bytes=read_uint(f"{base}/mtu"),
                statistics=stats,
            )
        )
    return out
