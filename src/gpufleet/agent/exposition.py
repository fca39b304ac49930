"""Prometheus text exposition format 0.0.4, written by hand (no client library).

:class:`Exposition` gathers samples by family, so a family's samples stay together under
one ``# HELP`` / ``# TYPE`` pair whatever order they were added in (the format requires
it), and appends the labels every series of the agent carries (``hostname``) last.

Values: an integral value is written as an integer, so a 64-bit counter keeps every
digit (``f"{v:g}"`` would print ``1.23457e+08``); anything else is ``repr(float)``, the
shortest text that reads back to the same float.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["gauge", "counter", "untyped"]
Labels = Sequence[tuple[str, str | None]]


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def format_labels(pairs: Iterable[tuple[str, str | None]]) -> str:
    """``a="x",b="y"``; a label whose value is None is left out."""
    return ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs if v is not None)


@dataclass(slots=True)
class _Family:
    kind: Kind
    help: str
    rows: list[str] = field(default_factory=list)


class Exposition:
    def __init__(self, *, const_labels: Labels = ()) -> None:
        self._families: dict[str, _Family] = {}
        self._const = format_labels(const_labels)

    def add(self, name: str, kind: Kind, help_text: str, labels: Labels, value: float) -> None:
        """One sample. The first sample of a family fixes its type and help."""
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(kind, help_text)
        text = format_labels(labels)
        if self._const:
            text = f"{text},{self._const}" if text else self._const
        family.rows.append(f"{name}{{{text}}} {format_value(value)}")

    def declare(self, name: str, kind: Kind, help_text: str) -> None:
        """A family with its header even if no sample comes (e.g. no open findings)."""
        self._families.setdefault(name, _Family(kind, help_text))

    def text(self) -> str:
        lines: list[str] = []
        for name, family in self._families.items():
            lines.append(f"# HELP {name} {escape_help(family.help)}")
            lines.append(f"# TYPE {name} {family.kind}")
            lines.extend(family.rows)
        return "\n".join(lines) + "\n"
