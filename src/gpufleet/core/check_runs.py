"""An active check run as the API returns it (``GET /api/v1/checks/{id}``).

``kind`` is a ``gpufleet.checks.models.CheckKind`` value (dcgm-diag, nccl, ib-write-bw,
gpu-burn); ``result`` is the verdict per node (keyed by node id), GPU and HCA, whose shape
docs/checks.md describes. Listings leave ``result`` out.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpufleet.core.enums import CheckStatus


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


class CheckRunNode(_Frozen):
    id: str
    name: str


class SkippedNode(_Frozen):
    """A node asked for but not checked, and why (a job ran there; its state was not
    readable; it was in a state no check runs in)."""

    node_id: str
    node: str
    reason: str


class CheckRun(_Frozen):
    id: str
    cluster_id: str
    kind: str
    purpose: str  # on_demand | acceptance | localisation
    parent_id: str | None
    status: CheckStatus
    outcome: str | None  # pass | warn | fail once judged
    params: dict[str, Any]
    nodes: list[CheckRunNode]
    skipped: list[SkippedNode]
    forced: bool
    backend: str | None  # agent | slurm, once started
    requested_by: str | None
    detail: str
    result: dict[str, Any] | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    deadline_at: dt.datetime | None
