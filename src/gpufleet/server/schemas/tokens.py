from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet.core.enums import Role
from gpufleet.server.schemas.common import Ref, Request
from gpufleet.server.schemas.projects import UserRef


class CreateTokenRequest(Request):
    name: Annotated[str, Field(min_length=1, max_length=128)] = "cli"
    project: Ref | None = None
    role: Role | None = None
    expires_in_days: Annotated[int, Field(ge=1, le=3650, strict=True)] | None = None
    # The owner only: mint the token for this user (id or name), a member of the project.
    user: UserRef | None = None
