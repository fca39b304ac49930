"""``gpufleet agent``: run the node agent. Every setting reads GPUFLEET_AGENT_<NAME>."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from gpufleet.agent.enroll import EnrollmentRefused
from gpufleet.agent.main import run_agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.cli.errors import CliError


def agent(
    server_url: Annotated[str | None, typer.Option(help="Server URL.")] = None,
    token_file: Annotated[Path | None, typer.Option(help="File holding the node token.")] = None,
    enroll_token_file: Annotated[
        Path | None,
        typer.Option(help="Bare metal: the cluster's enroll token, traded for a node token."),
    ] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Spool and log offsets.")] = None,
    kernel_log: Annotated[
        str | None, typer.Option(help="auto, kmsg, journal, file:PATH or none.")
    ] = None,
    collectors: Annotated[
        str | None, typer.Option(help="Comma-separated: nvml,kmsg,infiniband,slurm,sim.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the gpufleet node agent (collectors, detectors, spool, /metrics)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "server_url": server_url,
            "node_token_file": token_file,
            "enroll_token_file": enroll_token_file,
            "state_dir": state_dir,
            "kernel_log": kernel_log,
            "collectors": tuple(c.strip() for c in collectors.split(",")) if collectors else None,
        }.items()
        if v is not None
    }
    try:
        settings = AgentSettings(**overrides)
        if settings.read_enroll_token() is None:
            settings.read_token()
    except (ValidationError, ValueError, OSError) as exc:
        raise CliError(f"agent settings: {exc}", exit_code=2) from exc
    try:
        run_agent(settings)
    except EnrollmentRefused as exc:
        raise CliError(str(exc), exit_code=1) from exc
