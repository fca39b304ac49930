from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

from gpufleet.core.slurm_admins import UNIX_NAME_PATTERN
from gpufleet.server.schemas.common import Request

UserName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
]
UnixName = Annotated[str, StringConstraints(pattern=UNIX_NAME_PATTERN)]
Email = Annotated[str, StringConstraints(max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")]


class CreateUserRequest(Request):
    name: UserName
    email: Email | None = None
    unix_name: UnixName | None = None


class UpdateUserRequest(Request):
    # null removes the Unix name; left out keeps it.
    unix_name: UnixName | None = None
