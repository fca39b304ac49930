"""The kernel-log prefilter: the lines of a chunk that hold one of the catalog's literals.

Two engines give the same answer (the start offsets of those lines, sorted):

* ``hyperscan`` — all literals in one compiled Hyperscan database, one pass over the
  chunk in C at several GB/s; a match reports where it ends, and its line is found
  around that offset. Chosen when the ``hyperscan`` wheel imports.
* ``python`` — ``bytes.find`` passes, used when it does not (an exotic platform, a
  wheel that fails to load). Finding the literals is most of its cost on a big log, and
  ``bytes.find`` of a 4-byte needle runs at about a byte a cycle, once per literal. So
  on a big chunk each literal is *anchored* on its rarest byte (counted in a sample of
  the chunk): ``bytes.find`` of one byte is ``memchr``, many times faster, and each
  anchor hit is checked with ``startswith`` for every literal sharing that anchor. A
  literal whose rarest byte is common in the chunk (``peermem``: only lowercase
  letters) keeps a plain ``find`` pass; an anchor that turns out commoner than the
  sample said falls back to ``find`` mid-chunk.

Either way the candidate lines are exactly the lines holding a literal. With Hyperscan
the matcher then narrows them down with :class:`HitFinder` (the regexes' required
literals); every engine reports the same findings.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Literal, Protocol

_hs: ModuleType | None
try:
    import hyperscan as _hs
except ImportError:  # pragma: no cover - the wheel is a dependency; this is the fallback
    _hs = None

Engine = Literal["auto", "hyperscan", "python"]
ENGINES: tuple[Engine, ...] = ("auto", "hyperscan", "python")


def hyperscan_available() -> bool:
    return _hs is not None


# What a chunk is read from: bytes, or a read-only mmap of the whole file (``gpufleet
# scan``: a chunk is then ``buf[begin:end]``, with no copy).
Buffer = bytes | mmap.mmap


class LineFinder(Protocol):
    """Finds the lines of ``buf[begin:end]`` that contain any of the literals."""

    name: str

    def line_starts(self, buf: Buffer, end: int, begin: int = 0) -> list[int]:
        """Sorted, distinct offsets (in ``buf``) of those lines' first bytes.

        ``begin`` is 0 or just past a newline, ``end`` too; a line's end is the next
        newline.
        """
        ...


# Chunks up to this size are searched with one find pass per literal (no sampling).
_SMALL_CHUNK = 1 << 16
_SAMPLE = 8192
# Anchor hits per byte above which a plain find pass is cheaper: a hit costs ~200 ns of
# interpreter time, a find pass ~0.7 ns a byte, a memchr pass ~0.1 ns a byte.
_ANCHOR_MAX_RATE = 1 / 400


def _plain_starts(buf: bytes, token: bytes, begin: int, end: int, starts: set[int]) -> None:
    find, rfind = buf.find, buf.rfind
    i = find(token, begin, end)
    while i != -1:
        starts.add(rfind(b"\n", 0, i) + 1)
        i = find(b"\n", i, end)
        i = -1 if i == -1 else find(token, i, end)


def _anchored_starts(
    buf: bytes, anchor: bytes, entries: list[tuple[bytes, int]], end: int, starts: set[int]
) -> None:
    find, rfind, startswith = buf.find, buf.rfind, buf.startswith
    # Past this many hits the sample misjudged the chunk: plain passes finish it from
    # the last hit on (a literal starting before ``i - offset`` had its anchor before i).
    limit = int(end * _ANCHOR_MAX_RATE * 4) + 64
    hits = 0
    i = find(anchor, 0, end)
    if len(entries) == 1:
        [(token, offset)] = entries
        while i != -1:
            hits += 1
            if startswith(token, i - offset) and i >= offset:
                starts.add(rfind(b"\n", 0, i) + 1)
                i = find(b"\n", i, end)
            elif hits > limit:
                break
            i = find(anchor, i + 1, end)
    else:
        while i != -1:
            hits += 1
            for token, offset in entries:
                if startswith(token, i - offset) and i >= offset:
                    starts.add(rfind(b"\n", 0, i) + 1)
                    i = find(b"\n", i, end)
                    break
            else:
                if hits > limit:
                    break
            i = find(anchor, i + 1, end)
    if i != -1:
        for token, offset in entries:
            _plain_starts(buf, token, max(0, i - offset), end, starts)


class PythonLineFinder:
    """``bytes.find`` passes, anchored on rare bytes (the module docstring says how)."""

    name = "python"

    def __init__(self, tokens: tuple[bytes, ...]) -> None:
        self._tokens = tokens
        self._token_bytes = tuple(sorted({b for t in tokens for b in t}))

    def plan(
        self, sample: bytes
    ) -> tuple[list[tuple[bytes, list[tuple[bytes, int]]]], list[bytes]]:
        """How to find the literals in a chunk like ``sample``: anchored or plain passes."""
        size = max(len(sample), 1)
        rate = {b: sample.count(b) / size for b in self._token_bytes}
        anchored: dict[int, list[tuple[bytes, int]]] = {}
        plain: list[bytes] = []
        for token in self._tokens:
            best = min(range(len(token)), key=lambda k: rate[token[k]])
            if rate[token[best]] <= _ANCHOR_MAX_RATE:
                anchored.setdefault(token[best], []).append((token, best))
            else:
                plain.append(token)
        return [(bytes([b]), entries) for b, entries in anchored.items()], plain

    def line_starts(self, buf: Buffer, end: int, begin: int = 0) -> list[int]:
        if begin or not isinstance(buf, bytes):  # the fallback engine: a copy is fine
            return [begin + s for s in self._starts(bytes(buf[begin:end]), end - begin)]
        return self._starts(buf, end)

    def _starts(self, buf: bytes, end: int) -> list[int]:
        starts: set[int] = set()
        if end <= _SMALL_CHUNK:
            for token in self._tokens:
                _plain_starts(buf, token, 0, end, starts)
        else:
            mid = end // 2
            anchored, plain = self.plan(buf[mid : mid + _SAMPLE])
            for anchor, entries in anchored:
                _anchored_starts(buf, anchor, entries, end, starts)
            for token in plain:
                _plain_starts(buf, token, 0, end, starts)
        return sorted(starts)


class _CompiledLiterals:
    """Literals compiled into one Hyperscan block-mode database, scanned in one C pass.

    Scratch space is per thread: the agent's follower and a scan may share the compiled
    program (and this database) from different threads."""

    def __init__(self, literals: list[bytes], flags: list[int] | int) -> None:
        if _hs is None:
            raise RuntimeError("the hyperscan engine needs the hyperscan package")
        self._hs = _hs
        self._db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        self._db.compile(
            expressions=literals,
            ids=list(range(len(literals))),
            elements=len(literals),
            flags=flags,
            literal=True,
        )
        self._local = threading.local()

    def _scan(self, buf: Buffer, end: int, on_match: Callable[..., None], begin: int = 0) -> None:
        """Call ``on_match(id, from, to, flags, context)`` for every literal match in
        ``buf[begin:end]`` (offsets from ``begin``)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._hs.Scratch(self._db)
        view = memoryview(buf)[begin:end]
        try:
            self._db.scan(view, scratch=scratch, match_event_handler=on_match)
        finally:
            view.release()


class HyperscanLineFinder(_CompiledLiterals):
    """All literals in one Hyperscan database; one C pass per chunk."""

    name = "hyperscan"

    def __init__(self, tokens: tuple[bytes, ...]) -> None:
        super().__init__(list(tokens), 0)

    def line_starts(self, buf: Buffer, end: int, begin: int = 0) -> list[int]:
        if end <= begin:
            return []
        ends: list[int] = []
        record = ends.append

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            record(to)

        self._scan(buf, end, on_match, begin)
        return _starts_of(buf, end, ends, begin)


class HitFinder(_CompiledLiterals):
    """The matcher stage: the lines holding one of the regexes' required literals.

    ``literals`` are (bytes, caseless) pairs; the lines of those with an index at or
    past ``first_marked`` are also returned apart (the matcher marks the literals that
    may open a multi-line window). The matcher runs it over the candidate lines only,
    joined (``select_lines``). Hyperscan only: the ``python`` engine gives every
    candidate line to the regexes.
    """

    name = "hyperscan"

    def __init__(self, literals: tuple[tuple[bytes, bool], ...], *, first_marked: int) -> None:
        if any(b"\n" in lit or not lit for lit, _ in literals):
            raise ValueError("matcher literals must be non-empty, one line")
        caseless = 0 if _hs is None else _hs.HS_FLAG_CASELESS
        super().__init__(
            [lit for lit, _ in literals], [caseless if nocase else 0 for _, nocase in literals]
        )
        self._first_marked = first_marked

    @property
    def first_marked(self) -> int:
        return self._first_marked

    def literal_hits(self, buf: bytes, end: int) -> list[tuple[int, int]]:
        """Every literal match in ``buf[:end]``: (offset just past it, literal index),
        by offset. Literals at or past :attr:`first_marked` are the marked ones."""
        if end <= 0:
            return []
        found: list[tuple[int, int]] = []
        record = found.append

        def on_match(lit: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            record((to, lit))

        self._scan(buf, end, on_match)
        found.sort()
        return found


def _starts_of(buf: Buffer, end: int, ends: list[int], begin: int = 0) -> list[int]:
    """The distinct line starts of literal matches ending at ``ends`` (any order, offsets
    from ``begin``, which is 0 or just past a newline)."""
    if not ends:
        return []
    ends.sort()
    starts: list[int] = []
    find, rfind = buf.find, buf.rfind
    line_end = -1
    for rel in ends:
        to = rel + begin
        if to <= line_end:  # another literal in the same line
            continue
        # A literal holds no newline, so the line starts after the newline before it.
        starts.append(rfind(b"\n", begin, to) + 1 or begin)  # -1 + 1: the chunk's first
        line_end = find(b"\n", to - 1, end)
        if line_end == -1:
            line_end = end
    return starts


# Chunks this big or bigger count their newlines with numpy (SIMD compares, ~5 GB/s
# here) instead of ``bytes.count`` (a byte at a time, ~1.2 GB/s: on a big log the
# line numbering cost more than Hyperscan's pass). Below it, numpy's import and per-call
# cost are not worth it (the agent's follower reads a few lines at a time).
_NUMPY_MIN = 1 << 20
_np: ModuleType | None = None
_BLAS_THREADS = "OPENBLAS_NUM_THREADS"
_local = threading.local()
# The compare's buffer kept per thread: a CLI chunk (4 MiB) and the partial line before it.
_SCRATCH = 5 << 20


def _numpy() -> ModuleType | None:
    """numpy, imported on the first big chunk (a tenth of a second: not at start-up).

    Its OpenBLAS starts a thread per CPU when it loads, which costs as much CPU as the
    import again; nothing here multiplies matrices, so it loads with one (the variable
    is put back afterwards: child processes see the caller's environment).
    """
    global _np
    if _np is None:
        prior = os.environ.get(_BLAS_THREADS)
        os.environ[_BLAS_THREADS] = "1"
        try:
            import numpy
        except ImportError:  # pragma: no cover - a dependency; bytes.count is the fallback
            return None
        finally:
            if prior is None:
                del os.environ[_BLAS_THREADS]
            else:
                os.environ[_BLAS_THREADS] = prior
        _np = numpy
    return _np


def newlines_before(
    buf: Buffer, end: int, starts: list[int], begin: int = 0
) -> tuple[list[int], int]:
    """For each offset of ``starts`` (sorted, each in ``[begin, end]``), the newlines in
    ``buf[begin:]`` before it; and the newlines of ``buf[begin:end]``.

    On a big chunk one vectorised compare over it, then a count of each gap's slice of
    it (faster than listing the newlines' positions); ``bytes.count`` on a small one.
    """
    np = _numpy() if end - begin >= _NUMPY_MIN else None
    if np is None:
        if not isinstance(buf, bytes):  # an mmap has no count(); a small chunk's copy
            chunk = bytes(buf[begin:end])
            return newlines_before(chunk, end - begin, [s - begin for s in starts])
        out: list[int] = []
        number, pos = 0, begin
        count = buf.count
        for start in starts:
            number += count(b"\n", pos, start)
            out.append(number)
            pos = start
        return out, number + count(b"\n", pos, end)
    # The compare writes into a buffer kept per thread (used only within this call): a
    # fresh 4 MiB array a chunk costs its page faults, about as much as the compare. A
    # chunk bigger than the kept size gets an array of its own, freed with it.
    size = end - begin
    scratch = getattr(_local, "newline", None)
    if scratch is None:
        scratch = _local.newline = np.empty(_SCRATCH, dtype=bool)
    if size > len(scratch):
        scratch = np.empty(size, dtype=bool)
    chunk = np.frombuffer(buf, np.uint8, count=size, offset=begin)
    newline = np.equal(chunk, 10, out=scratch[:size])
    del chunk  # the mmap cannot be closed while a view of it is alive
    out = []
    number = pos = 0
    count_nonzero = np.count_nonzero
    for start in starts:
        number += int(count_nonzero(newline[pos : start - begin]))
        out.append(number)
        pos = start - begin
    return out, number + int(count_nonzero(newline[pos:size]))


def uses_hyperscan(engine: Engine) -> bool:
    """Whether ``engine`` resolves to Hyperscan here (``auto``: when it imports)."""
    return engine == "hyperscan" or (engine == "auto" and _hs is not None)


def make_line_finder(tokens: tuple[bytes, ...], engine: Engine = "auto") -> LineFinder:
    """The line finder for ``engine``; ``auto`` is Hyperscan when it imports."""
    if not uses_hyperscan(engine):
        return PythonLineFinder(tokens)
    return HyperscanLineFinder(tokens)
