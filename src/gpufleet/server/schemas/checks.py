"""Active check runs: the request body. What the API returns for a run is
``gpufleet.core.check_runs.CheckRun`` (the client shares it)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from gpufleet.checks.models import CheckKind
from gpufleet.core.check_runs import CheckRun, CheckRunNode, SkippedNode
from gpufleet.server.schemas.common import Request

__all__ = ["CheckRun", "CheckRunNode", "CreateCheckRunRequest", "SkippedNode"]

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
