from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet.core.agent_protocol import MAX_GPUS_PER_NODE
from gpufleet.server.schemas.common import Request


class InjectFaultRequest(Request):
    signature: Annotated[str, Field(min_length=1, max_length=80)]
    # None: the whole node, or a GPU drawn at random for a GPU signature.
    gpu_index: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE, strict=True)] | None = None
    # Hardware that stays bad: the fault comes back after every reboot and reinstall;
    # only a new host (failover) gets rid of it.
    sticky: Annotated[bool, Field(strict=True)] = False
