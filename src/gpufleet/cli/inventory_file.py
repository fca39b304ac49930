"""Reading an inventory file: a YAML list of hosts (or ``{hosts: [...]}``) or a CSV with a
header row. Every row is checked here against ``HostSpec`` before anything is sent, so a
bad file fails naming its row and field (exit 2) and the server is never asked."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.cli.errors import CliError
from gpufleet.core.inventory import HostSpec


def _kind(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".csv":
        return "csv"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith(("-", "hosts:", "#", "---")):
        return "yaml"
    return "csv"


def _csv_rows(text: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    rows: list[dict[str, Any]] = []
    for row in reader:
        if None in row:
            raise CliError(f"line {reader.line_num}: more values than header columns")
        # An empty cell is "not given", so optional fields keep their defaults.
        rows.append({k.strip(): v for k, v in row.items() if k and v is not None and v != ""})
    return rows


def _yaml_rows(text: str) -> list[Any]:
    try:
        # Optional dependency (pyyaml comes with the [server] extra): a node running only
        # the agent never reads inventory files. pyyaml ships no type stubs.
        import yaml  # type: ignore[import-untyped]
    except ImportError as exc:
        raise CliError(f"YAML inventory files need pyyaml (pip install pyyaml): {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"not valid YAML: {exc}") from None
    if isinstance(data, dict) and set(data) == {"hosts"}:
        data = data["hosts"]
    if not isinstance(data, list):
        raise CliError("expected a list of hosts (or a mapping with one key, hosts)")
    return data


def read_inventory(path: Path) -> list[HostSpec]:
    """Every row as a ``HostSpec``; ``CliError`` naming the file, row and field otherwise."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"{path}: cannot read it ({exc.strerror})") from None
    kind = _kind(path, text)
    try:
        rows = _yaml_rows(text) if kind == "yaml" else _csv_rows(text)
    except CliError as exc:
        raise CliError(f"{path}: {exc.message}; nothing was imported") from None
    if not rows:
        raise CliError(f"{path}: no hosts in it")
    specs: list[HostSpec] = []
    for index, row in enumerate(rows, start=1):
        where = f"{path}: row {index}"
        if not isinstance(row, dict):
            raise CliError(f"{where}: expected a mapping of fields; nothing was imported")
        name = row.get("hostname")
        if name:
            where += f" ({name})"
        try:
            specs.append(HostSpec.model_validate(row))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "row"
            raise CliError(f"{where}: {field}: {err['msg']}; nothing was imported") from None
    return specs
