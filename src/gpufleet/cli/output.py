"""Rendering: one JSON document for scripts, rich tables for people.

Health and state are coloured the same way everywhere; ``unknown`` is dim grey and
always spelled out, so a node nobody has heard from never passes for a healthy one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufleet.core.clock import as_utc, utcnow


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


OutputOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table for people; json prints the API objects as one JSON document.",
    ),
]

HEALTH_STYLES = {
    "healthy": "green",
    "degraded": "yellow",
    "unhealthy": "bold red",
    "unknown": "dim",
}
STATE_STYLES = {
    # node lifecycle
    "in_service": "green",
    "provisioning": "cyan",
    "acceptance": "cyan",
    "cordoned": "yellow",
    "draining": "yellow",
    "drained": "yellow",
    "repairing": "magenta",
    "removing": "dim",
    "removed": "dim",
    "failed": "bold red",
    # cluster status
    "ready": "green",
    "degraded": "yellow",
    "deleting": "dim",
    "deleted": "dim",
}
SEVERITY_STYLES = {"info": "dim", "warning": "yellow", "critical": "red", "fatal": "bold red"}

if TYPE_CHECKING:  # pydantic is the API commands' (a twentieth of a second); not scan's
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")


# Piped output has no terminal width; rich would assume 80 columns and fold every
# UUID and evidence line. Lines this wide stay greppable and still fit a wide screen.
PIPE_WIDTH = 200


def stdout() -> Console:
    # A fresh console per call: it picks up the current sys.stdout and terminal width.
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=PIPE_WIDTH)
    return console


def stderr() -> Console:
    return Console(stderr=True, highlight=False)


def print_data(data: object) -> None:
    """Print plain JSON data (an API answer that has no model) as one JSON document."""
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def print_json(obj: BaseModel | Sequence[BaseModel]) -> None:
    """Print the exact API object(s), as the server sent them, as one JSON document."""
    data = (
        [o.model_dump(mode="json") for o in obj]
        if isinstance(obj, Sequence)
        else (obj.model_dump(mode="json"))
    )
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def emit(output: OutputFormat, obj: M, render: Callable[[M], None]) -> None:
    if output is OutputFormat.JSON:
        print_json(obj)
    else:
        render(obj)


def styled(value: str | None, styles: dict[str, str]) -> Text:
    if value is None:
        return Text("-", style="dim")
    return Text(str(value), style=styles.get(str(value), ""))


def health_text(value: str | None) -> Text:
    return styled(value if value is not None else "unknown", HEALTH_STYLES)


def state_text(value: str | None) -> Text:
    return styled(value, STATE_STYLES)


def plain(value: object) -> Text:
    """A cell from data: never parsed as rich markup, ``-`` when absent."""
    if value is None or value == "":
        return Text("-", style="dim")
    return Text(str(value))


def table(*columns: str, title: str | None = None, right: Sequence[str] = ()) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
    for name in columns:
        t.add_column(name, justify="right" if name in right else "left", overflow="fold")
    return t


def fields(rows: Sequence[tuple[str, Text | str]], *, title: str | None = None) -> Table:
    """A two-column key/value table for ``show`` commands."""
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for key, value in rows:
        t.add_row(key, value if isinstance(value, Text) else plain(value))
    return t


def fmt_time(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return as_utc(value).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_age(value: dt.datetime | None, *, now: dt.datetime | None = None) -> Text:
    """How long ago, e.g. ``12s ago``; ``never`` (dim) when it never happened."""
    if value is None:
        return Text("never", style="dim")
    seconds = max(0, int(((now or utcnow()) - as_utc(value)).total_seconds()))
    if seconds < 120:
        text = f"{seconds}s ago"
    elif seconds < 7200:
        text = f"{seconds // 60}m ago"
    elif seconds < 172800:
        text = f"{seconds // 3600}h ago"
    else:
        text = f"{seconds // 86400}d ago"
    return Text(text)


def fmt_num(value: float | int | None, *, digits: int = 0, scale: float = 1.0) -> Text:
    if value is None:
        return Text("-", style="dim")
    return Text(f"{value / scale:.{digits}f}")


def counts(values: dict[str, int], styles: dict[str, str]) -> Text:
    """``healthy 6  degraded 1`` with each name in its colour; ``-`` when empty."""
    if not values:
        return Text("-", style="dim")
    out = Text()
    for i, (name, n) in enumerate(sorted(values.items())):
        if i:
            out.append("  ")
        out.append(name, style=styles.get(name, ""))
        out.append(f" {n}")
    return out


def print_table(t: Table, *, empty: str | None = None) -> None:
    """Print ``t``; ``empty``, what a list table would have listed ("no findings"), is
    printed after it when it has no rows, so an empty answer does not read as a cut-off
    one (JSON output has no such line: it is the API's page)."""
    stdout().print(t)
    if empty is not None and not t.row_count:
        note(empty)


def note(message: str) -> None:
    """A human line on stdout (table mode only; json mode prints nothing but JSON)."""
    stdout().print(Text(message))
