"""Access-control objects as the API returns them: members, storage volumes, audit rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpufleet.core.enums import Role

# Memberships: made by a person, or following an IdP group at each login.
MANUAL_SOURCE = "manual"
GROUP_SOURCE = "oidc-group"


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True, defer_build=True)


class Member(_Domain):
    """One user's role in one project, with the user's names."""

    project_id: str
    user_id: str
    user_name: str
    email: str | None
    unix_name: str | None
    role: Role
    source: str  # "manual" or "oidc-group"
    created_at: dt.datetime


class Volume(_Domain):
    """A project's storage volume and the clusters (of the same project) it is attached to."""

    id: str
    project_id: str
    name: str
    size_gb: int
    mount_path: str
    cluster_ids: list[str]
    created_at: dt.datetime
    updated_at: dt.datetime


class AuditEntry(_Domain):
    """One audit row: who did what to which object, when, from where, with what result.

    ``result`` is ``ok``, or for a refused attempt ``denied`` (403/404), ``invalid``
    (400/422), ``conflict`` (409) or ``error``; ``detail.status`` has the HTTP status.
    """

    id: str
    ts: dt.datetime
    actor: str
    action: str
    object_type: str
    object_id: str | None
    project_id: str | None
    source_ip: str | None
    result: str
    request_id: str | None
    detail: dict[str, Any]
