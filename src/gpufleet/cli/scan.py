"""``gpufleet scan FILE|-``: the failure signatures in a saved kernel log.

The first thing an operator runs on a dump from a sick node. Reads dmesg, ``dmesg -T``,
journal and syslog exports (gzip too), needs no server and no login. A big plain file is
matched in one process per CPU, over line-aligned ranges (:func:`scan_file_parallel`),
with the same output as one pass.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import itertools
import json
import math
import mmap
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring as _encode_str  # the C one where built
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Annotated, BinaryIO, TypeVar, cast

import typer
from rich.text import Text

from gpufleet.cli.output import (
    SEVERITY_STYLES,
    OutputFormat,
    OutputOpt,
    note,
    plain,
    print_table,
    styled,
    table,
)
from gpufleet.core.signatures.matcher import KernelLogMatcher, Match, find_candidates

# Large reads keep the prefilter's bytes.find passes long; 4 MiB is a few ms of work.
_CHUNK = 4 << 20
# ``--jobs 0``: a file this big or bigger is split, one range per CPU (each at least
# this big); below, a second process costs more to start than it saves.
_PARALLEL_MIN = 64 << 20
_MAX_AUTO_JOBS = 8


def _usage_error(message: str) -> Exception:
    # cli.errors imports httpx (a tenth of a second) for the API commands' errors; a
    # scan needs it only when it fails, so it is imported then, not at start-up.
    from gpufleet.cli.errors import CliError

    return CliError(message)


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    file = Path(path)
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise _usage_error(f"{path} {what}; give a saved kernel log file, or - for stdin")
    try:
        raw = file.open("rb")
    except OSError as exc:
        raise _usage_error(f"cannot read {path}: {exc.strerror}") from exc
    if raw.read(2) == b"\x1f\x8b":
        raw.close()
        return cast(BinaryIO, gzip.open(file, "rb"))
    raw.seek(0)
    return raw


def scan_stream(stream: BinaryIO) -> list[Match]:
    matcher = KernelLogMatcher()
    found: list[Match] = []
    while chunk := stream.read(_CHUNK):
        found.extend(matcher.feed_bytes(chunk))
    found.extend(matcher.finish())
    return found


@dataclass(slots=True)
class _Range:
    """What one worker found in its byte range of the file (``scan_file_parallel``).

    Line numbers are the range's own, from 1; ``emits`` the number of the line that
    completed each match. ``spill``: the messages of the range's open windows that lines
    past its end completed (numbered on from the range's lines); ``uuids`` the PCI →
    UUID map at the range's end.
    """

    matches: list[Match]
    emits: list[int]
    spill: list[Match]
    spill_emits: list[int]
    uuids: dict[str, str]
    newlines: int


def _scan_range(path: str, begin: int, end: int, *, last: bool) -> _Range:
    """Match ``path[begin:end]`` (whole lines) with a fresh matcher, then follow its open
    windows past ``end``.

    The file is mapped, not read: the matcher's passes run over the page cache in place
    (a read copies each chunk into a fresh buffer first).
    """
    with _no_gc(), open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # emptied since it was split: no mapping
            return _Range([], [], [], [], {}, 0)
        return _scan_file(f, begin, end, last=last)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off: a scan's matches, lines and tuples hold no
    cycles, and its passes over the growing heap took a tenth of the scan's time
    (``scan`` turns it off for the whole command; a worker process of its own)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _scan_file(f: BinaryIO, begin: int, end: int, *, last: bool) -> _Range:
    matcher = KernelLogMatcher()
    matches: list[Match] = []
    emits: list[int] = []
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        end = min(end, len(mm))  # the file may have shrunk since it was split
        pos = begin
        while pos < end:
            stop = min(pos + _CHUNK, end)
            cut = mm.rfind(b"\n", pos, stop) + 1
            if cut <= pos:  # a line longer than a chunk: the chunk runs to its end
                cut = mm.find(b"\n", stop, end) + 1
            if cut <= pos:  # the last line, without a newline
                matches.extend(matcher.feed_bytes(mm[pos:end], emits=emits))
                break
            matches.extend(matcher.feed_range(mm, pos, cut, emits=emits))
            pos = cut
        if last:
            numbered = matcher.line_count + 1
            found = matcher.finish()
            matches.extend(found)
            emits.extend([numbered] * len(found))
        newlines = matcher.line_count
        uuids = matcher.uuid_map()
        spill: list[Match] = []
        spill_emits: list[int] = []
        if not last and matcher.windows_open():
            f.seek(end)
            _follow_windows(f, matcher, newlines, spill, spill_emits)
    return _Range(matches, emits, spill, spill_emits, uuids, newlines)


def _follow_windows(
    f: BinaryIO, matcher: KernelLogMatcher, numbered: int, out: list[Match], emits: list[int]
) -> None:
    """Give the candidate lines from ``f``'s position on to ``matcher``'s open windows
    until they close (a window spans a few candidate lines)."""
    tail = b""
    while matcher.windows_open():
        chunk = f.read(_CHUNK)
        buf = tail + chunk
        if not chunk:
            if not buf:
                return
            buf += b"\n"
        cut = buf.rfind(b"\n") + 1
        tail = buf[cut:]
        lines, count = find_candidates(buf, cut)
        for number, raw in lines:
            found = matcher.continue_windows(raw.decode("utf-8", errors="replace"))
            out.extend(found)
            emits.extend([numbered + number] * len(found))
            if not matcher.windows_open():
                return
        numbered += count


# The first range's share of an equal split. Its process (the caller) starts first, and
# once the scans end it has less to do: a worker then pickles its part of the document
# and sends it through a pipe (a few hundredths of a second a GB), which the caller reads.
_FIRST_SHARE = 1.05


def _split(path: str, size: int, jobs: int) -> list[tuple[int, int]]:
    """``jobs`` byte ranges, each a whole number of lines: the first a little bigger
    (:data:`_FIRST_SHARE`), the others of equal size."""
    cuts = [0]
    first = min(size, size * _FIRST_SHARE / jobs)
    with open(path, "rb") as f:
        for k in range(1, jobs):
            at = max(int(first + (size - first) * (k - 1) / (jobs - 1)), cuts[-1])
            f.seek(at)
            f.readline()  # to the start of the next line
            cuts.append(min(f.tell(), size))
    cuts.append(size)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


# A finding as printed: the match, its line number in the file, the GPU's UUID.
Found = tuple[Match, int | None, str | None]


def scan_file_parallel(path: str, jobs: int) -> list[Found]:
    """Match ``jobs`` line-aligned byte ranges in parallel (this process takes the
    first); the same findings, in the same order, as one pass.

    Each range starts with a fresh matcher, so what one pass carries from line to line
    is put back here: line numbers are offset by the lines before the range; a match
    whose GPU UUID the range did not know takes it from the ranges before; a multi-line
    message open at a range's end is followed past it by the same worker and placed
    before the matches of the line that completed it (it is older than any window the
    next range opened).
    """
    _, found = _parallel(path, jobs, render=False, finish=_found)
    return found


def _found(m: Match, number: int | None, uuid: str | None) -> Found:
    return m, number, uuid


def scan_file_json(path: str, jobs: int) -> str:
    """:func:`findings_json` of :func:`scan_file_parallel`, the objects written by the
    workers: each, once told the lines and UUIDs of the ranges before its own, sends its
    part of the array as one string."""
    return "".join(_json_pieces(path, jobs))


def _json_pieces(path: str, jobs: int) -> list[str]:
    """:func:`scan_file_json`'s text in pieces, to be written one after the other (one
    string of them all would be copied once more: a few hundredths of a second a GB)."""
    texts, objects = _parallel(path, jobs, render=True, finish=_json_object)
    return _array_pieces([t for t in texts if t] + objects)


_T = TypeVar("_T")
# A finished match keyed for the sort that puts windows followed past a range's end in
# place: (the line that completed it, its range, its place in the range, the match).
_Keyed = list[tuple[int, int, int, _T]]


@dataclass(frozen=True, slots=True)
class _Summary:
    """What a range tells before its matches: its newlines, the PCI → UUID map at its
    end, and whether it followed a window past its end."""

    newlines: int
    uuids: dict[str, str]
    spilled: bool


@dataclass(frozen=True, slots=True)
class _Place:
    """What a range is told back: the lines and the UUIDs of the ranges before it, and
    whether to send its JSON objects as text (else its matches, to be sorted with the
    windows followed into it)."""

    offset: int
    known: dict[str, str]
    as_text: bool


def _placed(
    matches: Iterable[Match], place: _Place
) -> Iterator[tuple[Match, int | None, str | None]]:
    """Each match with its line number in the file and its GPU UUID (one printed in a
    range before this one filled in)."""
    offset, known = place.offset, place.known
    for m in matches:
        uuid, number = m.gpu_uuid, m.line_number
        if uuid is None and m.pci is not None:
            uuid = known.get(m.pci)
        yield m, None if number is None else number + offset, uuid


def _finished(
    r: _Range, k: int, place: _Place, finish: Callable[[Match, int | None, str | None], _T]
) -> _Keyed[_T]:
    """``r``'s matches given to ``finish`` with their :func:`_placed` line numbers and
    UUIDs, keyed."""
    placed = _placed(itertools.chain(r.matches, r.spill), place)
    emits = itertools.chain(r.emits, r.spill_emits)
    return [
        (emit + place.offset, k, seq, finish(*found))
        for seq, (found, emit) in enumerate(zip(placed, emits, strict=True))
    ]


def _range_text(r: _Range, place: _Place) -> str:
    """The JSON objects of a range without windows past its end, in order, joined."""
    return ",\n".join(_json_object(*found) for found in _placed(r.matches, place))


def _range_worker(conn: Connection, path: str, begin: int, end: int, *, last: bool) -> None:
    """A worker process: scan a range, send its :class:`_Summary`, wait for its
    :class:`_Place`, send its text or its matches (or the exception that stopped it)."""
    try:
        r = _scan_range(path, begin, end, last=last)
        conn.send(_Summary(r.newlines, r.uuids, bool(r.spill)))
        place = conn.recv()
        conn.send(_range_text(r, place) if place.as_text else r)
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        with contextlib.suppress(Exception):  # unpicklable: the parent sees the pipe close
            conn.send(exc)
    finally:
        conn.close()


def _received(conn: Connection, what: str) -> object:
    try:
        got = conn.recv()
    except EOFError:  # the worker died without a word (killed, out of memory)
        raise OSError(f"a scan worker process exited before it sent its {what}") from None
    if isinstance(got, BaseException):
        raise got
    return got


def _parallel(
    path: str,
    jobs: int,
    *,
    render: bool,
    finish: Callable[[Match, int | None, str | None], _T],
) -> tuple[list[str], list[_T]]:
    """The ranges' matches in order, each given to ``finish`` with its line number and
    UUID. With ``render``, the ranges before any window followed past a range's end
    send their JSON objects joined, one string each (the texts, first); the ranges from
    there on send their matches, finished and sorted here.

    The ranges after the first are matched in forked processes (they start with this
    process's imports; a spawned one would import them again, a tenth of a second);
    each is told its line offset and the UUIDs before it as soon as the ranges before
    it are done, and writes its own findings while the others still run.
    """
    size = os.path.getsize(path)
    ranges = _split(path, size, jobs)
    if not ranges:
        return [], []
    last = len(ranges) - 1
    ctx = multiprocessing.get_context("fork")
    workers: list[tuple[BaseProcess, Connection]] = []
    try:
        for k, (a, b) in enumerate(ranges[1:], 1):
            mine, theirs = ctx.Pipe()
            worker: BaseProcess = ctx.Process(
                target=_range_worker,
                args=(theirs, path, a, b),
                kwargs={"last": k == last},
                daemon=True,
            )
            worker.start()
            theirs.close()
            workers.append((worker, mine))
        first = _scan_range(path, *ranges[0], last=last == 0)
        found = _put_together(first, workers, render=render, finish=finish)
    except BaseException:
        for proc, conn in workers:
            conn.close()
            proc.kill()  # it may be waiting for its place, or still scanning
            proc.join()
        raise
    # Each worker has sent all it had and is exiting: unmapping the file and freeing its
    # heap take it a few hundredths of a second, which the caller need not wait for.
    for proc, conn in workers:
        conn.close()
        _exiting.append(proc)
    return found


_exiting: list[BaseProcess] = []


def reap_workers() -> None:
    """Wait for the worker processes of the scans done so far to exit (they have sent
    all they found; ``scan`` calls this once its output is written)."""
    while _exiting:
        _exiting.pop().join()


def _put_together(
    first: _Range,
    workers: list[tuple[BaseProcess, Connection]],
    *,
    render: bool,
    finish: Callable[[Match, int | None, str | None], _T],
) -> tuple[list[str], list[_T]]:
    texts: list[str] = []
    keyed: _Keyed[_T] = []
    places: list[_Place] = []
    offset = 0
    known: dict[str, str] = {}
    spilled = False
    summaries = itertools.chain(
        [_Summary(first.newlines, first.uuids, bool(first.spill))],
        (cast(_Summary, _received(conn, "summary")) for _, conn in workers),
    )
    for k, summary in enumerate(summaries):
        spilled = spilled or summary.spilled
        place = _Place(offset, dict(known), render and not spilled)
        places.append(place)
        if k:
            workers[k - 1][1].send(place)
        known.update(summary.uuids)
        offset += summary.newlines
    for k, place in enumerate(places):
        got = _received(workers[k - 1][1], "findings") if k else first
        if place.as_text:
            texts.append(got if isinstance(got, str) else _range_text(cast(_Range, got), place))
        else:
            keyed.extend(_finished(cast(_Range, got), k, place, finish))
    if spilled:
        keyed.sort(key=lambda item: item[:3])
    return texts, [item[3] for item in keyed]


def _auto_jobs(size: int) -> int:
    """Processes for a plain file of ``size`` bytes: one per CPU on a big file."""
    if size < _PARALLEL_MIN:
        return 1
    return max(1, min(os.cpu_count() or 1, _MAX_AUTO_JOBS, size // _PARALLEL_MIN))


def _jv(value: object) -> str:
    """One JSON value, as ``json.dumps`` writes it (``ensure_ascii=False``)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return _encode_str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (math.inf, -math.inf):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    return json.dumps(value, ensure_ascii=False)  # pragma: no cover - no other types


def _json_object(m: Match, number: int | None, uuid: str | None) -> str:
    """``m``'s JSON object as ``json.dumps([finding_json(m)], indent=2)`` nests it in a
    list, with ``number`` and ``uuid`` as its line number and GPU UUID."""
    # The verdicts by identity: an enum member's hash is a Python-level call.
    key = (m.signature, m.title, m.xid, m.sxid, m.pci, m.gpu_index, id(m.severity), id(m.action))
    head = _heads.get((key, uuid))
    if head is None:
        head = _head_of(m, key, uuid)
    stamp = m.timestamp
    uptime = m.uptime_s
    host = m.host
    if host is not None:
        host = _hosts.get(host) or _host_of(host)
    return (
        f"{head}{'null' if number is None else int.__repr__(number)}"
        # isoformat() is digits, "-", ":", "T", "." and "+": nothing JSON escapes.
        f',\n    "timestamp": {"null" if stamp is None else _quoted(stamp.isoformat())}'
        f',\n    "uptime_s": {"null" if uptime is None else _jv(uptime)}'
        f',\n    "host": {"null" if host is None else host}'
        f',\n    "line": {_encode_str(m.line)}\n  }}'
    )


def _quoted(text: str) -> str:
    return f'"{text}"'


# A log names few signatures, GPUs, verdicts and hosts: the JSON of each is written once
# (a finding's object up to its "line_number" value; a host's string).
_CACHED_MAX = 4096
_heads: dict[tuple[tuple[object, ...], str | None], str] = {}
_hosts: dict[str, str] = {}


def _head_of(m: Match, key: tuple[object, ...], uuid: str | None) -> str:
    if len(_heads) >= _CACHED_MAX:
        _heads.clear()
    head = _heads[key, uuid] = (
        _head(m.signature, m.title, m.xid, m.sxid, m.pci, m.gpu_index)
        + _jv(uuid)
        + _middle(m.severity.value, m.action.value)
    )
    return head


def _host_of(host: str) -> str:
    if len(_hosts) >= _CACHED_MAX:
        _hosts.clear()
    encoded = _hosts[host] = _encode_str(host)
    return encoded


def _head(
    signature: str,
    title: str,
    xid: int | None,
    sxid: int | None,
    pci: str | None,
    index: int | None,
) -> str:
    return (
        "  {\n"
        f'    "signature": {_jv(signature)},\n'
        f'    "title": {_jv(title)},\n'
        f'    "xid": {_jv(xid)},\n'
        f'    "sxid": {_jv(sxid)},\n'
        f'    "pci": {_jv(pci)},\n'
        f'    "gpu_index": {_jv(index)},\n'
        '    "gpu_uuid": '
    )


def _middle(severity: str, action: str) -> str:
    return f',\n    "severity": {_jv(severity)},\n    "action": {_jv(action)},\n    "line_number": '


def _array(objects: list[str]) -> str:
    return "".join(_array_pieces(objects))


def _array_pieces(objects: list[str]) -> list[str]:
    if not objects:
        return ["[]"]
    pieces = ["[\n"]
    for text in objects:
        pieces += (text, ",\n")
    pieces[-1] = "\n]"
    return pieces


def findings_json(found: list[Found]) -> str:
    """``json.dumps([finding_json(...) ...], indent=2, ensure_ascii=False)``, byte for
    byte, without the pure-Python encoder that ``indent`` costs (~20 µs a finding)."""
    return _array([_json_object(m, number, uuid) for m, number, uuid in found])


def finding_json(m: Match) -> dict[str, object]:
    return {
        "signature": m.signature,
        "title": m.title,
        "xid": m.xid,
        "sxid": m.sxid,
        "pci": m.pci,
        "gpu_index": m.gpu_index,
        "gpu_uuid": m.gpu_uuid,
        "severity": m.severity.value,
        "action": m.action.value,
        "line_number": m.line_number,
        "timestamp": m.timestamp.isoformat() if m.timestamp else None,
        "uptime_s": m.uptime_s,
        "host": m.host,
        "line": m.line,
    }


def _gpu(m: Match) -> Text:
    if m.pci is None:
        return plain(None)
    return Text(m.pci + (f" / {m.gpu_index}" if m.gpu_index is not None else ""))


def scan(
    path: Annotated[
        str, typer.Argument(metavar="FILE|-", help="Saved dmesg/journal/syslog; - reads stdin.")
    ],
    output: OutputOpt = OutputFormat.TABLE,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=0,
            help="Processes that match a big plain file (not stdin, not gzip) in parallel; "
            "0: one per CPU for a file of 64 MiB or more, else 1.",
        ),
    ] = 0,
) -> None:
    """Find failure signatures (Xid, SXid, fallen off the bus, ...) in a saved kernel log."""
    stream = _open(path)
    plain_file = stream is not sys.stdin.buffer and not isinstance(stream, gzip.GzipFile)
    found: list[Found] = []
    text: list[str] = []
    json_out = output is OutputFormat.JSON
    try:
        with _no_gc():
            if plain_file and jobs != 1:
                size = os.fstat(stream.fileno()).st_size
                stream.close()
                jobs = jobs or _auto_jobs(size)
            if plain_file and jobs > 1 and json_out:
                text = _json_pieces(path, jobs)
            elif plain_file and jobs > 1:
                found = scan_file_parallel(path, jobs)
            else:
                if stream.closed:
                    stream = _open(path)
                found = [(m, m.line_number, m.gpu_uuid) for m in scan_stream(stream)]
                text = [findings_json(found)] if json_out else []
    except (OSError, EOFError) as exc:
        raise _usage_error(f"cannot read {path}: {exc}") from exc
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    try:
        _print(found, text, json_out=json_out)
    finally:
        reap_workers()


def _print(found: list[Found], text: list[str], *, json_out: bool) -> None:
    if json_out:
        # Not typer.echo: it copies the document to add the newline, then searches it
        # for ANSI codes to strip (JSON escapes control characters: there are none).
        out = sys.stdout
        for piece in text:
            out.write(piece)
        out.write("\n")
        out.flush()
        return
    if not found:
        note("no failure signatures found")
        return
    t = table("line", "gpu (pci / index)", "signature", "xid", "severity", "action", "title")
    for m, number, _uuid in found:
        code = m.xid if m.xid is not None else m.sxid
        t.add_row(
            plain(number),
            _gpu(m),
            plain(m.signature),
            plain(code),
            styled(m.severity.value, SEVERITY_STYLES),
            plain(m.action.value),
            plain(m.title),
        )
    print_table(t)
    note(f"{len(found)} finding(s)")
