"""Pure pieces of the console: the grid's cells and spoken labels, the diff a poll sends,
the SVG charts."""

from __future__ import annotations

import datetime as dt

from gpufleet.core.enums import Health, NodeState
from gpufleet.server.services.health_grid import GridNode, HealthGrid, _cells
from gpufleet.server.web.charts import MAX_POINTS, Series, line_chart
from gpufleet.server.web.grid import attention, grid_changes, node_label, render_grid


def _node(name: str, cells: str, **kw: object) -> GridNode:
    values: dict[str, object] = {
        "id": f"id-{len(name)}",
        "name": name,
        "state": NodeState.IN_SERVICE,
        "health": Health.HEALTHY,
        "cells": cells,
        "findings": 0,
        "repair": None,
        **kw,
    }
    return GridNode(**values)  # type: ignore[arg-type]


def _grid(*nodes: GridNode, etag: str = "e1", order: str = "o1") -> HealthGrid:
    return HealthGrid(cluster_id="c", gpus_per_node=8, nodes=nodes, etag=etag, order=order)


def test_cells_follow_the_gpus_and_never_show_silence_as_healthy() -> None:
    gpus = {0: "healthy", 1: "unhealthy", 3: "degraded"}
    assert _cells(gpus, expected=4, node_health=Health.UNHEALTHY) == "hudm"[:2] + "md"
    assert _cells(gpus, expected=4, node_health=Health.UNKNOWN) == "nnnn"
    assert _cells({}, expected=8, node_health=Health.HEALTHY) == "n" * 8
    # A GPU index beyond the spec still gets its cell.
    assert _cells({0: "healthy", 8: "healthy"}, expected=2, node_health=Health.HEALTHY) == (
        "hm" + "m" * 6 + "h"
    )


def test_labels_say_what_the_colours_say() -> None:
    bad = _node("gpu-007", "hhuhhhhm", health=Health.UNHEALTHY, state=NodeState.CORDONED,
                findings=2, repair="proposed")  # fmt: skip
    label = node_label(bad)
    assert label.startswith("gpu-007: unhealthy, cordoned")
    assert "GPU 2 unhealthy" in label and "GPU 7 missing" in label
    assert "2 open findings" in label and "repair proposed" in label
    silent = _node("gpu-008", "nnnnnnnn", health=Health.UNKNOWN)
    assert node_label(silent) == "gpu-008: unknown"


def test_grid_markup_is_compact_and_escaped() -> None:
    html = str(render_grid(_grid(_node("<x>", "hhhhhhhh")), base="/clusters/c"))
    assert "<x>" not in html and "&lt;x&gt;" in html
    assert html.count("<i class=h></i>") == 8


def test_a_poll_diff_names_only_changed_nodes() -> None:
    old = _grid(_node("a", "hhhhhhhh"), _node("b", "hhhhhhhh"))
    new = _grid(_node("a", "hhhhhhhh"), _node("b", "hhuhhhhh", health=Health.UNHEALTHY),
                etag="e2")  # fmt: skip
    changes = grid_changes(old, new)
    assert changes is not None and [c[0] for c in changes] == [1]
    assert changes[0][2] == "hhuhhhhh"
    assert grid_changes(None, new) is None
    assert grid_changes(_grid(_node("a", "h"), order="o0"), new) is None  # layout changed
    assert [n.name for n in attention(new)] == ["b"]


def test_charts_break_at_gaps_and_average_long_windows() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    points = [(start + dt.timedelta(minutes=i), float(i % 100)) for i in range(60)]
    points += [(start + dt.timedelta(minutes=i), float(i % 100)) for i in range(90, 120)]
    chart = line_chart([Series("u", points)], title="Util", unit="%", start=start,
                       end=start + dt.timedelta(hours=2), y_max=100.0)  # fmt: skip
    assert str(chart.svg).count("<polyline") == 2  # the 30-minute gap is not drawn across
    assert 'role="img"' in str(chart.svg) and "min 0% · avg" in chart.stats
    week = [(start + dt.timedelta(minutes=i), 50.0) for i in range(7 * 1440)]
    long = line_chart([Series("u", week)], title="Util", unit="%", start=start,
                      end=start + dt.timedelta(days=7))  # fmt: skip
    drawn = str(long.svg).split('points="')[1].split('"')[0].split()
    assert len(drawn) <= MAX_POINTS
    empty = line_chart([Series("u", [])], title="Util", unit="%", start=start, end=start)
    assert empty.empty and str(empty.svg) == ""
