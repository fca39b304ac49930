"""The prefilter engines: Hyperscan and the ``bytes.find`` fallback find the same lines.

Both are checked against the plain definition (a candidate is a line holding one of the
catalog's literals), and the matches built on them against each other: on the recorded
logs, on a generated log with noise, and on the awkward shapes a byte stream has (CRLF,
no final newline, a line split across chunks, bytes that are not UTF-8).
"""

from __future__ import annotations

import mmap
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpufleet.agent.collectors.base import Event
from gpufleet.agent.collectors.kmsg import KernelLogFollower
from gpufleet.core.signatures import prefilter
from gpufleet.core.signatures.matcher import (
    KernelLogMatcher,
    Match,
    _program,
    find_candidates,
)
from gpufleet.core.signatures.prefilter import (
    HyperscanLineFinder,
    PythonLineFinder,
    make_line_finder,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kernel-logs"
RECORDED = sorted(FIXTURES.glob("*.log"))

needs_hyperscan = pytest.mark.skipif(
    not prefilter.hyperscan_available(), reason="the hyperscan wheel is not installed"
)
# Without the wheel, both runs take the fallback: the comparison still passes, trivially.
ENGINES = ["hyperscan", "python"] if prefilter.hyperscan_available() else ["python"]


def _noisy_log(seed: int, lines: int = 30_000) -> bytes:
    """Recorded sick lines scattered in noise that holds parts of literals, not literals."""
    rng = random.Random(seed)
    sick = (FIXTURES / "reference-1.10.log").read_bytes().splitlines()
    noise = [
        b"[ 12.5] usb 1-1: new high-speed USB device number 3 using xhci_hcd",
        b"[ 12.6] NVR: not a literal, nor is SXi or mlx or AER without its colon",
        b"[ 12.7] nvrm in lower case, PCIe bandwith misspelt, peermen, libncc",
        b"Mar  5 10:12:01 gpu-7 kernel: [ 99.000001] EXT4-fs (nvme0n1p2): mounted",
        b"2024-03-05T10:12:01.123456+0000 gpu-7 kernel: eth0: link becomes ready",
    ]
    out = [rng.choice(noise) for _ in range(lines)]
    for i, line in enumerate(sick):
        out.insert(rng.randrange(len(out)) if i % 3 else 500 + i * 7, line)
    return b"\n".join(out) + b"\n"


def _oracle_starts(buf: bytes, end: int) -> list[int]:
    tokens = _program(None).btokens
    starts, pos = [], 0
    for line in buf[:end].split(b"\n")[:-1]:
        if any(t in line for t in tokens):
            starts.append(pos)
        pos += len(line) + 1
    return starts


def _scan(data: bytes, engine: str, chunk: int) -> list[Match]:
    matcher = KernelLogMatcher(engine=engine)  # type: ignore[arg-type]
    out: list[Match] = []
    for i in range(0, len(data), chunk):
        out.extend(matcher.feed_bytes(data[i : i + chunk]))
    return out + matcher.finish()


def _inputs() -> list[tuple[str, bytes]]:
    recorded = [(p.name, p.read_bytes()) for p in RECORDED]
    return [*recorded, ("noisy", _noisy_log(1)), ("noisy-2", _noisy_log(2, 5_000))]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("name", "data"), _inputs(), ids=[n for n, _ in _inputs()])
def test_candidate_lines_are_the_lines_holding_a_literal(
    name: str, data: bytes, engine: str
) -> None:
    finder = make_line_finder(_program(None).btokens, engine)  # type: ignore[arg-type]
    end = data.rfind(b"\n") + 1
    assert finder.line_starts(data, end) == _oracle_starts(data, end)
    # A small chunk takes the fallback's plain passes, a big one its anchored passes.
    small = data[: data.rfind(b"\n", 0, 60_000) + 1]
    assert finder.line_starts(small, len(small)) == _oracle_starts(small, len(small))


def test_the_recorded_logs_are_there() -> None:
    assert {p.name for p in RECORDED} >= {"reference-1.10.log", "healthy-boot.log"}


@pytest.mark.parametrize(("name", "data"), _inputs(), ids=[n for n, _ in _inputs()])
def test_engines_report_the_same_matches(name: str, data: bytes) -> None:
    reference = _scan(data, "python", 1 << 22)
    if name != "healthy-boot.log":
        assert reference
    for engine in ENGINES:
        # 4 MiB: the whole log at once; odd sizes split lines, and matches, across chunks.
        for chunk in (1 << 22, 65_537, 4_099, 97):
            assert _scan(data, engine, chunk) == reference, (engine, chunk)


@pytest.mark.parametrize("engine", ENGINES)
def test_crlf_missing_final_newline_and_bad_bytes(engine: str) -> None:
    lf = _noisy_log(3, 3_000)
    crlf = lf.replace(b"\n", b"\r\n")
    no_final = lf[:-1]
    # Latin-1 and stray continuation bytes inside candidate lines and around them.
    bad = lf.replace(b"NVRM: Xid", b"\xe9\xff NVRM: Xid").replace(b"usb 1-1", b"usb \x80\xc3")
    for data in (crlf, no_final, bad):
        want = _scan(data, "python", 1 << 22)
        assert want
        for chunk in (1 << 22, 8_191, 13):
            assert _scan(data, engine, chunk) == want, chunk
    # CRLF lines give the same findings as LF ones, with the carriage return dropped.
    assert [m.line for m in _scan(crlf, engine, 8_191)] == [m.line for m in _scan(lf, engine, 97)]
    # The final line without a newline is matched by finish().
    tail = b"x\n[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    matcher = KernelLogMatcher(engine=engine)  # type: ignore[arg-type]
    assert matcher.feed_bytes(tail) == []
    [m] = matcher.finish()
    assert (m.xid, m.line_number) == (79, 2)


def test_find_candidates_numbers_lines_the_same_on_every_engine() -> None:
    data = _noisy_log(4)
    end = data.rfind(b"\n") + 1
    found = {e: find_candidates(data, end, program=_program(None, e)) for e in ENGINES}  # type: ignore[arg-type]
    want = find_candidates(data, end, program=_program(None, "python"))
    assert all(v == want for v in found.values())
    lines = data.split(b"\n")
    assert all(lines[n - 1] == raw for n, raw in want[0])
    assert want[1] == data.count(b"\n")


def test_auto_falls_back_to_python_without_hyperscan(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = _program(None).btokens
    monkeypatch.setattr(prefilter, "_hs", None)
    assert not prefilter.hyperscan_available()
    assert isinstance(make_line_finder(tokens, "auto"), PythonLineFinder)
    with pytest.raises(RuntimeError, match="hyperscan"):
        make_line_finder(tokens, "hyperscan")


@needs_hyperscan
def test_auto_is_hyperscan_when_it_imports() -> None:
    assert isinstance(make_line_finder(_program(None).btokens, "auto"), HyperscanLineFinder)
    assert _program(None).finder.name == "hyperscan"


@needs_hyperscan
def test_threads_share_one_compiled_database() -> None:
    data = _noisy_log(5)
    end = data.rfind(b"\n") + 1
    finder = _program(None, "hyperscan").finder
    want = _oracle_starts(data, end)
    results: list[bool] = []

    def work() -> None:
        results.extend(finder.line_starts(data, end) == want for _ in range(20))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 80


class _Chunks:
    """A follower source that hands over a byte stream in fixed chunks."""

    def __init__(self, data: bytes, size: int) -> None:
        self._data, self._size = data, size

    async def chunks(self) -> AsyncIterator[tuple[bytes, object]]:
        for i in range(0, len(self._data), self._size):
            yield self._data[i : i + self._size], lambda: None


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_agent_follower_finds_what_scan_finds(engine: str) -> None:
    data = _noisy_log(6)
    events: list[Event] = []

    async def emit(batch: list[Event]) -> None:
        events.extend(batch)

    matcher = KernelLogMatcher(engine=engine)  # type: ignore[arg-type]
    follower = KernelLogFollower(_Chunks(data, 10_007), matcher=matcher)  # type: ignore[arg-type]
    await follower.run(emit)
    want = _scan(data, "python", 1 << 22)
    assert [(e.signature_id, e.xid) for e in events] == [(m.signature, m.xid) for m in want]
    # Without a matcher of its own, the follower compiles the same engine as scan.
    default = KernelLogFollower(_Chunks(b"", 1), matcher=None)  # type: ignore[arg-type]
    assert default._matcher._program is _program(None)


def test_newline_counts_of_a_big_chunk_are_bytes_count() -> None:
    """A chunk of 1 MiB or more is counted with numpy (a dependency: it must import);
    every gap gives what ``bytes.count`` gives, the chunk's ends included."""
    assert prefilter._numpy() is not None
    rng = random.Random(7)
    data = _noisy_log(5, 40_000)
    end = data.rfind(b"\n") + 1
    assert end >= prefilter._NUMPY_MIN
    for starts in (
        [],
        [0],
        [0, 0, 1, end - 1, end],
        sorted(rng.randrange(end + 1) for _ in range(2_000)),
    ):
        before, total = prefilter.newlines_before(data, end, starts)
        assert before == [data.count(b"\n", 0, s) for s in starts]
        assert total == data.count(b"\n", 0, end)
    # The next chunk of the thread reuses the compare's buffer: a shorter one, then one
    # with newlines where the first had none, count their own bytes only.
    short = data[: data.rfind(b"\n", 0, end // 2) + 1].replace(b"\n", b" ", 1_000)
    assert prefilter.newlines_before(short, len(short), [])[1] == short.count(b"\n")
    # ``end`` before the buffer's end: what lies past it is not counted.
    assert prefilter.newlines_before(data, end // 2, [])[1] == data.count(b"\n", 0, end // 2)


def test_a_chunk_bigger_than_the_kept_buffer_counts_in_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    monkeypatch.setattr(prefilter, "_local", threading.local())
    kept = prefilter._NUMPY_MIN * 3 // 2
    monkeypatch.setattr(prefilter, "_SCRATCH", kept)
    data = _noisy_log(8, 40_000)
    end = data.rfind(b"\n") + 1
    assert end > kept
    starts = sorted(random.Random(8).randrange(end + 1) for _ in range(500))
    before, total = prefilter.newlines_before(data, end, starts)
    assert (before, total) == ([data.count(b"\n", 0, s) for s in starts], data.count(b"\n"))
    assert len(prefilter._local.newline) == kept  # the kept one stayed its size
    small = data[: data.rfind(b"\n", 0, kept) + 1]  # numpy's, in the kept buffer
    assert prefilter._NUMPY_MIN <= len(small) <= kept
    assert prefilter.newlines_before(small, len(small), [])[1] == small.count(b"\n")


def test_line_numbers_agree_below_and_above_the_numpy_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _noisy_log(6, 40_000)
    end = data.rfind(b"\n") + 1
    big = find_candidates(data, end, program=_program(None))
    scanned = _scan(data, "auto", 1 << 22)
    monkeypatch.setattr(prefilter, "_NUMPY_MIN", 1 << 62)
    assert find_candidates(data, end, program=_program(None)) == big
    assert _scan(data, "auto", 1 << 22) == scanned


@pytest.mark.parametrize("prior", [None, "4"])
def test_numpy_loads_with_one_blas_thread_and_leaves_the_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch, prior: str | None
) -> None:
    import os

    seen: list[str | None] = []
    real_import = __import__

    def spy(name: str, *args: object, **kwargs: object) -> object:
        if name == "numpy":
            seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    if prior is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", prior)
    monkeypatch.setattr(prefilter, "_np", None)
    monkeypatch.setattr("builtins.__import__", spy)
    assert prefilter._numpy() is not None
    assert seen == ["1"]
    assert os.environ.get("OPENBLAS_NUM_THREADS") == prior


@pytest.mark.parametrize("size", [4_000, 2 << 20])  # bytes.count, then numpy
def test_newlines_of_a_range_of_a_mapped_file(tmp_path: Path, size: int) -> None:
    data = _noisy_log(9, 60_000)
    log = tmp_path / "kern.log"
    log.write_bytes(data)
    begin = data.index(b"\n", 100_000) + 1
    end = data.rindex(b"\n", 0, begin + size) + 1
    rng = random.Random(size)
    starts = sorted({begin, end, *(rng.randrange(begin, end + 1) for _ in range(300))})
    with log.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        before, total = prefilter.newlines_before(mm, end, starts, begin)
        # Each engine finds the lines holding a literal in the mapped range, in place.
        want = [begin + s for s in _oracle_starts(data[begin:end], end - begin)]
        for engine in ENGINES:
            finder = make_line_finder(_program(None).btokens, engine)  # type: ignore[arg-type]
            assert finder.line_starts(mm, end, begin) == want
    assert before == [data.count(b"\n", begin, s) for s in starts]
    assert total == data.count(b"\n", begin, end)
