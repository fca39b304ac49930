"""Active check runs: the request body and what the API returns for a run."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.checks.models import CheckKind
from gpufleet.core.enums import CheckStatus
from gpufleet.server.schemas.common import Request

NodeRef = Annotated[str, StringConstraints(min_length=1, max_length=253)]


class CreateCheckRunRequest(Request):
    """``POST /api/v1/checks``: run ``check`` on ``nodes`` (names or ids; none: every
    node of the cluster that is in service)."""

    cluster: Annotated[str, StringConstraints(min_length=1, max_length=36)]
    check: CheckKind
    nodes: Annotated[list[NodeRef], Field(min_length=1, max_length=4096)] | None = None
    level: Annotated[int, Field(ge=1, le=4, strict=True)] | None = None  # dcgm-diag only
    params: dict[str, Any] = Field(default_factory=dict)
    # Run on nodes that run jobs too (project admins only). Never the default.
    force: Annotated[bool, Field(strict=True)] = False


class CheckRunNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str


class SkippedNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    node_id: str
    node: str
    reason: str


class CheckRun(BaseModel):
    """One check run. ``result`` (the verdict per node and GPU, docs/checks.md) is left out
    of listings; ``GET /checks/{id}`` has it, ``/checks/{id}/output`` the raw output."""

    model_config = ConfigDict(frozen=True)

    id: str
    cluster_id: str
    kind: CheckKind
    purpose: str
    parent_id: str | None
    status: CheckStatus
    outcome: str | None  # pass | warn | fail once judged
    params: dict[str, Any]
    nodes: list[CheckRunNode]
    skipped: list[SkippedNode]
    forced: bool
    backend: str | None
    requested_by: str | None
    detail: str
    result: dict[str, Any] | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    deadline_at: dt.datetime | None
