"""``gpufleet server`` and ``gpufleet demo``: thin launchers for the server package.

``gpufleet.server`` is imported inside each command on purpose: it needs the optional
``[server]`` extra (FastAPI, SQLAlchemy), which a GPU node running only the CLI and the
agent does not install. The other commands must keep working there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.errors import CliError
from gpufleet.core.errors import GpufleetError, InvalidInput


def _missing_extra(exc: ImportError) -> CliError:
    """The [server] extra is absent; anything else (a bug in gpufleet itself) re-raises."""
    if (exc.name or "").split(".")[0] == "gpufleet":
        raise exc
    return CliError(
        f"the server needs the [server] extra: pip install 'gpufleet[server]' ({exc})",
        exit_code=1,
    )


def server(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="TCP port (default 8080).")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the SQLite database and state live.")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL; e.g. postgresql://user@host/db.")
    ] = None,
) -> None:
    """Run the gpufleet server. Every setting also reads GPUFLEET_<NAME> from the env."""
    try:
        # Optional dependency ([server] extra): imported lazily, see the module docstring.
        from gpufleet.server import main as server_main
        from gpufleet.server.settings import ServerSettings
    except ImportError as exc:
        raise _missing_extra(exc) from exc
    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "host": host,
            "port": port,
            "data_dir": data_dir,
            "database_url": database_url,
        }.items()
        if value is not None
    }
    server_main.run_server(ServerSettings(**overrides))


def demo(
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8080,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Keep the demo's state here (default: <per-user data dir>/demo)."),
    ] = None,
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help=(
                "Also start the real Slurm lab (deploy/slurm-lab; root, Slurm installed) "
                "and manage its nodes as the cluster 'slurm'."
            ),
        ),
    ] = False,
) -> None:
    """Run a server with a simulated fleet, ready to click through."""
    try:
        # Optional dependency ([server] extra): imported lazily, see the module docstring.
        from gpufleet.server import main as server_main
    except ImportError as exc:
        raise _missing_extra(exc) from exc
    try:
        server_main.run_demo(port=port, data_dir=data_dir, slurm=slurm)
    except InvalidInput as exc:
        raise CliError(str(exc)) from exc


def rotate_secret_key(
    database_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL; default GPUFLEET_DATABASE_URL.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the SQLite database lives (no database URL).")
    ] = None,
) -> None:
    """Re-encrypt every stored credential under the current secret key, in one transaction.

    Run on the server host with the server's settings: GPUFLEET_SECRET_KEY (or
    GPUFLEET_SECRET_KEY_FILE) the new key, the old one in GPUFLEET_PREVIOUS_SECRET_KEYS
    (or a further line of the key file).
    """
    try:
        # Optional dependency ([server] extra): imported lazily, see the module docstring.
        from gpufleet.server import main as server_main
        from gpufleet.server.services.keyring import KeyringError
        from gpufleet.server.settings import ServerSettings
    except ImportError as exc:
        raise _missing_extra(exc) from exc
    overrides: dict[str, Any] = {
        key: value
        for key, value in {"database_url": database_url, "data_dir": data_dir}.items()
        if value is not None
    }
    try:
        result = server_main.rotate_secret_key(ServerSettings(**overrides))
    except KeyringError as exc:
        raise CliError(str(exc)) from exc
    except GpufleetError as exc:
        raise CliError(exc.message) from exc
    typer.echo(f"re-encrypted {result.reencrypted} credential(s) under key {result.key_id}")
