"""The CLI's global options and their environment variables (light: ``cli/main.py``
reads them before any command loads, and a command that needs no server, such as
``gpufleet scan``, never imports the API client)."""

from __future__ import annotations

from dataclasses import dataclass

ENV_URL = "GPUFLEET_URL"
ENV_TOKEN = "GPUFLEET_TOKEN"  # noqa: S105 - the name of a variable, not a secret


@dataclass(frozen=True)
class GlobalOptions:
    """What the top-level ``--url``/``--token`` (or their env vars) said, if anything."""

    url: str | None = None
    token: str | None = None
