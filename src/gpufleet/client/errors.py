"""Errors the client raises. They carry the server's message and the field it named."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (field: {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class ServerUnreachable(Exception):
    """The server could not be reached at all (connection refused, DNS, timeout)."""
