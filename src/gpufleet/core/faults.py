"""A simulated fault as the API returns it (``POST /api/v1/nodes/{id}/faults``)."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict

from gpufleet.core.enums import Severity


class Fault(BaseModel):
    """One fault in a simulated machine; the node's agent reports it as a finding."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    id: str
    node_id: str
    node_name: str
    signature: str  # a catalog signature id
    title: str
    severity: Severity
    gpu_index: int | None  # None: the whole node
    gpu_uuid: str | None
    count: int  # times seen (a repeated inject folds into the open fault)
    origin: str  # "injected" or "background"
    sticky: bool = False  # broken hardware: back after every reboot; gone only on replace
    started_at: dt.datetime
    clears_at: dt.datetime | None  # a transient fault clears by itself then
    cleared_at: dt.datetime | None
