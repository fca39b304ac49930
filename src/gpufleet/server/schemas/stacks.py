"""Request bodies of ``/api/v1/stacks``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet.core.stacks import STACK_NAME, StackSpec, Version
from gpufleet.server.schemas.common import Request


class CreateStackRequest(Request):
    """What the stack pins (leave out what it does not), its name, and whether new
    clusters take it from now on."""

    name: Annotated[str, Field(pattern=STACK_NAME)]
    os_image: Version | None = None
    driver: Version | None = None
    cuda: Version | None = None
    nccl: Version | None = None
    dcgm: Version | None = None
    slurm: Version | None = None
    agent: Version | None = None
    notes: Annotated[str, Field(max_length=2000)] = ""
    latest: bool = False

    def spec(self) -> StackSpec:
        return StackSpec.model_validate(self.model_dump(include=set(StackSpec.model_fields)))
