"""Shared pieces of request schemas."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# DNS-label-like names: they end up as hostnames and Slurm node names.
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"),
]
Ref = Annotated[str, StringConstraints(min_length=1, max_length=63)]
Limit = Annotated[int, Field(ge=1, le=1000)]


class Request(BaseModel):
    """Base of every request body: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


# A page's ``next_cursor``: the id (a canonical, lowercase UUID) of the last item it
# held. Described here so a client, or a generator of requests, knows what is accepted.
CURSOR_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
CURSOR_DESCRIPTION = "The previous page's `next_cursor` (an id); absent for the first page."
