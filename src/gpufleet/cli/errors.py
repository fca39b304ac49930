"""Errors the CLI raises itself, and the exit code every failure maps to."""

from __future__ import annotations

import httpx

from gpufleet.client.errors import ApiError, ServerUnreachable

# Exit codes: 1 = the server or the network failed; 2 = the caller must change something
# (bad input, missing credentials, a 4xx from the server). Scripts branch on the difference.
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure the person at the terminal can fix; printed as ``error: <message>``."""

    def __init__(self, message: str, *, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def describe(exc: Exception) -> tuple[str, int]:
    """Return the line to print on stderr and the exit code for a known failure."""
    if isinstance(exc, ApiError):
        text = exc.message + (f" (field: {exc.field})" if exc.field else "")
        if exc.status == httpx.codes.UNAUTHORIZED:
            text += "; run `gpufleet login` or set GPUFLEET_TOKEN"
        code = EXIT_USAGE if 400 <= exc.status < 500 else EXIT_FAILURE
        return text, code
    if isinstance(exc, ServerUnreachable):
        return f"{exc}; is the server running, and is the URL right?", EXIT_FAILURE
    if isinstance(exc, CliError):
        return exc.message, exc.exit_code
    return str(exc), EXIT_FAILURE
