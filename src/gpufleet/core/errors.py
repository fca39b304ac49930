"""Domain errors. Services raise these; the server maps them to HTTP in one place.

Each error carries a message a person can act on and, where it is about one input,
the name of the field (dotted for nested input, e.g. ``spec.gpus_per_node``).
"""

from __future__ import annotations


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(GpufleetError):
    """The caller sent something that cannot be accepted; nothing was written."""

    code = "invalid_input"


class NotFound(GpufleetError):
    """The object does not exist, or the caller may not know that it exists."""

    code = "not_found"


class Conflict(GpufleetError):
    """The request clashes with current state (a duplicate name, a wrong status)."""

    code = "conflict"


class Unauthorized(GpufleetError):
    """No valid credentials came with the request."""

    code = "unauthorized"


class Forbidden(GpufleetError):
    """The caller is known but lacks the permission for this action."""

    code = "forbidden"


class InvalidTransition(Conflict):
    """A state change that the entity's transition table does not allow."""

    code = "invalid_transition"


class DriverError(GpufleetError):
    """A provider or scheduler call failed; the message names the node and command."""

    code = "driver_error"


class OutOfCapacity(DriverError):
    """The provider has no machine of the kind asked for now: a stockout, or a quota or
    limit reached. Not the request's fault; another group or a later try may succeed."""

    code = "out_of_capacity"


class Unavailable(GpufleetError):
    """The server cannot take this request now (starting, stopping, store down); retry."""

    code = "unavailable"


class RateLimited(GpufleetError):
    """The caller sent too many requests of this kind; retry after ``retry_after_s``."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s
