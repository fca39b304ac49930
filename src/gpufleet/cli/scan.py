"""``gpufleet scan FILE|-``: the failure signatures in a saved kernel log.

The first thing an operator runs on a dump from a sick node. Reads dmesg, ``dmesg -T``,
journal and syslog exports (gzip too), needs no server and no login.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, BinaryIO, cast

import typer
from rich.text import Text

from gpufleet.cli.errors import CliError
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


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    file = Path(path)
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise CliError(f"{path} {what}; give a saved kernel log file, or - for stdin")
    try:
        raw = file.open("rb")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
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


def _range_candidates(path: str, begin: int, end: int) -> tuple[list[tuple[int, bytes]], int]:
    """Candidate lines of ``path[begin:end]`` (a whole number of lines), numbered from 1."""
    lines: list[tuple[int, bytes]] = []
    newlines = 0
    tail = b""
    with open(path, "rb") as f:
        f.seek(begin)
        left = end - begin
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            buf = tail + chunk if tail else chunk
            cut = buf.rfind(b"\n") + 1
            if left <= 0 and cut < len(buf):  # the file's last line, without a newline
                buf, cut = buf + b"\n", len(buf) + 1
            tail = buf[cut:]
            found, count = find_candidates(buf, cut)
            lines.extend((newlines + n, line) for n, line in found)
            newlines += count
    return lines, newlines


def _split(path: str, size: int, jobs: int) -> list[tuple[int, int]]:
    """``jobs`` byte ranges of about equal size, each a whole number of lines."""
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, jobs):
            at = max(size * k // jobs, cuts[-1])
            f.seek(at)
            f.readline()  # to the start of the next line
            cuts.append(min(f.tell(), size))
    cuts.append(size)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def scan_file_parallel(path: str, jobs: int) -> list[Match]:
    """Find candidate lines in ``jobs`` processes; match them here, in file order.

    Only the prefilter runs in parallel: the matcher's state (multi-line windows, the
    PCI → UUID map) sees the candidate lines in order, as ``feed_bytes`` would.
    """
    size = os.path.getsize(path)
    ranges = _split(path, size, jobs)
    matcher = KernelLogMatcher()
    found: list[Match] = []
    with ProcessPoolExecutor(max_workers=len(ranges)) as pool:
        futures = [pool.submit(_range_candidates, path, a, b) for a, b in ranges]
        for fut in futures:
            lines, newlines = fut.result()
            found.extend(matcher.feed_candidates(lines))
            matcher.skip_lines(newlines)
    found.extend(matcher.finish())
    return found


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
            min=1,
            help="Processes that search a big plain file (not stdin, not gzip) in parallel.",
        ),
    ] = 1,
) -> None:
    """Find failure signatures (Xid, SXid, fallen off the bus, ...) in a saved kernel log."""
    stream = _open(path)
    parallel = jobs > 1 and stream is not sys.stdin.buffer and not isinstance(stream, gzip.GzipFile)
    try:
        if parallel:
            stream.close()
            found = scan_file_parallel(path, jobs)
        else:
            found = scan_stream(stream)
    except (OSError, EOFError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from exc
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    if output is OutputFormat.JSON:
        typer.echo(json.dumps([finding_json(m) for m in found], indent=2, ensure_ascii=False))
        return
    if not found:
        note("no failure signatures found")
        return
    t = table("line", "gpu (pci / index)", "signature", "xid", "severity", "action", "title")
    for m in found:
        code = m.xid if m.xid is not None else m.sxid
        t.add_row(
            plain(m.line_number),
            _gpu(m),
            plain(m.signature),
            plain(code),
            styled(m.severity.value, SEVERITY_STYLES),
            plain(m.action.value),
            plain(m.title),
        )
    print_table(t)
    note(f"{len(found)} finding(s)")
