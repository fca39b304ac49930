"""A :class:`HostSnapshot` as Prometheus series, under node_exporter's names and labels.

Lustre has no node_exporter collector: its series are ``gpufleet_lustre_*``, label ``fs``.
"""

from __future__ import annotations

from gpufleet.agent.exposition import Exposition
from gpufleet.agent.hostio.reader import HostSnapshot

_IB_STATE = (
    "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, "
    "5: act defer)"
)
_IB_PHYS = (
    "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, "
    "4: shift, 5: link up, 6: link error recover, 7: phytest)"
)


def add_host_metrics(exp: Exposition, snap: HostSnapshot) -> None:
    _infiniband(exp, snap)
    _network(exp, snap)
    _disks(exp, snap)
    _nfs(exp, snap)
    _lustre(exp, snap)


def _infiniband(exp: Exposition, snap: HostSnapshot) -> None:
    for dev in snap.ib_devices:
        exp.add(
            "node_infiniband_info",
            "gauge",
            "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
            (
                ("device", dev.name),
                ("board_id", dev.board_id or ""),
                ("firmware_version", dev.firmware_version or ""),
                ("hca_type", dev.hca_type or ""),
            ),
            1,
        )
    for port in snap.ib_ports:
        where = (("device", port.device), ("port", port.port))
        if port.state_id is not None:
            exp.add("node_infiniband_state_id", "gauge", _IB_STATE, where, port.state_id)
        if port.physical_state_id is not None:
            exp.add(
                "node_infiniband_physical_state_id",
                "gauge",
                _IB_PHYS,
                where,
                port.physical_state_id,
            )
        if port.rate_bytes_per_second is not None:
            exp.add(
                "node_infiniband_rate_bytes_per_second",
                "gauge",
                "Maximum signal transfer rate",
                where,
                port.rate_bytes_per_second,
            )
    for port in snap.ib_ports:
        for name, value in port.counters.items():
            exp.add(
                f"node_infiniband_{name}",
                "counter",
                f"InfiniBand port counter ({name.removesuffix('_total')}).",
                (("device", port.device), ("port", port.port)),
                value,
            )


def _network(exp: Exposition, snap: HostSnapshot) -> None:
    for nic in snap.net:
        dev = (("device", nic.device),)
        exp.add(
            "node_network_up",
            "gauge",
            "Value is 1 if operstate is 'up', 0 otherwise.",
            dev,
            nic.up,
        )
        if nic.carrier is not None:
            exp.add(
                "node_network_carrier",
                "gauge",
                "Network device property: carrier",
                dev,
                nic.carrier,
            )
        if nic.carrier_changes is not None:
            exp.add(
                "node_network_carrier_changes_total",
                "counter",
                "Network device property: carrier_changes_total",
                dev,
                nic.carrier_changes,
            )
        if nic.speed_bytes is not None:
            exp.add(
                "node_network_speed_bytes",
                "gauge",
                "Network device property: speed_bytes",
                dev,
                nic.speed_bytes,
            )
        if nic.mtu_bytes is not None:
            exp.add(
                "node_network_mtu_bytes",
                "gauge",
                "Network device property: mtu_bytes",
                dev,
                nic.mtu_bytes,
            )
    for nic in snap.net:
        for name, value in nic.statistics.items():
            exp.add(
                f"node_network_{name}",
                "counter",
                f"Network device statistic {name.removesuffix('_total')}.",
                (("device", nic.device),),
                value,
            )


def _disks(exp: Exposition, snap: HostSnapshot) -> None:
    for disk in snap.disks:
        for name, value in disk.values.items():
            exp.add(
                f"node_disk_{name}",
                "gauge" if name == "io_now" else "counter",
                f"Block device statistic from /proc/diskstats ({name}).",
                (("device", disk.device),),
                value,
            )


def _nfs(exp: Exposition, snap: HostSnapshot) -> None:
    prefix = "node_mountstats_nfs_"
    for mount in snap.nfs:
        where = [
            ("export", mount.export),
            ("protocol", mount.protocol),
            ("mountaddr", mount.mountaddr),
        ]
        if mount.age_seconds is not None:
            exp.add(
                f"{prefix}age_seconds_total",
                "counter",
                "The age of the NFS mount in seconds.",
                where,
                mount.age_seconds,
            )
        for name, count in mount.bytes.items():
            exp.add(f"{prefix}{name}", "counter", f"NFS mount byte counter ({name}).", where, count)
        for op in mount.operations:
            if op.requests == 0:
                continue  # NFSv4 lists ~60 operations; the unused ones are left out
            values: list[tuple[str, float | None]] = [
                ("operations_requests_total", op.requests),
                ("operations_transmissions_total", op.transmissions),
                ("operations_major_timeouts_total", op.major_timeouts),
                ("operations_sent_bytes_total", op.sent_bytes),
                ("operations_received_bytes_total", op.received_bytes),
                ("operations_queue_time_seconds_total", op.queue_ms / 1000),
                ("operations_response_time_seconds_total", op.response_ms / 1000),
                ("operations_request_time_seconds_total", op.request_ms / 1000),
                ("operations_errors_total", op.errors),
            ]
            for name, value in values:
                if value is not None:
                    exp.add(
                        f"{prefix}{name}",
                        "counter",
                        f"NFS per-operation statistic ({name}).",
                        [*where, ("operation", op.operation)],
                        value,
                    )


def _lustre(exp: Exposition, snap: HostSnapshot) -> None:
    for fs in snap.lustre:
        where = (("fs", fs.fs),)
        if fs.read_bytes is not None:
            exp.add(
                "gpufleet_lustre_read_bytes_total",
                "counter",
                "Bytes read through this Lustre client (llite stats read_bytes sum).",
                where,
                fs.read_bytes,
            )
        if fs.write_bytes is not None:
            exp.add(
                "gpufleet_lustre_write_bytes_total",
                "counter",
                "Bytes written through this Lustre client (llite stats write_bytes sum).",
                where,
                fs.write_bytes,
            )
    for fs in snap.lustre:
        for op, n in sorted(fs.operations.items()):
            exp.add(
                "gpufleet_lustre_operations_total",
                "counter",
                "Lustre client (llite) operations, by operation.",
                (("fs", fs.fs), ("operation", op)),
                n,
            )
    for fs in snap.lustre:
        for op, usecs in sorted(fs.usecs.items()):
            exp.add(
                "gpufleet_lustre_operation_time_seconds_total",
                "counter",
                "Time spent in Lustre client (llite) operations, by operation.",
                (("fs", fs.fs), ("operation", op)),
                usecs / 1_000_000,
            )
