"""One read of the host's I/O state, for one scrape.

``HostIoReader.read()`` reads InfiniBand, NICs, block devices, NFS and Lustre under the
configured roots (``/sys`` and ``/proc`` on a node; a recorded tree in tests) and
returns a :class:`HostSnapshot`. It is called at scrape time, in a thread (the files are
small but there can be a few hundred), never in the 1 Hz sampling loop. A part that
fails for a reason the parsers did not foresee is left out of that snapshot and logged
once until it works again: one odd file never costs the rest of ``/metrics``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpufleet.agent.hostio.files import list_dir, read_text
from gpufleet.agent.hostio.network import (
    IbDevice,
    IbPort,
    NetInterface,
    read_infiniband,
    read_net,
)
from gpufleet.agent.hostio.storage import (
    DiskStats,
    LustreStats,
    NfsMount,
    lustre_fs_name,
    merge_lustre,
    parse_diskstats,
    parse_lustre_stats,
    parse_mountstats,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class HostSnapshot:
    ib_devices: list[IbDevice] = field(default_factory=list)
    ib_ports: list[IbPort] = field(default_factory=list)
    net: list[NetInterface] = field(default_factory=list)
    disks: list[DiskStats] = field(default_factory=list)
    nfs: list[NfsMount] = field(default_factory=list)
    lustre: list[LustreStats] = field(default_factory=list)


class HostIoReader:
    def __init__(
        self,
        *,
        sys_root: Path = Path("/sys"),
        proc_root: Path = Path("/proc"),
        infiniband_root: Path | None = None,
        infiniband_exclude: Collection[str] = (),
        net_exclude: str | None = None,
        disk_exclude: str | None = None,
    ) -> None:
        self.sys_root = sys_root
        self.proc_root = proc_root
        self.infiniband_root = infiniband_root or sys_root / "class" / "infiniband"
        self.infiniband_exclude = frozenset(infiniband_exclude)
        self.net_exclude = re.compile(net_exclude) if net_exclude else None
        self.disk_exclude = re.compile(disk_exclude) if disk_exclude else None
        self._failing: set[str] = set()

    def read(self) -> HostSnapshot:
        snap = HostSnapshot()
        no_ib: tuple[list[IbDevice], list[IbPort]] = ([], [])
        snap.ib_devices, snap.ib_ports = self._guard("infiniband", self._infiniband, no_ib)
        snap.net = self._guard("net", self._net, [])
        snap.disks = self._guard("diskstats", self._disks, [])
        snap.nfs = self._guard("mountstats", self._nfs, [])
        snap.lustre = self._guard("lustre", self._lustre, [])
        return snap

    def _infiniband(self) -> tuple[list[IbDevice], list[IbPort]]:
        return read_infiniband(self.infiniband_root, exclude=self.infiniband_exclude)

    def _net(self) -> list[NetInterface]:
        return read_net(self.sys_root / "class" / "net", exclude=self.net_exclude)

    def _disks(self) -> list[DiskStats]:
        text = read_text(self.proc_root / "diskstats")
        return [] if text is None else parse_diskstats(text, exclude=self.disk_exclude)

    def _nfs(self) -> list[NfsMount]:
        text = read_text(self.proc_root / "self" / "mountstats")
        if text is None or " with fstype nfs" not in text:
            return []  # most nodes: no NFS, so mountinfo is not even read
        mountinfo = read_text(self.proc_root / "self" / "mountinfo")
        return parse_mountstats(text, mountinfo=mountinfo)

    def _lustre(self) -> list[LustreStats]:
        # Lustre < 2.12 keeps llite stats in /proc; later releases in debugfs. An
        # instance found in both is read once.
        parts: list[LustreStats] = []
        seen: set[str] = set()
        for base in (
            self.proc_root / "fs" / "lustre" / "llite",
            self.sys_root / "kernel" / "debug" / "lustre" / "llite",
        ):
            for instance in list_dir(base):
                if instance in seen:
                    continue
                text = read_text(base / instance / "stats")
                if text is None:
                    continue
                seen.add(instance)
                parts.append(parse_lustre_stats(text, fs=lustre_fs_name(instance)))
        return merge_lustre(parts)

    def _guard(self, part: str, fn: Callable[[], T], empty: T) -> T:
        try:
            value = fn()
        except Exception:  # a parser bug must not cost the whole scrape
            if part not in self._failing:
                self._failing.add(part)
                log.exception("reading %s for /metrics failed (logged once until it works)", part)
            return empty
        self._failing.discard(part)
        return value
