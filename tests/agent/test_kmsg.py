from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpufleet.agent.collectors.base import Event
from gpufleet.agent.collectors.kmsg import (
    DirWatch,
    FileTail,
    KernelLogFollower,
    read_kmsg_records,
)

PREFIX = "Dec  2 10:43:35 gpu-node-07 kernel: [240314.528856] "


def xid_line(n: int, bus: str = "3b") -> str:
    return f"{PREFIX}NVRM: Xid (PCI:0000:{bus}:00): {n}, pid='<unknown>', name=<unknown>, x\n"


class Follow:
    """Run a follower on a file in the background and collect what it emits."""

    def __init__(self, log: Path, state: Path, tail: FileTail | None = None) -> None:
        self.events: list[Event] = []
        self._follower = KernelLogFollower(tail or FileTail(log, state, poll_s=0.005))
        self._task: asyncio.Task[None] | None = None

    async def _emit(self, events: list[Event]) -> None:
        self.events.extend(events)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follower.run(self._emit))
        await asyncio.sleep(0.05)  # let it open the file and checkpoint its position

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def wait(self, n: int) -> list[int | None]:
        for _ in range(500 if n else 0):
            if len(self.events) >= n:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and nothing more arrives
        return [e.xid for e in self.events]


@pytest.fixture
async def paths(tmp_path: Path) -> AsyncIterator[tuple[Path, Path]]:
    yield tmp_path / "syslog", tmp_path / "state.json"


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


async def test_first_start_skips_history_then_follows(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text(xid_line(13))
    f = Follow(log, state)
    await f.start()
    append(log, "unrelated line\n" + xid_line(79))
    assert await f.wait(1) == [79]
    assert f.events[0].pci_bus_id == "0000:3b:00.0"
    await f.stop()


async def test_restart_does_not_report_old_lines(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state)
    await f.start()
    append(log, xid_line(79))
    assert await f.wait(1) == [79]
    await f.stop()
    append(log, xid_line(48))  # written while the agent was down
    g = Follow(log, state)
    await g.start()
    assert await g.wait(1) == [48]
    await g.stop()


async def test_partial_line_is_read_whole_after_restart(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state)
    await f.start()
    line = xid_line(79)
    append(log, line[:30])
    await asyncio.sleep(0.05)
    await f.stop()
    append(log, line[30:])
    g = Follow(log, state)
    await g.start()
    assert await g.wait(1) == [79]
    await g.stop()


def _has_inotify() -> bool:
    watch = DirWatch.open(Path(__file__))
    if watch is None:
        return False
    watch.close()
    return True


needs_inotify = pytest.mark.skipif(not _has_inotify(), reason="no inotify on this platform")


def _never_polls(log: Path, state: Path) -> FileTail:
    # An hour between looks: whatever arrives within the test came from an inotify event.
    return FileTail(log, state, poll_s=3600, rescan_s=3600)


@needs_inotify
async def test_an_appended_line_arrives_without_waiting_for_a_poll(
    paths: tuple[Path, Path],
) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state, _never_polls(log, state))
    await f.start()
    append(log, xid_line(79))
    assert await f.wait(1) == [79]
    append(log, "unrelated\n")
    append(log, xid_line(13))
    assert await f.wait(2) == [79, 13]
    await f.stop()


@needs_inotify
async def test_rotation_and_truncation_wake_the_follower(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state, _never_polls(log, state))
    await f.start()
    append(log, xid_line(31))
    assert await f.wait(1) == [31]
    os.rename(log, log.with_name("syslog.1"))
    log.write_text(xid_line(48))
    assert await f.wait(2) == [31, 48]
    log.write_text(xid_line(8))  # truncated in place, then a shorter line
    assert await f.wait(3) == [31, 48, 8]
    await f.stop()


async def test_without_inotify_the_file_is_polled(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state, FileTail(log, state, poll_s=0.005, watch=False))
    await f.start()
    append(log, xid_line(79))
    assert await f.wait(1) == [79]
    await f.stop()


@needs_inotify
def test_the_watch_reports_only_its_own_file(tmp_path: Path) -> None:
    watch = DirWatch.open(tmp_path / "syslog")
    assert watch is not None
    try:
        (tmp_path / "other.log").write_text("x\n")
        assert not watch.drain()
        (tmp_path / "syslog").write_text("x\n")
        assert watch.drain()
        assert not watch.drain()  # drained
    finally:
        watch.close()


async def test_rotation_while_running(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state)
    await f.start()
    append(log, xid_line(31))
    assert await f.wait(1) == [31]
    append(log, xid_line(43))
    os.rename(log, log.with_name("syslog.1"))
    log.write_text(xid_line(48))
    assert sorted(x or 0 for x in await f.wait(3)) == [31, 43, 48]
    await f.stop()


async def test_rotation_while_stopped(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state)
    await f.start()
    append(log, xid_line(31))
    assert await f.wait(1) == [31]
    await f.stop()
    append(log, xid_line(43))  # the end of the old file, never read
    os.rename(log, log.with_name("syslog.1"))
    log.write_text(xid_line(48))
    g = Follow(log, state)
    await g.start()
    assert await g.wait(2) == [43, 48]
    await g.stop()
    h = Follow(log, state)  # and once more: nothing is re-reported
    await h.start()
    assert await h.wait(0) == []
    await h.stop()


async def test_truncation_starts_over(paths: tuple[Path, Path]) -> None:
    log, state = paths
    log.write_text("")
    f = Follow(log, state)
    await f.start()
    append(log, xid_line(31) * 3)
    assert await f.wait(3) == [31, 31, 31]
    with log.open("r+") as fh:
        fh.truncate(0)  # copytruncate
    await asyncio.sleep(0.05)
    append(log, xid_line(79))
    assert (await f.wait(4))[-1] == 79
    await f.stop()


def test_kmsg_records_after_saved_seq() -> None:
    records = iter(
        [
            b"4,100,5000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, fell off\n",
            b"6,101,5001,-;usb 1-1: new device\n SUBSYSTEM=usb\n DEVICE=c189:1\n",
            b"4,102,5002,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n",
        ]
    )

    def read_one() -> bytes:  # /dev/kmsg: one record per read, EAGAIN when drained
        try:
            return next(records)
        except StopIteration:
            raise BlockingIOError from None

    lines, last = read_kmsg_records(read_one, skip_through=100)
    assert last == 102
    assert lines == [
        b"6,101,5001,-;usb 1-1: new device\n",
        b"4,102,5002,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n",
    ]
