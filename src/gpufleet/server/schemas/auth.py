from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.core.enums import Role
from gpufleet.core.models import Membership, User
from gpufleet.server.schemas.common import Ref, Request


class CreateDeviceTokenRequest(Request):
    """An ID token the CLI got by the device grant, to exchange for an API token."""

    id_token: Annotated[str, Field(min_length=1, max_length=16384)]
    name: Annotated[str, Field(min_length=1, max_length=128)] = "cli (oidc)"
    project: Ref | None = None
    role: Role | None = None


class AuthMe(BaseModel):
    """``GET /auth/me``: the caller, how they authenticated, and the CSRF token (the
    console's view; the CLI and SDK use ``core.models.Me``)."""

    model_config = ConfigDict(frozen=True)

    user: User
    memberships: list[Membership]
    auth_method: Literal["token", "session"]
    expires_at: dt.datetime | None
    csrf_token: str | None
