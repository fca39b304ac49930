"""InfiniBand and NICs, from node_exporter's names (the agent's /metrics, or
node_exporter itself): port state and rate, traffic, link errors, congestion, mlx5
hardware counters; NIC link, traffic, errors and flaps."""

from __future__ import annotations

from gpufleet.dashboards.panels import HOST, RATE, DashboardSpec, PanelSpec, Query

PORT = "{{hostname}} {{device}}/{{port}}"
NIC = "{{hostname}} {{device}}"


def ib_rate(metric: str, what: str) -> Query:
    return Query(f"rate(node_infiniband_{metric}_total{{{HOST}}}[{RATE}])", f"{PORT} {what}")


IB_STATE = PanelSpec(
    "IB port state",
    [
        Query(f"node_infiniband_state_id{{{HOST}}}", f"{PORT} state"),
        Query(f"node_infiniband_physical_state_id{{{HOST}}}", f"{PORT} physical"),
    ],
    description="state 4 = ACTIVE; physical state 5 = LinkUp. Anything else: the port is "
    "down for jobs.",
)
IB_SPEED = PanelSpec(
    "IB port rate",
    [Query(f"node_infiniband_rate_bytes_per_second{{{HOST}}}", PORT)],
    unit="Bps",
    description="Negotiated rate; a port below its peers trained down (bad cable or port).",
)
IB_TRAFFIC = PanelSpec(
    "IB traffic",
    [ib_rate("port_data_received_bytes", "rx"), ib_rate("port_data_transmitted_bytes", "tx")],
    unit="Bps",
)
IB_ERRORS = PanelSpec(
    "IB link errors (rate)",
    [
        ib_rate("symbol_error", "symbol errors"),
        ib_rate("link_error_recovery", "error recoveries"),
        ib_rate("link_downed", "link downed"),
        ib_rate("port_errors_received", "receive errors"),
        ib_rate("local_link_integrity_errors", "link integrity"),
        ib_rate("excessive_buffer_overrun_errors", "buffer overruns"),
    ],
    unit="cps",
    description="Symbol errors and error recoveries grow before a link goes down.",
)
IB_CONGESTION = PanelSpec(
    "IB congestion and discards (rate)",
    [
        ib_rate("port_transmit_wait", "transmit wait"),
        ib_rate("port_discards_transmitted", "tx discards"),
    ],
    unit="cps",
)
IB_HW = PanelSpec(
    "mlx5 transport errors (rate)",
    [
        ib_rate("local_ack_timeout_errors", "local ACK timeouts"),
        ib_rate("out_of_sequence_packets_received", "out of sequence"),
        ib_rate("packet_sequence_errors", "sequence errors"),
        ib_rate("out_of_buffer_drops", "out of buffer"),
    ],
    unit="cps",
    description="hw_counters: retransmissions that slow NCCL without any link error.",
)
NIC_UP = PanelSpec(
    "NIC link",
    [
        Query(f"node_network_up{{{HOST}}}", f"{NIC} up"),
        Query(f"node_network_carrier{{{HOST}}}", f"{NIC} carrier"),
    ],
)
NIC_FLAPS = PanelSpec(
    "NIC carrier changes",
    [Query(f"increase(node_network_carrier_changes_total{{{HOST}}}[{RATE}])", f"{NIC} changes")],
    description="Link flaps (Ethernet, RoCE).",
)
NIC_TRAFFIC = PanelSpec(
    "NIC traffic",
    [
        Query(f"rate(node_network_receive_bytes_total{{{HOST}}}[{RATE}])", f"{NIC} rx"),
        Query(f"rate(node_network_transmit_bytes_total{{{HOST}}}[{RATE}])", f"{NIC} tx"),
    ],
    unit="Bps",
)
NIC_ERRORS = PanelSpec(
    "NIC errors and drops (rate)",
    [
        Query(f"rate(node_network_receive_errs_total{{{HOST}}}[{RATE}])", f"{NIC} rx errors"),
        Query(f"rate(node_network_receive_drop_total{{{HOST}}}[{RATE}])", f"{NIC} rx drops"),
        Query(f"rate(node_network_transmit_errs_total{{{HOST}}}[{RATE}])", f"{NIC} tx errors"),
    ],
    unit="pps",
)
NIC_SPEED = PanelSpec("NIC speed", [Query(f"node_network_speed_bytes{{{HOST}}}", NIC)], unit="Bps")

DASHBOARD = DashboardSpec(
    uid="gpufleet-network",
    title="gpufleet / InfiniBand and NICs",
    description="IB ports (state, rate, traffic, errors, congestion, mlx5 counters) and "
    "NICs (link, flaps, traffic, errors), by host.",
    rows=[
        ("InfiniBand", [IB_STATE, IB_SPEED, IB_TRAFFIC, IB_ERRORS, IB_CONGESTION, IB_HW]),
        ("NICs", [NIC_UP, NIC_FLAPS, NIC_TRAFFIC, NIC_ERRORS, NIC_SPEED]),
    ],
    tags=("network", "infiniband"),
)
