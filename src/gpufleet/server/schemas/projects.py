from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet.server.schemas.common import Name, Request


class CreateProjectRequest(Request):
    name: Name
    description: Annotated[str, Field(max_length=1000)] = ""
