"""Request bodies of the acceptance API (the run model is ``core.acceptance.AcceptanceRun``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from gpufleet.server.schemas.common import Request

NodeRef = Annotated[str, StringConstraints(min_length=1, max_length=253)]


class RunAcceptanceRequest(Request):
    """``POST /clusters/{id}/acceptance``: run the cluster's suite now. ``nodes`` (names or
    ids): only those, node-level checks only; none: every node that reports and is not
    under repair, with the cluster-wide checks too."""

    nodes: Annotated[list[NodeRef], Field(min_length=1, max_length=4096)] | None = None
    reason: Annotated[str, Field(max_length=1000)] = ""
    # Check nodes that run jobs too (the check runner skips them otherwise). Admins only,
    # like every acceptance run; never the default.
    force: Annotated[bool, Field(strict=True)] = False
