"""Reading sysfs and procfs files without ever raising.

A file that is missing, unreadable (EACCES, EINVAL: ``carrier`` of a link that is down),
or holds something that is not a number gives None, and the series it feeds is left
out. sysfs files are tiny, so each read is one ``open`` and one ``read``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UINT = re.compile(r"^\s*(\d+)\s*$")


def read_text(path: Path | str, *, limit: int | None = None) -> str | None:
    """The file's text (ASCII, odd bytes replaced), or None if it cannot be read.

    ``limit``: one ``read()`` of at most that many bytes, for sysfs attributes (never
    more than a page); without it, read to the end (procfs files come a page or so per
    call). ``os.open``/``os.read``: half the cost of ``open()``, which matters at a few
    hundred files per scrape."""
    try:
        # O_NONBLOCK: a FIFO put where a file should be must not hang the scrape
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if limit is not None:
            data = os.read(fd, limit)
        else:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            data = b"".join(chunks)
    except OSError:  # EISDIR, EINVAL (carrier of a link that is down), EIO
        return None
    finally:
        os.close(fd)
    return data.decode("ascii", errors="replace")


def read_uint(path: Path | str) -> int | None:
    """A non-negative integer file (sysfs counters); None if absent or not one."""
    text = read_text(path, limit=4096)
    if text is None:
        return None
    m = _UINT.match(text)
    return int(m[1]) if m else None


def read_int(path: Path | str) -> int | None:
    """A signed integer file (``speed`` is -1 when unknown)."""
    text = read_text(path, limit=4096)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def read_line(path: Path | str) -> str | None:
    text = read_text(path, limit=4096)
    return None if text is None else text.strip()


def list_dir(path: Path | str) -> list[str]:
    """Entry names, sorted; empty if the directory is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except (OSError, ValueError):
        return []
