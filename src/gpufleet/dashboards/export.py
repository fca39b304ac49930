"""Every dashboard, rendered to Grafana's JSON model, and written to a folder."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from gpufleet.dashboards import fleet, gpu, network, scheduling, storage
from gpufleet.dashboards.panels import DashboardSpec, build

DASHBOARDS: tuple[DashboardSpec, ...] = (
    fleet.DASHBOARD,
    gpu.DASHBOARD,
    network.DASHBOARD,
    storage.DASHBOARD,
    scheduling.DASHBOARD,
)


def render(spec: DashboardSpec) -> dict[str, Any]:
    """The dashboard's JSON model, as Grafana imports it."""
    model: dict[str, Any] = json.loads(json.dumps(build(spec).build(), cls=JSONEncoder))
    return model


def render_text(spec: DashboardSpec) -> str:
    """Stable text: sorted keys, so a re-export changes nothing unless a dashboard did."""
    return json.dumps(render(spec), indent=2, sort_keys=True) + "\n"


def file_name(spec: DashboardSpec) -> str:
    return f"{spec.uid}.json"


def export_all(directory: Path) -> list[Path]:
    """Write one ``<uid>.json`` per dashboard into ``directory`` (made if missing, with its
    parents); a file whose content is already the same is left untouched. Raises
    ``NotADirectoryError`` or ``OSError`` when the folder cannot hold them."""
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a directory", str(directory))
    directory.mkdir(parents=True, exist_ok=True)
    texts = {directory / file_name(spec): render_text(spec) for spec in DASHBOARDS}
    for path, text in texts.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            temp = path.with_name(f".{path.name}.tmp")
            temp.write_text(text, encoding="utf-8")
            temp.replace(path)
    return list(texts)
