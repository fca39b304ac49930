"""The environment variables of the CLI's global options (light: ``cli/main.py`` reads
them before any command loads)."""

from __future__ import annotations

ENV_URL = "GPUFLEET_URL"
ENV_TOKEN = "GPUFLEET_TOKEN"  # noqa: S105 - the name of a variable, not a secret
