"""Storage I/O, from node_exporter's names (the agent's /metrics, or node_exporter):
local disks, NFS mounts (mountstats) and Lustre clients."""

from __future__ import annotations

from gpufleet.dashboards.panels import HOST, RATE, DashboardSpec, PanelSpec, Query

DISK = "{{hostname}} {{device}}"
MOUNT = "{{hostname}} {{export}}"


def rate(metric: str) -> str:
    return f"rate({metric}{{{HOST}}}[{RATE}])"


DISK_BYTES = PanelSpec(
    "Disk throughput",
    [
        Query(rate("node_disk_read_bytes_total"), f"{DISK} read"),
        Query(rate("node_disk_written_bytes_total"), f"{DISK} write"),
    ],
    unit="Bps",
)
DISK_IOPS = PanelSpec(
    "Disk IOPS",
    [
        Query(rate("node_disk_reads_completed_total"), f"{DISK} reads"),
        Query(rate("node_disk_writes_completed_total"), f"{DISK} writes"),
    ],
    unit="iops",
)
DISK_BUSY = PanelSpec(
    "Disk busy",
    [Query(rate("node_disk_io_time_seconds_total"), DISK)],
    unit="percentunit",
    minimum=0,
    description="Share of time the device had I/O in flight.",
)
DISK_LATENCY = PanelSpec(
    "Disk latency",
    [
        Query(
            f"{rate('node_disk_read_time_seconds_total')} / "
            f"{rate('node_disk_reads_completed_total')}",
            f"{DISK} read",
        ),
        Query(
            f"{rate('node_disk_write_time_seconds_total')} / "
            f"{rate('node_disk_writes_completed_total')}",
            f"{DISK} write",
        ),
    ],
    unit="s",
    description="Mean time per completed request (no value while the disk is idle).",
)
DISK_QUEUE = PanelSpec("Disk I/O in flight", [Query(f"node_disk_io_now{{{HOST}}}", DISK)])
NFS_BYTES = PanelSpec(
    "NFS throughput",
    [
        Query(rate("node_mountstats_nfs_total_read_bytes_total"), f"{MOUNT} read"),
        Query(rate("node_mountstats_nfs_total_write_bytes_total"), f"{MOUNT} write"),
    ],
    unit="Bps",
)
NFS_OPS = PanelSpec(
    "NFS operations",
    [
        Query(
            "sum by (hostname, export, operation) "
            f"({rate('node_mountstats_nfs_operations_requests_total')})",
            f"{MOUNT} {{{{operation}}}}",
        )
    ],
    unit="ops",
)
NFS_TIMEOUTS = PanelSpec(
    "NFS major timeouts",
    [
        Query(
            "sum by (hostname, export) "
            f"(increase(node_mountstats_nfs_operations_major_timeouts_total{{{HOST}}}[{RATE}]))",
            MOUNT,
        )
    ],
    description="A major timeout is the server not answering: jobs reading it hang.",
)
LUSTRE_BYTES = PanelSpec(
    "Lustre throughput",
    [
        Query(rate("gpufleet_lustre_read_bytes_total"), "{{hostname}} {{fs}} read"),
        Query(rate("gpufleet_lustre_write_bytes_total"), "{{hostname}} {{fs}} write"),
    ],
    unit="Bps",
)
LUSTRE_OPS = PanelSpec(
    "Lustre operations",
    [
        Query(
            f"sum by (hostname, fs, operation) ({rate('gpufleet_lustre_operations_total')})",
            "{{hostname}} {{fs}} {{operation}}",
        )
    ],
    unit="ops",
)

DASHBOARD = DashboardSpec(
    uid="gpufleet-storage",
    title="gpufleet / Storage I/O",
    description="Local disks, NFS mounts and Lustre clients, by host.",
    rows=[
        ("Disks", [DISK_BYTES, DISK_IOPS, DISK_BUSY, DISK_LATENCY, DISK_QUEUE]),
        ("NFS", [NFS_BYTES, NFS_OPS, NFS_TIMEOUTS]),
        ("Lustre", [LUSTRE_BYTES, LUSTRE_OPS]),
    ],
    tags=("storage",),
)
