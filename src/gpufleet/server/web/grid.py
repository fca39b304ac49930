"""The node × GPU health grid as markup, built in Python for speed.

At 2,048 nodes × 8 GPUs the grid is 16,384 cells; a Jinja loop over them costs tens of
milliseconds, string joins a few. The markup is compact on purpose: one ``<a>`` per node
(the click target and the keyboard stop, with a spoken summary) and one ``<i>`` per GPU
whose class is its health letter; colours and symbols come from the stylesheet, so no
cell carries a style or a title.
"""

from __future__ import annotations

from functools import lru_cache

from markupsafe import Markup, escape

from gpufleet.core.enums import Health, NodeState
from gpufleet.server.services.health_grid import HEALTH_OF_CELL, MISSING, GridNode, HealthGrid

LABELLED_MAX_NODES = 128  # small grids show each node's name inside its block
_CELL_WORD = {"h": "healthy", "d": "degraded", "u": "unhealthy", "n": "unknown", "m": "missing"}


def node_class(node: GridNode) -> str:
    parts = ["n", f"h-{node.health}"]  # StrEnums format as their values
    if node.state is not NodeState.IN_SERVICE:
        parts.append(f"s-{node.state}")
    if node.findings:
        parts.append("f")
    if node.repair:
        parts.append("r")
    return " ".join(parts)


def gpu_problems(node: GridNode) -> list[str]:
    """ "GPU 2 unhealthy", "GPU 7 missing"...; all-unknown GPUs of a silent node are not
    listed one by one (the node's own health says it)."""
    return [
        f"GPU {i} {_CELL_WORD[c]}"
        for i, c in enumerate(node.cells)
        if c != "h" and not (c == "n" and node.health is Health.UNKNOWN)
    ]


def node_label(node: GridNode) -> str:
    """What a screen reader says on the node's block (and the tooltip shows)."""
    if (
        node.health is Health.HEALTHY
        and node.state is NodeState.IN_SERVICE
        and not node.findings
        and not node.repair
        and node.cells.count("h") == len(node.cells)
    ):
        return f"{node.name}: healthy"  # most nodes, most of the time: the quick way
    text = f"{node.name}: {node.health.value}"
    if node.state is not NodeState.IN_SERVICE:
        text += f", {node.state.value.replace('_', ' ')}"
    bad = gpu_problems(node)
    if bad:
        text += "; " + ", ".join(bad)
    if node.findings:
        text += f"; {node.findings} open finding{'s' if node.findings != 1 else ''}"
    if node.repair:
        text += f"; repair {node.repair}"
    return text


@lru_cache(maxsize=1024)
def cells_markup(cells: str) -> str:
    """A node's cells; a few patterns ("hhhhhhhh") cover most nodes, hence the cache."""
    return "".join(f"<i class={c}></i>" for c in cells)


def render_grid(grid: HealthGrid, *, base: str) -> Markup:
    """The grid's inner markup: one block per node, in slot order."""
    labelled = len(grid.nodes) <= LABELLED_MAX_NODES
    out: list[str] = []
    append = out.append
    for node in grid.nodes:
        label = escape(node_label(node))
        name = f"<b>{escape(node.name)}</b>" if labelled else ""
        # Node ids are the server's own UUIDs (never input), so they need no escaping.
        append(
            f'<a class="{node_class(node)}" href="{base}/nodes/{node.id}" '
            f'aria-label="{label}" title="{label}">{name}{cells_markup(node.cells)}</a>'
        )
    return Markup("".join(out))  # noqa: S704 - names and labels are escaped above


def grid_changes(old: HealthGrid | None, new: HealthGrid) -> list[list[object]] | None:
    """The nodes whose block changed, as ``[index, class, cells, label]``; None when the
    layout changed (nodes came or went) and the whole grid must be drawn again."""
    if old is None or old.order != new.order:
        return None
    changed: list[list[object]] = []
    for i, (a, b) in enumerate(zip(old.nodes, new.nodes, strict=True)):
        if a.signature() != b.signature():
            changed.append([i, node_class(b), b.cells, node_label(b)])
    return changed


def attention(grid: HealthGrid) -> list[GridNode]:
    """Nodes a person should look at: not healthy, an open finding, or an open repair."""
    return [
        n
        for n in grid.nodes
        if n.health is not Health.HEALTHY
        or n.findings
        or n.repair
        or any(HEALTH_OF_CELL[c] is not Health.HEALTHY for c in n.cells)
        or MISSING in n.cells
    ]
