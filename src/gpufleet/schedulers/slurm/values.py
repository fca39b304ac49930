"""Pure parsers of the small values inside Slurm's output: versions, GRES and TRES
strings, hostlists, array task strings, times, exit codes. ``parsing.py`` builds on them.

Each raises ``ValueError`` naming the value it could not read.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Mapping
from typing import NamedTuple

# ---------------------------------------------------------------------------- version


class SlurmVersion(NamedTuple):
    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def has_json(self) -> bool:
        """``sinfo --json`` and ``squeue --json`` exist (Slurm 21.08+)."""
        return self >= (21, 8)

    @property
    def has_data_parser(self) -> bool:
        """``scontrol --json`` exists and JSON states are lists (Slurm 23.02+)."""
        return self >= (23, 2)


_VERSION_RE = re.compile(r"\s*slurm[\w-]*\s+v?(\d+)\.(\d+)(?:\.(\d+))?", re.IGNORECASE)


def parse_version(text: str) -> SlurmVersion:
    """``sinfo --version`` → ``SlurmVersion``: ``slurm 22.05.8``, ``slurm-wlm 22.05.8``,
    ``slurm 24.05.0-0rc1``."""
    match = _VERSION_RE.match(text)
    if match is None:
        raise ValueError(f"not a Slurm version line (expected 'slurm 22.05.8'): {text[:80]!r}")
    major, minor, micro = match.groups()
    return SlurmVersion(int(major), int(minor), int(micro or 0))


# ------------------------------------------------------------------ small value parsers


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside () and []: ``gpu:2(IDX:0,2),mps:100`` → 2 items."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in {text!r}")
        elif ch == sep and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced brackets in {text!r}")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


EMPTY_VALUES = {"", "(null)", "n/a", "none", "none assigned"}


def is_empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in EMPTY_VALUES)


def _int(text: str, *, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what}: expected a whole number, got {text!r}") from None


def parse_gres_gpus(gres: str | None) -> int:
    """GPUs in a GRES string, summed over types.

    ``gpu:h100:8`` → 8, ``gpu:8(S:0-1)`` → 8, ``gpu:h100:2(IDX:0-1),mps:200`` → 2,
    ``gpu:a100:4,gpu:v100:2`` → 6, ``gres:gpu:1`` / ``gres/gpu:1`` (a job's ask) → 1,
    ``gpu`` → 1, ``(null)`` / empty → 0.
    """
    if gres is None or is_empty(gres):
        return 0
    total = 0
    for item in _split_top(gres):
        spec = re.sub(r"\(.*\)$", "", item).strip()
        for prefix in ("gres:", "gres/"):
            spec = spec.removeprefix(prefix)
        name, _, rest = spec.partition(":")
        name, _, eq_count = name.partition("=")  # gres/gpu=2 in a TRES-style ask
        if name != "gpu":
            continue
        if eq_count:
            total += _int(eq_count, what=f"GRES {item!r}")
            continue
        parts = rest.split(":") if rest else []
        if "=" in (parts[-1] if parts else ""):  # gpu:h100=2
            total += _int(parts[-1].split("=", 1)[1], what=f"GRES {item!r}")
        elif not parts:
            total += 1  # bare "gpu": one
        elif parts[-1].isdigit():
            total += int(parts[-1])
        elif len(parts) == 1:
            total += 1  # "gpu:h100": a type, count defaults to one
        else:
            raise ValueError(f"GRES {item!r}: expected gpu[:type][:count], count not a number")
    return total


def parse_tres_gpus(tres: str | None) -> int:
    """GPUs in a TRES string: ``cpu=1,mem=1000M,gres/gpu=4,gres/gpu:h100=4`` → 4. Uses the
    untyped ``gres/gpu`` total; without it, sums the typed ``gres/gpu:<type>`` entries."""
    if tres is None or is_empty(tres):
        return 0
    untyped: int | None = None
    typed = 0
    for item in _split_top(tres):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"TRES {tres!r}: item {item!r} is not key=value")
        if key == "gres/gpu":
            untyped = _int(value, what=f"TRES {item!r}")
        elif key.startswith("gres/gpu:"):
            typed += _int(value, what=f"TRES {item!r}")
    return untyped if untyped is not None else typed


def expand_hostlist(hostlist: str | None) -> tuple[str, ...]:
    """``lab-[001-003,007],gpu1`` → ``('lab-001', 'lab-002', 'lab-003', 'lab-007', 'gpu1')``.
    Ranges keep the zero padding of their first number; several brackets multiply."""
    if hostlist is None or is_empty(hostlist):
        return ()
    names: list[str] = []
    for item in _split_top(hostlist):
        pieces: list[list[str]] = []
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            if literal:
                pieces.append([literal])
            if ranges:
                pieces.append(_expand_ranges(ranges, hostlist=hostlist))
        names.extend("".join(combo) for combo in itertools.product(*pieces))
    return tuple(dict.fromkeys(names))


def _expand_ranges(ranges: str, *, hostlist: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"hostlist {hostlist!r}: bad range {part!r}")
        if not dash:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"hostlist {hostlist!r}: range {part!r} runs backwards")
        out.extend(str(i).zfill(len(low)) for i in range(int(low), int(high) + 1))
    return out


def count_array_tasks(spec: str | None) -> tuple[int, int | None]:
    """An array's task string → (tasks, throttle): ``0-9%2`` → (10, 2), ``1,3,5-7`` →
    (5, None), ``0-15:4`` → (4, None), empty → (1, None): a plain job is one task."""
    if spec is None or is_empty(spec):
        return 1, None
    body, pct, throttle_text = spec.partition("%")
    throttle = _int(throttle_text, what=f"array {spec!r}") if pct else None
    count = 0
    for part in body.split(","):
        span, colon, step_text = part.partition(":")
        step = _int(step_text, what=f"array {spec!r}") if colon else 1
        low, dash, high = span.partition("-")
        first = _int(low, what=f"array {spec!r}")
        last = _int(high, what=f"array {spec!r}") if dash else first
        if step < 1 or last < first:
            raise ValueError(f"array {spec!r}: bad range {part!r}")
        count += (last - first) // step + 1
    return count, throttle


def parse_time(value: object) -> dt.datetime | None:
    """A Slurm time → aware UTC datetime, or None when unset. Accepts epoch seconds (an int,
    digits, or a 23.02+ ``{"set","infinite","number"}`` object; 0 is unset) and ISO text
    (``2026-12-02T13:54:54``; without a zone it is UTC, as the driver runs Slurm with TZ=UTC).
    """
    if isinstance(value, Mapping):
        value = parse_number(value)
    if value is None or is_empty(value) or value == "Unknown":
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value, dt.UTC) if value > 0 else None
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return parse_time(int(text))
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not a time (expected 2026-12-02T13:54:54): {text!r}") from None
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed
    raise ValueError(f"not a time: {value!r}")


def format_time(value: dt.datetime) -> str:
    """A datetime → the text ``sacct -S``/``-E`` reads (UTC: the driver sets TZ=UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S")


def parse_number(value: object) -> int | None:
    """An integer that 23.02+ wraps as ``{"set", "infinite", "number"}``; None if unset."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ValueError(f"expected a number, got {value!r}")


def parse_exit_code(text: str) -> tuple[int | None, int]:
    """sacct ``ExitCode`` ``rc:signal`` → (exit code, signal). A job killed by a signal
    gets 128 + signal, as a shell reports it: ``3:0`` → (3, 0), ``0:9`` → (137, 9)."""
    if is_empty(text):
        return None, 0
    rc_text, _, signal_text = text.partition(":")
    rc = _int(rc_text, what=f"ExitCode {text!r}")
    signal = _int(signal_text, what=f"ExitCode {text!r}") if signal_text else 0
    return (128 + signal if rc == 0 and signal else rc), signal
