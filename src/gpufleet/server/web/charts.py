"""Line charts as inline SVG, drawn on the server: no chart library, no script, readable
without JavaScript and by a screen reader (a title, a summary and a stats line)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from gpufleet.server.services.telemetry_history import (
    MEM_USED,
    POWER,
    TEMP,
    UTIL,
    ClusterMinute,
    NodeMinute,
)
from gpufleet.server.services.utilization_prometheus import Curve, PrometheusUtilization

WIDTH, HEIGHT = 720, 210
LEFT, RIGHT, TOP, BOTTOM = 46, 12, 10, 24
MAX_POINTS = 360  # per series; longer windows are averaged into this many buckets

Point = tuple[dt.datetime, float | None]


@dataclass(frozen=True)
class Series:
    label: str
    points: list[Point]


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    svg: Markup
    legend: list[tuple[str, str]] = field(default_factory=list)  # (label, swatch class)
    stats: str = ""
    empty: bool = False
    # What an empty chart says: the tables' history, unless the data comes from elsewhere.
    empty_title: str = "No samples in this window yet."
    empty_text: str = (
        "History starts with the first report after the console was installed; "
        "one sample per node per minute."
    )


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exp:
            return step * exp
    return 10 * exp


def _downsample(points: list[Point], start: dt.datetime, end: dt.datetime) -> list[Point]:
    if len(points) <= MAX_POINTS:
        return points
    span = (end - start).total_seconds() / MAX_POINTS
    buckets: dict[int, list[float]] = {}
    for ts, v in points:
        if v is not None:
            buckets.setdefault(int((ts - start).total_seconds() // span), []).append(v)
    return [
        (start + dt.timedelta(seconds=(k + 0.5) * span), sum(vs) / len(vs))
        for k, vs in sorted(buckets.items())
    ]


def _fmt(value: float, unit: str) -> str:
    digits = 1 if abs(value) < 10 and unit not in ("%",) else 0
    return f"{value:,.{digits}f}{'' if unit == '%' else ' '}{unit}"


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    unit: str,
    start: dt.datetime,
    end: dt.datetime,
    y_max: float | None = None,
    gap_s: float = 150.0,
    empty_title: str = Chart.empty_title,
    empty_text: str = Chart.empty_text,
) -> Chart:
    """Lines over [start, end]; a missing point or a gap longer than ``gap_s`` breaks
    the line rather than drawing across data that is not there."""
    series = [Series(s.label, _downsample(s.points, start, end)) for s in series]
    # Averaged buckets are a bucket apart: only a longer silence is a gap.
    gap_s = max(gap_s, 2.0 * (end - start).total_seconds() / MAX_POINTS)
    values = [v for s in series for _, v in s.points if v is not None]
    legend = [(s.label, f"sw{i % 8}") for i, s in enumerate(series)] if len(series) > 1 else []
    if not values:
        return Chart(
            title=title,
            unit=unit,
            svg=Markup(),
            legend=legend,
            empty=True,
            empty_title=empty_title,
            empty_text=empty_text,
        )
    top = y_max if y_max is not None else _nice_max(max(values))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max((end - start).total_seconds(), 1.0)

    def x(ts: dt.datetime) -> float:
        return LEFT + plot_w * min(max((ts - start).total_seconds() / span, 0.0), 1.0)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - min(max(v / top, 0.0), 1.0))

    parts: list[str] = []
    for k in range(5):
        tick = top * k / 4
        yy = y(tick)
        parts.append(f'<line class="gridline" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" '
                     f'y2="{yy:.1f}"></line>')  # fmt: skip
        parts.append(f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                     f"{escape(_fmt(tick, unit))}</text>")  # fmt: skip
    long_window = span > 2 * 86400
    for k in range(6):
        ts = start + dt.timedelta(seconds=span * k / 5)
        label = ts.strftime("%d %b %H:%M" if long_window else "%H:%M")
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"
        parts.append(
            f'<text x="{x(ts):.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}">{label}</text>'
        )
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" '
                 f'y2="{TOP + plot_h}"></line>')  # fmt: skip
    for i, s in enumerate(series):
        segment: list[str] = []
        last: dt.datetime | None = None
        for ts, v in s.points:
            if v is None or (last is not None and (ts - last).total_seconds() > gap_s):
                if len(segment) > 1:
                    parts.append(
                        f'<polyline class="s{i % 8}" points="{" ".join(segment)}"></polyline>'
                    )
                segment = []
            if v is not None:
                segment.append(f"{x(ts):.1f},{y(v):.1f}")
                last = ts
        if len(segment) > 1:
            parts.append(f'<polyline class="s{i % 8}" points="{" ".join(segment)}"></polyline>')
        elif len(segment) == 1:
            cx, cy = segment[0].split(",")
            parts.append(
                f'<circle class="s{i % 8}" cx="{cx}" cy="{cy}" r="2" fill="none"></circle>'
            )
    last_values = [s.points[-1][1] for s in series if s.points and s.points[-1][1] is not None]
    now_value = sum(last_values) / len(last_values) if last_values else None
    stats = (
        f"min {_fmt(min(values), unit)} · avg {_fmt(sum(values) / len(values), unit)} · "
        f"max {_fmt(max(values), unit)}"
        + (f" · latest {_fmt(now_value, unit)}" if now_value is not None else "")
        + (" (all series)" if len(series) > 1 else "")
    )
    label = f"{title}, {start:%H:%M} to {end:%H:%M} UTC: {stats}"
    svg = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="xMidYMid meet">'
        f"<title>{escape(label)}</title>{''.join(parts)}</svg>"
    )
    # Built from numbers and escaped text only.
    return Chart(title=title, unit=unit, svg=Markup(svg), legend=legend, stats=stats)  # noqa: S704


def cluster_charts(
    history: Sequence[ClusterMinute], *, now: dt.datetime, window: dt.timedelta
) -> list[Chart]:
    start = now - window

    def pts(values: Sequence[float | None]) -> list[Point]:
        return [(m.minute, v) for m, v in zip(history, values, strict=True)]

    return [
        line_chart([Series("GPU utilization", pts([m.util_avg for m in history]))],
                   title="GPU utilization (average)", unit="%", start=start, end=now,
                   y_max=100.0),
        line_chart([Series("memory used", pts([m.mem_used_pct for m in history]))],
                   title="GPU memory used", unit="%", start=start, end=now, y_max=100.0),
        line_chart([Series("power", pts([m.power_kw for m in history]))],
                   title="GPU power (sum)", unit="kW", start=start, end=now),
        line_chart([Series("average", pts([m.temp_avg for m in history])),
                    Series("hottest GPU", pts([m.temp_max for m in history]))],
                   title="GPU temperature", unit="°C", start=start, end=now),
    ]  # fmt: skip


def node_charts(
    history: Sequence[NodeMinute], *, now: dt.datetime, window: dt.timedelta
) -> list[Chart]:
    """One line per GPU in each chart."""
    start = now - window
    slots = max((len(m.gpus) for m in history), default=0)

    def per_gpu(field_index: int, scale: float = 1.0) -> list[Series]:
        out = []
        for i in range(slots):
            points: list[Point] = []
            for m in history:
                entry = m.gpus[i] if i < len(m.gpus) else None
                value = entry[field_index] if entry is not None else None
                points.append((m.minute, None if value is None else value * scale))
            out.append(Series(f"GPU {i}", points))
        return out

    return [
        line_chart(per_gpu(UTIL), title="GPU utilization", unit="%", start=start, end=now,
                   y_max=100.0),
        line_chart(per_gpu(MEM_USED, 1 / 1024), title="GPU memory used", unit="GiB",
                   start=start, end=now),
        line_chart(per_gpu(POWER), title="GPU power", unit="W", start=start, end=now),
        line_chart(per_gpu(TEMP), title="GPU temperature", unit="°C", start=start, end=now),
    ]  # fmt: skip


BYTE_UNITS = (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3))
NO_SERIES = "Prometheus has no samples of this in the window."
NO_SERIES_HELP = (
    "The agents export it where the node has it (InfiniBand ports, NFS or Lustre "
    "mounts); Prometheus must scrape them (service discovery at /api/v1/prometheus/targets)."
)


def _scaled(curves: Sequence[Curve]) -> tuple[list[Series], str]:
    """Byte rates in the largest unit under the peak, so the axis reads 1.2 GB/s."""
    peak = max((v for c in curves for _, v in c.points if v is not None), default=0.0)
    unit, div = next(((u, d) for u, d in BYTE_UNITS if peak >= d), ("B/s", 1.0))
    return [
        Series(c.label, [(ts, None if v is None else v / div) for ts, v in c.points])
        for c in curves
    ], unit


def prometheus_charts(
    data: PrometheusUtilization, *, now: dt.datetime, window: dt.timedelta
) -> tuple[list[Chart], list[Chart]]:
    """The GPU charts (as ``cluster_charts`` draws them from the tables) and the
    network and storage ones, from Prometheus's series."""
    start = now - window
    gap_s = 2.5 * data.step_s

    def chart(key: str, title: str, unit: str, y_max: float | None = None) -> Chart:
        series = [Series(c.label, c.points) for c in data.curves.get(key, [])]
        if unit == "B/s":
            series, unit = _scaled(data.curves.get(key, []))
        return line_chart(
            series,
            title=title,
            unit=unit,
            start=start,
            end=now,
            y_max=y_max,
            gap_s=gap_s,
            empty_title=NO_SERIES,
            empty_text=NO_SERIES_HELP,
        )

    gpu = [
        chart("util", "GPU utilization (average)", "%", 100.0),
        chart("mem", "GPU memory used", "%", 100.0),
        chart("power", "GPU power (sum)", "kW"),
        chart("temp", "GPU temperature", "°C"),
    ]
    io = [
        chart("ib", "InfiniBand throughput (all ports)", "B/s"),
        chart("nic", "NIC throughput (Ethernet)", "B/s"),
        chart("disk", "Local disk I/O", "B/s"),
        chart("netfs", "NFS and Lustre I/O", "B/s"),
    ]
    return gpu, io
