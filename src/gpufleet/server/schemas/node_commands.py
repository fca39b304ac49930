from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet.core.agent_protocol import (
    DEFAULT_EXPIRES_IN_S,
    DEFAULT_OUTPUT_BYTES,
    MAX_ARGV,
    MAX_ENV,
    MAX_EXPIRES_IN_S,
    MAX_OUTPUT_BYTES,
    MAX_TIMEOUT_S,
)
from gpufleet.server.schemas.common import Request


class RunCommandRequest(Request):
    """Run ``argv`` on the node (exec'd, no shell: a script is ["/bin/sh", "-c", TEXT])."""

    argv: Annotated[list[str], Field(min_length=1, max_length=MAX_ARGV)]
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
    env: Annotated[dict[str, str], Field(max_length=MAX_ENV)] = Field(default_factory=dict)
    cwd: Annotated[str | None, Field(max_length=4096)] = None
    max_output_bytes: Annotated[int, Field(ge=1, le=MAX_OUTPUT_BYTES)] = DEFAULT_OUTPUT_BYTES
    expires_in_s: Annotated[float, Field(gt=0, le=MAX_EXPIRES_IN_S)] = DEFAULT_EXPIRES_IN_S
    purpose: Annotated[str, Field(max_length=200)] = ""


class CancelCommandRequest(Request):
    reason: Annotated[str, Field(max_length=500)] = ""
