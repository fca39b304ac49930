from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from gpufleet.core.enums import Role
from gpufleet.server.schemas.common import Name, Request

# A user by id or name.
UserRef = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class CreateProjectRequest(Request):
    name: Name
    description: Annotated[str, Field(max_length=1000)] = ""
    # The project's first admin, by user id or name; default: the owner creating it.
    first_admin: UserRef | None = None


class AddMemberRequest(Request):
    user: UserRef
    role: Role = Role.MEMBER


class UpdateMemberRequest(Request):
    role: Role
