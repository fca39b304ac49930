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
