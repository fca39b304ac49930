"""Storage I/O from procfs: block devices, NFS mounts and Lustre clients. Pure parsers.

* ``/proc/diskstats`` (Documentation/admin-guide/iostats.rst): 11 fields after the name,
  4 more since 4.18 (discard), 2 more since 5.5 (flush); whatever the kernel gives is
  read. Partitions, loop and ram devices are skipped with node_exporter's default
  pattern. Sectors are 512 bytes whatever the device's sector size; times are ms.
* ``/proc/self/mountstats`` (``nfs`` / ``nfs4`` mounts only): ``bytes:``, the first
  ``xprt:`` line's protocol, and ``per-op statistics`` (8 fields, 9 with ``statvers=1.1``:
  errors). The server address comes from ``/proc/self/mountinfo``'s ``addr=`` option, as
  node_exporter takes it. Two mounts of one export share their counters: kept once.
* Lustre ``llite/<fs>-<sb>/stats`` (lprocfs): ``name count samples [unit] min max sum
  [sumsq]``; ``read_bytes``/``write_bytes`` sums are bytes, ``[usecs]`` sums are µs.

A line that does not parse is skipped; nothing here raises on odd input.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# node_exporter's --collector.diskstats.device-exclude default
DISK_EXCLUDE_DEFAULT = r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"
SECTOR_BYTES = 512

# field index after the name → (node_disk_<name>, scale): a multiplier (sectors → bytes)
# or, negative, a divisor (ms → s: dividing keeps 341.839 exact where × 0.001 would not).
# io_now is the one gauge.
DISK_FIELDS: tuple[tuple[str, int], ...] = (
    ("reads_completed_total", 1),
    ("reads_merged_total", 1),
    ("read_bytes_total", SECTOR_BYTES),
    ("read_time_seconds_total", -1000),
    ("writes_completed_total", 1),
    ("writes_merged_total", 1),
    ("written_bytes_total", SECTOR_BYTES),
    ("write_time_seconds_total", -1000),
    ("io_now", 1),
    ("io_time_seconds_total", -1000),
    ("io_time_weighted_seconds_total", -1000),
    ("discards_completed_total", 1),  # 4.18+
    ("discards_merged_total", 1),
    ("discarded_sectors_total", 1),
    ("discard_time_seconds_total", -1000),
    ("flush_requests_total", 1),  # 5.5+
    ("flush_requests_time_seconds_total", -1000),
)
# mountstats "bytes:" fields → node_mountstats_nfs_<name>
NFS_BYTES = (
    "read_bytes_total",
    "write_bytes_total",
    "direct_read_bytes_total",
    "direct_write_bytes_total",
    "total_read_bytes_total",
    "total_write_bytes_total",
    "read_pages_total",
    "write_pages_total",
)
_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)")
_OP_NAME = re.compile(r"^\s*[A-Z][A-Z0-9_]*$")
_LUSTRE = re.compile(r"^(\w+)\s+(\d+)\s+samples\s+\[(\w+)\](?:\s+(\d+)\s+(\d+)\s+(\d+))?")
_HEX_SUFFIX = re.compile(r"^(.+)-[0-9a-f]{8,16}$")


@dataclass(frozen=True, slots=True)
class DiskStats:
    device: str
    values: Mapping[str, float]  # node_disk_<key>


@dataclass(frozen=True, slots=True)
class NfsOperation:
    operation: str
    requests: int
    transmissions: int
    major_timeouts: int
    sent_bytes: int
    received_bytes: int
    queue_ms: int
    response_ms: int  # RTT
    request_ms: int  # queued to done ("execute")
    errors: int | None  # statvers 1.1 (kernel 5.x) and later


@dataclass(frozen=True, slots=True)
class NfsMount:
    export: str
    mountpoint: str
    protocol: str
    mountaddr: str
    age_seconds: int | None
    bytes: Mapping[str, int]  # node_mountstats_nfs_<key>
    operations: tuple[NfsOperation, ...]


@dataclass(slots=True)
class LustreStats:
    fs: str
    read_bytes: int | None = None
    write_bytes: int | None = None
    operations: dict[str, int] = field(default_factory=dict)  # samples per operation
    usecs: dict[str, int] = field(default_factory=dict)  # summed µs, [usecs] lines only


def parse_diskstats(text: str, *, exclude: re.Pattern[str] | None = None) -> list[DiskStats]:
    out: list[DiskStats] = []
    seen: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 + 11:
            continue  # pre-2.6.25 partition lines (4 fields), blank or cut lines
        device = parts[2]
        if device in seen or (exclude is not None and exclude.match(device)):
            continue
        try:
            numbers = [int(p) for p in parts[3 : 3 + len(DISK_FIELDS)]]
        except ValueError:
            continue
        values: dict[str, float] = {}
        for (name, scale), raw in zip(DISK_FIELDS, numbers, strict=False):
            values[name] = raw * scale if scale > 0 else raw / -scale
        seen.add(device)
        out.append(DiskStats(device, values))
    return out


def parse_mountinfo_addrs(text: str) -> dict[str, str]:
    """Mount point → the ``addr=`` super option (NFS server address) from mountinfo."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        for option in rest[2].split(","):
            if option.startswith("addr="):
                out[fields[4]] = option.removeprefix("addr=")
    return out


def parse_mountstats(text: str, *, mountinfo: str | None = None) -> list[NfsMount]:
    addrs = parse_mountinfo_addrs(mountinfo or "")
    mounts: list[NfsMount] = []
    current: _MountBuilder | None = None
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m is not None:
            if current is not None:
                mounts.append(current.build())
            export, mountpoint, fstype = m[1], m[2], m[3]
            current = None
            if fstype in ("nfs", "nfs4"):
                current = _MountBuilder(export, mountpoint, addrs.get(mountpoint, ""))
            continue
        if current is not None:
            current.line(line)
    if current is not None:
        mounts.append(current.build())
    unique: dict[tuple[str, str, str], NfsMount] = {}
    for mount in mounts:
        unique.setdefault((mount.export, mount.protocol, mount.mountaddr), mount)
    return list(unique.values())


@dataclass(slots=True)
class _MountBuilder:
    export: str
    mountpoint: str
    mountaddr: str
    protocol: str = ""
    age: int | None = None
    bytes: dict[str, int] = field(default_factory=dict)
    ops: list[NfsOperation] = field(default_factory=list)
    in_ops: bool = False

    def line(self, line: str) -> None:
        if self.in_ops:
            name, sep, rest = line.partition(":")
            numbers = rest.split()
            if sep and len(numbers) >= 8 and _OP_NAME.match(name) and rest.count(":") == 0:
                if numbers[0] != "0" and all(n.isdigit() for n in numbers):
                    self.ops.append(_operation(name.strip(), [int(n) for n in numbers]))
                return  # an operation never used: ~60 of NFSv4's, skipped unparsed
        key, _, value = line.strip().partition(":")
        if key == "age" and value.strip().isdigit():
            self.age = int(value)
        elif key == "bytes":
            numbers = value.split()
            if len(numbers) >= len(NFS_BYTES) and all(n.isdigit() for n in numbers):
                self.bytes = {k: int(n) for k, n in zip(NFS_BYTES, numbers, strict=False)}
        elif key == "xprt" and not self.protocol:
            self.protocol = value.split()[0] if value.split() else ""
        elif line.strip() == "per-op statistics":
            self.in_ops = True

    def build(self) -> NfsMount:
        return NfsMount(
            self.export,
            self.mountpoint,
            self.protocol,
            self.mountaddr,
            self.age,
            self.bytes,
            tuple(self.ops),
        )


def _operation(name: str, n: list[int]) -> NfsOperation:
    return NfsOperation(
        name, n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8] if len(n) > 8 else None
    )


def lustre_fs_name(instance: str) -> str:
    """``scratch-ffff9a0c5e7d4000`` → ``scratch`` (the superblock address changes on
    every mount; the file system's name does not)."""
    m = _HEX_SUFFIX.match(instance)
    return m[1] if m else instance


def parse_lustre_stats(text: str, *, fs: str) -> LustreStats:
    stats = LustreStats(fs)
    for line in text.splitlines():
        m = _LUSTRE.match(line)
        if m is None:
            continue  # snapshot_time / start_time / elapsed_time, blank lines
        name, count, unit, total = m[1], int(m[2]), m[3], m[6]
        if name == "read_bytes":
            stats.read_bytes = int(total) if total is not None else None
        elif name == "write_bytes":
            stats.write_bytes = int(total) if total is not None else None
        else:
            stats.operations[name] = count
            if unit == "usecs" and total is not None:
                stats.usecs[name] = int(total)
    return stats


def merge_lustre(parts: list[LustreStats]) -> list[LustreStats]:
    """One entry per file system: two mounts of one file system are added up."""
    merged: dict[str, LustreStats] = {}
    for part in parts:
        into = merged.get(part.fs)
        if into is None:
            merged[part.fs] = part
            continue
        for attr in ("read_bytes", "write_bytes"):
            a, b = getattr(into, attr), getattr(part, attr)
            setattr(into, attr, a if b is None else b if a is None else a + b)
        for name, n in part.operations.items():
            into.operations[name] = into.operations.get(name, 0) + n
        for name, n in part.usecs.items():
            into.usecs[name] = into.usecs.get(name, 0) + n
    return list(merged.values())
