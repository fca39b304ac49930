"""What went wrong on the way to a host, as a reason a caller can branch on."""

from __future__ import annotations

from enum import StrEnum

from gpufleet.core.errors import DriverError


class SshFailure(StrEnum):
    CREDENTIAL = "credential"  # no credential, or one that cannot be used (no secret shown)
    AUTH = "auth refused"  # the server refused the key or password
    HOST_KEY = "host key"  # no pinned key, or the server's key is not the pinned one
    UNREACHABLE = "unreachable"  # refused, reset, no route, name does not resolve
    TIMEOUT = "timed out"
    PROTOCOL = "protocol"  # the server spoke, but not an SSH we can use
    COMMAND = "command"  # connected; the remote command failed


# Retried with backoff; the others would fail the same way again.
TRANSIENT = frozenset({SshFailure.UNREACHABLE, SshFailure.TIMEOUT})


class SshError(DriverError):
    """A ``DriverError`` of the ssh provider, with why it failed. The message names the
    driver and the host and never holds the credential's secret."""

    def __init__(self, message: str, *, reason: SshFailure, transient: bool | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.transient = reason in TRANSIENT if transient is None else transient


def redact(text: str, secret: str | None) -> str:
    """``text`` with the secret, and every line of it, cut out: a library that echoes
    what it failed to parse must not carry a private key into a log."""
    if not secret:
        return text
    pieces = [secret, *(line.strip() for line in secret.splitlines())]
    for piece in sorted({p for p in pieces if len(p) >= 4}, key=len, reverse=True):
        text = text.replace(piece, "[secret]")
    return text
