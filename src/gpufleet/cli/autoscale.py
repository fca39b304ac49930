"""``gpufleet clusters autoscale show|set|actions``: who decides a cluster's size (off,
gpufleet's own policy, Kubernetes' Cluster Autoscaler, Slurm's power saving), its bounds
and thresholds, and the changes of size made. A value ``set`` cannot read (a duration, a
bound) fails here with exit 2 before the server is asked; the server's 422 (a mode the
cluster's scheduler does not have, a minimum above the maximum) exits 2 too."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_time,
    note,
    plain,
    print_table,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.core.autoscaling import AutoscaleAction, AutoscaleMode, AutoscaleSettings
from gpufleet.core.models import Page

app = typer.Typer(
    help="A cluster's autoscaling: its settings and the changes of size made.",
    no_args_is_help=True,
)

ClusterRef = Annotated[str, typer.Argument(help="Cluster id, or its name.")]
ProjectOpt = Annotated[
    str | None, typer.Option("--project", "-p", help="Project id or name to look in.")
]

MAX_DURATION_S = 7 * 86400  # what the server takes for a threshold or a cooldown
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

STATUS_STYLES = {"acting": "cyan", "succeeded": "green", "failed": "bold red", "cancelled": "dim"}
MODE_STYLES = {"off": "dim", "gpufleet": "green", "cluster-autoscaler": "cyan", "slurm": "cyan"}


def parse_duration(value: str, *, option: str) -> float:
    """``90s``, ``2m``, ``1h``, ``1h30m``, ``1d`` or plain seconds (``45``) → seconds, at
    most 7 days; anything else is a usage error (exit 2) naming ``option``."""
    text = value.strip().lower()
    seconds: float | None = None
    try:
        seconds = float(text)
    except ValueError:
        if text and _DURATION.sub("", text).strip() == "":
            seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(text))
    if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise typer.BadParameter(
            f"{value!r} is not a duration; give seconds (90) or a span like 90s, 2m, 1h30m, 1d",
            param_hint=option,
        )
    if not 0 <= seconds <= MAX_DURATION_S:
        raise typer.BadParameter(f"{value!r} is outside 0s..7d", param_hint=option)
    return seconds


def parse_bound(value: str, *, option: str) -> int | None:
    """A node count, or ``none`` to remove the bound."""
    text = value.strip().lower()
    if text in ("none", "unset", "-"):
        return None
    if not text.isdigit():
        raise typer.BadParameter(
            f"{value!r} is not a number of nodes; give 0 or more, or 'none' to remove it",
            param_hint=option,
        )
    return int(text)


def fmt_duration(seconds: float) -> str:
    """``150`` → ``2m30s``; whole units only where they fit, like the options take."""
    whole = int(seconds)
    if whole != seconds or whole == 0:
        return f"{seconds:g}s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)


def _render_settings(s: AutoscaleSettings) -> None:
    bounds = (
        "-"
        if s.min_nodes is None and s.max_nodes is None
        else f"{s.min_nodes if s.min_nodes is not None else '-'}.."
        f"{s.max_nodes if s.max_nodes is not None else '-'}"
    )
    rows: list[tuple[str, Text | str]] = [
        ("cluster", s.cluster_id),
        ("mode", Text(s.mode.value, style=MODE_STYLES.get(s.mode.value, ""))),
        ("nodes", bounds),
        ("scale up after", f"{fmt_duration(s.scale_up_after_s)} of GPU work pending"),
        ("scale down after", f"{fmt_duration(s.scale_down_after_s)} idle"),
        ("up cooldown", fmt_duration(s.up_cooldown_s)),
        ("down cooldown", fmt_duration(s.down_cooldown_s)),
        ("max step", f"{s.max_step} node(s)"),
        ("last up", fmt_time(s.last_up_at)),
        ("last down", fmt_time(s.last_down_at)),
        ("last decision", s.last_decision or "-"),
        ("updated", fmt_time(s.updated_at)),
    ]
    print_table(fields(rows))


def _render_actions(page: Page[AutoscaleAction]) -> None:
    t = table(
        "WHEN", "KIND", "STATUS", "SOURCE", "COUNT", "NODES", "REASON", "ID", right=("COUNT",)
    )  # fmt: skip
    for a in page.items:
        shown = ", ".join(a.nodes[:6]) + (f" (+{len(a.nodes) - 6})" if len(a.nodes) > 6 else "")
        t.add_row(
            fmt_time(a.created_at),
            a.kind.value,
            Text(a.status.value, style=STATUS_STYLES.get(a.status.value, "")),
            a.source.value,
            str(a.count),
            plain(shown),
            plain(a.reasons[0] if a.reasons else a.detail),
            plain(a.id),
        )
    print_table(t, empty="no autoscaling actions yet")
    if page.next_cursor is not None:
        note("more: raise --limit")


@app.command("show")
def show_autoscale(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show who decides the cluster's size, its bounds, thresholds and cooldowns, and
    when it last stepped."""
    with config.client_for(ctx) as client:
        settings = client.get_autoscale(client.find_cluster(ref, project=project).id)
    emit(output, settings, _render_settings)


@app.command("set")
def set_autoscale(
    ctx: typer.Context,
    ref: ClusterRef,
    mode: Annotated[
        AutoscaleMode | None,
        typer.Option(
            case_sensitive=False,
            help="off; gpufleet (its own policy); cluster-autoscaler (Kubernetes' Cluster "
            "Autoscaler through gpufleet); slurm (Slurm's power saving calls "
            "`gpufleet slurm resume|suspend`). A mode other than off needs both bounds.",
        ),
    ] = None,
    min_nodes: Annotated[
        str | None, typer.Option("--min", help="Fewest nodes; 'none' removes the bound.")
    ] = None,
    max_nodes: Annotated[
        str | None, typer.Option("--max", help="Most nodes; 'none' removes the bound.")
    ] = None,
    scale_up_after: Annotated[
        str | None,
        typer.Option(help="GPU work pending this long asks for nodes: 90s, 2m, 1h."),
    ] = None,
    scale_down_after: Annotated[
        str | None, typer.Option(help="A node idle this long may go: 30m.")
    ] = None,
    up_cooldown: Annotated[str | None, typer.Option(help="Between two steps up: 5m.")] = None,
    down_cooldown: Annotated[
        str | None, typer.Option(help="After any step, before a step down: 10m.")
    ] = None,
    max_step: Annotated[
        int | None, typer.Option(min=1, help="Nodes added or removed by one step.")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why; kept in the audit log.")] = "",
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Change the cluster's autoscaling (project admins); only the options given change."""
    changes: dict[str, Any] = {}
    if mode is not None:
        changes["mode"] = mode
    if min_nodes is not None:
        changes["min_nodes"] = parse_bound(min_nodes, option="--min")
    if max_nodes is not None:
        changes["max_nodes"] = parse_bound(max_nodes, option="--max")
    spans = {
        "scale_up_after_s": (scale_up_after, "--scale-up-after"),
        "scale_down_after_s": (scale_down_after, "--scale-down-after"),
        "up_cooldown_s": (up_cooldown, "--up-cooldown"),
        "down_cooldown_s": (down_cooldown, "--down-cooldown"),
    }
    for name, (value, option) in spans.items():
        if value is not None:
            changes[name] = parse_duration(value, option=option)
    if max_step is not None:
        changes["max_step"] = max_step
    if not changes:
        raise CliError(
            "nothing to change: give --mode, --min, --max, --scale-up-after, "
            "--scale-down-after, --up-cooldown, --down-cooldown or --max-step"
        )
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(ref, project=project).id
        settings = client.set_autoscale(cluster_id, reason=reason, **changes)
    emit(output, settings, _render_settings)


@app.command("actions")
def list_actions(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """The cluster's changes of size, newest first: steps up and down by gpufleet's
    policy, the Cluster Autoscaler or an admin, and Slurm's resumes and suspends."""
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(ref, project=project).id
        page = collect(
            lambda cursor, want: client.list_autoscale_actions(
                cluster_id, limit=want, cursor=cursor
            ),
            limit=limit,
        )
    emit(output, page, _render_actions)
