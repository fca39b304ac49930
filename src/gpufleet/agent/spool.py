"""Durable local spool: what the server has not acknowledged yet, on disk.

Findings are never dropped. Each batch of changes is numbered from a counter that only
grows (it survives restarts in the file itself), appended and fsynced before anyone may
send it, so a crash right after a detector fired still delivers the finding. Metrics are
bounded: past ``metrics_limit_bytes`` the oldest segments go first.

Record format, one per line: ``<crc32 hex8> <json>\\n``. On load, the first record that
is not a whole line with a matching CRC (a write torn by a crash or power loss) and
everything after it is cut off; earlier records are intact because every write appends.

Layout under ``<state_dir>/spool``::

    findings.log         {"f": FindingReport} | {"ack": seq} | {"next": seq}
    metrics/<seq>.seg    NodeReport records, oldest segment first
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.findings import FindingChange
from gpufleet.core.agent_protocol import FindingReport, NodeReport

log = logging.getLogger(__name__)

# Compact the findings file once nothing is pending and it has grown past this: small
# enough that load is instant, large enough that a busy node rewrites it rarely.
_COMPACT_BYTES = 256 * 1024


def _encode(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def read_records(path: Path) -> tuple[list[Any], int]:
    """The intact records of a spool file and the byte length they cover."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    records: list[Any] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end == -1:
            break  # torn: the last write never got its newline
        line = data[pos:end]
        crc, _, body = line.partition(b" ")
        try:
            ok = len(crc) == 8 and int(crc, 16) == zlib.crc32(body)
            record = json.loads(body) if ok else None
        except ValueError:
            ok = False
        if not ok:
            break
        records.append(record)
        pos = end + 1
    return records, pos


def _truncate_torn(path: Path, good: int) -> None:
    if path.exists() and path.stat().st_size > good:
        log.warning("spool %s: discarding a torn record after byte %d", path, good)
        with path.open("r+b") as fh:
            fh.truncate(good)
            os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FindingSpool:
    """Append-only, fsynced log of finding changes with their ``seq``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._path = directory / "findings.log"
        records, good = read_records(self._path)
        _truncate_torn(self._path, good)
        self._pending: dict[int, FindingReport] = {}
        acked = 0
        next_seq = 0
        for rec in records:
            if "f" in rec:
                report = FindingReport.model_validate(rec["f"])
                self._pending[report.seq] = report
                next_seq = max(next_seq, report.seq + 1)
            elif "ack" in rec:
                acked = max(acked, int(rec["ack"]))
            elif "next" in rec:
                next_seq = max(next_seq, int(rec["next"]))
        for seq in [s for s in self._pending if s <= acked]:
            del self._pending[seq]
        if not records:
            # A fresh state dir (first start, or wiped): start from the wall clock in µs,
            # like the simulated agents, so a reinstalled node's numbers still exceed
            # what the server holds and are not dropped as duplicates.
            next_seq = time.time_ns() // 1000
        self._next = max(next_seq, acked + 1)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if not records:
            self._append([{"next": self._next}], sync=True)

    @property
    def next_seq(self) -> int:
        return self._next

    def add(self, changes: list[FindingChange]) -> list[FindingReport]:
        """Number, persist (fsync) and return the changes, in order."""
        reports = [c.to_report(self._next + i) for i, c in enumerate(changes)]
        if not reports:
            return []
        self._append([{"f": r.model_dump(mode="json")} for r in reports], sync=True)
        self._next += len(reports)
        for r in reports:
            self._pending[r.seq] = r
        return reports

    def pending(self, limit: int) -> list[FindingReport]:
        return [self._pending[s] for s in sorted(self._pending)[:limit]]

    def ack(self, last_seq: int) -> None:
        """The server holds every change up to ``last_seq``: forget them."""
        done = [s for s in self._pending if s <= last_seq]
        if not done:
            return
        for s in done:
            del self._pending[s]
        # No fsync: losing an ack only means resending changes the server drops by seq.
        self._append([{"ack": last_seq}], sync=False)
        if not self._pending and self.size_bytes() > _COMPACT_BYTES:
            self._compact()

    def depth(self) -> int:
        return len(self._pending)

    def size_bytes(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        os.close(self._fd)

    def _append(self, records: list[Any], *, sync: bool) -> None:
        os.write(self._fd, b"".join(_encode(r) for r in records))
        if sync:
            os.fsync(self._fd)

    def _compact(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            fh.write(_encode({"next": self._next}))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)
        _fsync_dir(self._dir)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND, 0o600)


@dataclass(slots=True)
class _Segment:
    path: Path
    first_seq: int
    last_seq: int
    size: int


class MetricSpool:
    """Bounded segments of unsent metric reports; the oldest are dropped first.

    Not fsynced: a power loss may cost the last few seconds of metrics, never findings.
    Acks are kept in memory only: after a restart the retained reports are sent again
    and the server drops the ones it holds by ``seq``.
    """

    def __init__(self, directory: Path, *, limit_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._limit = limit_bytes
        self._segment_bytes = max(64 * 1024, limit_bytes // 8)
        self._acked = 0
        self.dropped = 0  # reports dropped for space since start
        self._segments: list[_Segment] = []
        self._unacked: deque[int] = deque()  # seqs, for depth(); ints are cheap
        for path in sorted(directory.glob("*.seg")):
            records, good = read_records(path)
            _truncate_torn(path, good)
            if not records:
                path.unlink()
                continue
            seqs = [int(r["seq"]) for r in records]
            self._segments.append(_Segment(path, seqs[0], seqs[-1], good))
            self._unacked.extend(seqs)

    def add(self, report: NodeReport) -> None:
        line = _encode(report.model_dump(mode="json"))
        seg = self._segments[-1] if self._segments else None
        if seg is None or seg.size + len(line) > self._segment_bytes:
            seg = _Segment(self._dir / f"{report.seq:020d}.seg", report.seq, report.seq, 0)
            self._segments.append(seg)
        with seg.path.open("ab") as fh:
            fh.write(line)
        seg.last_seq, seg.size = report.seq, seg.size + len(line)
        self._unacked.append(report.seq)
        while len(self._segments) > 1 and self.size_bytes() > self._limit:
            old = self._segments.pop(0)
            records, _ = read_records(old.path)
            self.dropped += sum(1 for r in records if int(r["seq"]) > self._acked)
            old.path.unlink(missing_ok=True)
            self._drop_through(old.last_seq)
            log.warning("metric spool over %d bytes: dropped %s", self._limit, old.path.name)

    def pending(self, limit: int) -> list[NodeReport]:
        out: list[NodeReport] = []
        for seg in self._segments:
            if seg.last_seq <= self._acked:
                continue
            records, _ = read_records(seg.path)
            for rec in records:
                if int(rec["seq"]) > self._acked:
                    out.append(NodeReport.model_validate(rec))
                    if len(out) >= limit:
                        return out
        return out

    def ack(self, last_seq: int) -> None:
        self._acked = max(self._acked, last_seq)
        self._drop_through(self._acked)
        # Whole segments the server holds go at once; normally that is the only segment,
        # so the steady state is one small file recreated each report interval.
        while self._segments and self._segments[0].last_seq <= self._acked:
            with contextlib.suppress(FileNotFoundError):
                self._segments.pop(0).path.unlink()

    def depth(self) -> int:
        """Reports retained and not acknowledged."""
        return len(self._unacked)

    def _drop_through(self, seq: int) -> None:
        while self._unacked and self._unacked[0] <= seq:
            self._unacked.popleft()

    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)


class Spool:
    """Both spools under one state dir."""

    def __init__(self, state_dir: Path, *, metrics_limit_bytes: int) -> None:
        root = state_dir / "spool"
        self.findings = FindingSpool(root)
        self.metrics = MetricSpool(root / "metrics", limit_bytes=metrics_limit_bytes)

    def close(self) -> None:
        self.findings.close()
