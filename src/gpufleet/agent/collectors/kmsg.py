"""Follow the kernel log and turn catalog matches into events, at most once per line.

Three sources, one interface (byte chunks plus a checkpoint to persist afterwards):

* ``/dev/kmsg`` — one record per read, ``prio,seq,usec,flags;message``. The record
  ``seq`` is persisted with the boot id: after an agent restart, records up to it are
  skipped; after a reboot the sequence starts over, and all of the new boot's ring
  buffer is read (a GPU that fell off the bus at probe is in it).
* ``file:PATH`` — a syslog file, followed through inotify (Linux: the directory is
  watched, so a write, a rotation or a truncation wakes the reader at once; a look
  every ``rescan_s`` anyway, in case an event is lost), or polled every ``poll_s``
  where inotify is not available. Rotation (the inode at PATH changes) finishes
  the old file first, then reads the new one from the start; truncation (size below the
  offset) starts over at 0. The (inode, offset) is persisted; if the file rotated while
  the agent was down, the rest of the old file is found by inode next to it
  (``syslog.1``). A first start begins at the end: an old syslog's Xids are history.
* ``journal`` — ``journalctl -k -f -o json``. We keep the cursor of each entry we
  processed ourselves instead of ``--cursor-file``: journalctl writes that file only
  when it exits, so a crash or SIGKILL would report the same lines again.

The checkpoint is written after the matches were handed to ``emit`` (which spools them
durably), so a crash in between may re-read one chunk, never skip one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import datetime as dt
import json
import logging
import os
import struct
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.collectors.base import EmitEvents
from gpufleet.agent.detectors import event_from_match
from gpufleet.agent.settings import KERNEL_BOOT_ID
from gpufleet.core.clock import Clock, SystemClock
from gpufleet.core.signatures.matcher import KernelLogMatcher

log = logging.getLogger(__name__)

Checkpoint = Callable[[], None]


def _write_state(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a crash leaves the old or the new state, never half


def _read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def boot_id() -> str:
    """The running kernel's boot id: /dev/kmsg's sequence numbers start again with it."""
    try:
        return KERNEL_BOOT_ID.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


# inotify(7): the events that may mean new data at PATH, watched on its directory.
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_Q_OVERFLOW = 0x4000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000
_WATCH_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE
) | _IN_DELETE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class DirWatch:
    """An inotify watch on one directory, reporting changes to one file name in it.

    Through ctypes (no dependency): ``inotify_init1`` and ``inotify_add_watch`` from the
    C library. :meth:`open` returns ``None`` where that is not possible (not Linux, no
    such directory, the per-user watch limit reached); the caller then polls.
    """

    def __init__(self, fd: int, name: bytes) -> None:
        self.fd = fd
        self._name = name

    @classmethod
    def open(cls, path: Path) -> DirWatch | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        init1.argtypes, init1.restype = [ctypes.c_int], ctypes.c_int
        add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        add_watch.restype = ctypes.c_int
        fd = init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        directory = os.fsencode(path.parent)  # Path("syslog").parent is Path(".")
        if add_watch(fd, directory, _WATCH_MASK) < 0:
            log.info(
                "cannot watch %s (%s): polling the kernel log instead",
                path.parent,
                os.strerror(ctypes.get_errno()),
            )
            os.close(fd)
            return None
        return cls(fd, os.fsencode(path.name))

    def drain(self) -> bool:
        """Read the queued events; whether one was about the file (or the queue
        overflowed, which may have lost one)."""
        relevant = False
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return relevant
            if not data:
                return relevant
            pos = 0
            while pos + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                pos += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW or name == self._name:
                    relevant = True

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class FileTail:
    """Follow a text log file; see the module docstring for rotation and restarts.

    With inotify a line is read as soon as it is written, and ``rescan_s`` is only how
    often the file is looked at without an event; ``poll_s`` is the poll interval where
    inotify is not available (``watch=False`` forces it).
    """

    path: Path
    state_file: Path
    poll_s: float = 0.2
    chunk_bytes: int = 1 << 20
    rescan_s: float = 5.0
    watch: bool = True

    async def chunks(self) -> AsyncIterator[tuple[bytes, Checkpoint]]:
        watch = DirWatch.open(self.path) if self.watch else None
        if watch is None:
            async for item in self._follow(None):
                yield item
            return
        woken = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(watch.fd, woken.set)
        try:
            async for item in self._follow((watch, woken)):
                yield item
        finally:
            loop.remove_reader(watch.fd)
            watch.close()

    async def _wait(self, watched: tuple[DirWatch, asyncio.Event] | None) -> None:
        """Until the file may have changed: an inotify event, else the poll interval."""
        if watched is None:
            await asyncio.sleep(self.poll_s)
            return
        watch, woken = watched
        deadline = asyncio.get_running_loop().time() + self.rescan_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), left)
            woken.clear()
            # Drained before the file is read again: a write after this wakes us anew.
            if watch.drain():
                return

    async def _follow(
        self, watched: tuple[DirWatch, asyncio.Event] | None
    ) -> AsyncIterator[tuple[bytes, Checkpoint]]:
        state = _read_state(self.state_file)
        fh, inode = self._resume(state)
        offset = fh.tell() if fh else 0
        partial = b""
        if fh is not None:
            # Record where we start, so a restart before the first new line resumes here
            # rather than at the end again (which would skip what came in between).
            self._checkpoint(inode, offset)()
        while True:
            if fh is None:
                fh, inode, offset = self._open_at(0)
            if fh is not None:
                data = fh.read(self.chunk_bytes)
                if data:
                    # Hand on whole lines only, and checkpoint just past them, so a line
                    # being written while we read is read whole after a restart too.
                    partial += data
                    cut = partial.rfind(b"\n") + 1
                    if cut:
                        lines, partial = partial[:cut], partial[cut:]
                        offset += len(lines)
                        yield lines, self._checkpoint(inode, offset)
                    continue
                try:
                    st = os.stat(self.path)
                except FileNotFoundError:
                    st = None
                if st is not None and st.st_ino != inode:
                    fh.close()  # rotated: the old file is read to its end above
                    fh, inode, offset = self._open_at(0)
                    partial = b""
                    continue
                if st is not None and st.st_size < offset + len(partial):
                    fh.seek(0)  # truncated in place (copytruncate)
                    offset, partial = 0, b""
                    continue
            await self._wait(watched)

    def _resume(self, state: dict[str, Any]) -> tuple[Any, int]:
        saved_inode = state.get("inode")
        saved_offset = int(state.get("offset", 0))
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None, 0
        if saved_inode is None:
            fh = self.path.open("rb")
            fh.seek(0, os.SEEK_END)  # first start: the existing file is history
            return fh, st.st_ino
        if st.st_ino == saved_inode:
            fh = self.path.open("rb")
            fh.seek(saved_offset if st.st_size >= saved_offset else 0)
            return fh, st.st_ino
        old = self._find_rotated(int(saved_inode))
        if old is not None:
            log.info("kernel log rotated while stopped: finishing %s first", old)
            fh = old.open("rb")
            fh.seek(saved_offset)
            return fh, int(saved_inode)
        return self.path.open("rb"), st.st_ino

    def _find_rotated(self, inode: int) -> Path | None:
        for candidate in self.path.parent.glob(self.path.name + "*"):
            with contextlib.suppress(OSError):
                if candidate != self.path and candidate.stat().st_ino == inode:
                    return candidate
        return None

    def _open_at(self, offset: int) -> tuple[Any, int, int]:
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return None, 0, 0
        fh.seek(offset)
        return fh, os.fstat(fh.fileno()).st_ino, offset

    def _checkpoint(self, inode: int, offset: int) -> Checkpoint:
        return lambda: _write_state(self.state_file, {"inode": inode, "offset": offset})


@dataclass
class KmsgReader:
    """Read ``/dev/kmsg`` without blocking the loop (the fd is pollable)."""

    state_file: Path
    path: Path = Path("/dev/kmsg")

    async def chunks(self) -> AsyncIterator[tuple[bytes, Checkpoint]]:
        state = _read_state(self.state_file)
        boot = boot_id()
        skip_through = int(state.get("seq", -1)) if state.get("boot_id") == boot else -1
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, ready.set)
        try:
            while True:
                lines, last = read_kmsg_records(
                    lambda: os.read(fd, 8192), skip_through=skip_through
                )
                if last is not None:
                    skip_through = last
                    yield b"".join(lines), self._checkpoint(boot, last)
                    continue
                ready.clear()
                await ready.wait()
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def _checkpoint(self, boot: str, seq: int) -> Checkpoint:
        return lambda: _write_state(self.state_file, {"boot_id": boot, "seq": seq})


def read_kmsg_records(
    read_one: Callable[[], bytes], *, skip_through: int
) -> tuple[list[bytes], int | None]:
    """Drain what ``/dev/kmsg`` has now (``read_one`` returns one record per call, raises
    ``BlockingIOError`` when empty): record lines after ``skip_through`` and the
    highest seq read (None if nothing was read). Continuation lines (`` KEY=value``)
    are dropped: they are device properties, not messages."""
    out: list[bytes] = []
    last: int | None = None
    for _ in range(1024):  # bounded: yield to the loop on a flood
        try:
            record = read_one()
        except BlockingIOError:
            break
        except BrokenPipeError:
            continue  # the ring buffer overwrote records we had not read yet
        if not record:
            break
        head, _, _ = record.partition(b";")
        fields = head.split(b",")
        try:
            seq = int(fields[1])
        except (IndexError, ValueError):
            continue
        last = seq
        if seq <= skip_through:
            continue
        first = record.split(b"\n", 1)[0]
        out.append(first + b"\n")
    return out, last


@dataclass
class JournalReader:
    state_file: Path
    command: tuple[str, ...] = ("journalctl", "-k", "-f", "-o", "json", "--no-pager")

    async def chunks(self) -> AsyncIterator[tuple[bytes, Checkpoint]]:
        cursor = _read_state(self.state_file).get("cursor")
        args = [*self.command, f"--after-cursor={cursor}"] if cursor else [*self.command]
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        assert proc.stdout is not None
        try:
            async for raw in proc.stdout:
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue
                message = entry.get("MESSAGE")
                if not isinstance(message, str):
                    continue  # journald stores non-UTF-8 messages as byte arrays
                cur = str(entry.get("__CURSOR", ""))
                yield (
                    (message + "\n").encode(),
                    lambda c=cur: _write_state(  # type: ignore[misc]
                        self.state_file, {"cursor": c}
                    ),
                )
        finally:
            if proc.returncode is None:
                proc.terminate()
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()


def make_source(spec: str, *, state_dir: Path) -> FileTail | KmsgReader | JournalReader | None:
    """The reader for a ``kernel_log`` setting; ``auto`` prefers /dev/kmsg."""
    if spec == "none":
        return None
    if spec.startswith("file:"):
        return FileTail(Path(spec[5:]), state_dir / "kernel-log-file.json")
    if spec == "kmsg" or (spec == "auto" and os.access("/dev/kmsg", os.R_OK)):
        return KmsgReader(state_dir / "kernel-log-kmsg.json")
    return JournalReader(state_dir / "kernel-log-journal.json")


class KernelLogFollower:
    """The kernel-log event source: reads chunks, matches them, emits events."""

    name = "kmsg"

    def __init__(
        self,
        source: FileTail | KmsgReader | JournalReader,
        *,
        matcher: KernelLogMatcher | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._source = source
        self._matcher = matcher or KernelLogMatcher(year=dt.datetime.now(dt.UTC).year)
        self._clock = clock or SystemClock()
        self.lines_matched = 0

    async def run(self, emit: EmitEvents) -> None:
        async for chunk, checkpoint in self._source.chunks():
            matches = self._matcher.feed_bytes(chunk)
            if matches:
                now = self._clock.now()
                self.lines_matched += len(matches)
                await emit([event_from_match(m, at=now) for m in matches])
            checkpoint()
