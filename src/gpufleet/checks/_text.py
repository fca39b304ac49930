"""Line handling every parser shares: line endings, launcher prefixes, number tokens."""

from __future__ import annotations

import math
import re

# Open MPI's --tag-output: "[1,0]<stdout>:" before each line of each rank.
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:")


def split_lines(text: str) -> list[str]:
    """Lines of ``text``, with CRLF, lone CR (progress lines rewritten in place, as
    gpu-burn prints them) and LF all ending a line."""
    return text.splitlines()


def strip_launcher_prefix(line: str) -> str:
    """Drop an ``mpirun --tag-output`` prefix; the rest of the line is the tool's."""
    if line.startswith("[") and (m := _MPI_TAG.match(line)):
        return line[m.end() :]
    return line


def to_float(token: str) -> float | None:
    """A finite number, or ``None`` for ``N/A``, ``nan``, ``inf`` or anything else."""
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def to_int(token: str) -> int | None:
    try:
        return int(token)
    except ValueError:
        return None
