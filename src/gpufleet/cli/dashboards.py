"""``gpufleet dashboards``: the Grafana dashboards, as JSON to import or provision.

``gpufleet.dashboards`` is imported inside the command on purpose: it needs
grafana-foundation-sdk from the ``[server]`` extra, which a node running only the CLI
and the agent does not install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.errors import CliError

app = typer.Typer(
    no_args_is_help=True,
    help="Grafana dashboards as code: fleet, GPUs, InfiniBand/NICs, storage, scheduling.",
)


@app.command("export")
def export(
    directory: Annotated[
        Path, typer.Argument(help="Folder to write <uid>.json into (made if missing).")
    ],
) -> None:
    """Write one JSON file per dashboard into DIRECTORY; unchanged files are left alone."""
    try:
        # Optional dependency ([server] extra): imported lazily, see the module docstring.
        from gpufleet.dashboards.export import export_all
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "gpufleet":
            raise
        raise CliError(
            "dashboards need grafana-foundation-sdk, in the [server] extra: "
            f"pip install 'gpufleet[server]' ({exc})",
            exit_code=1,
        ) from exc
    try:
        written = export_all(directory)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CliError(f"cannot write dashboards to {directory}: {reason}") from exc
    for path in written:
        typer.echo(str(path))
