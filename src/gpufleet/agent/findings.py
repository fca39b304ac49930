"""A finding change before the spool numbers it: the ``FindingReport`` minus ``seq``."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict

from gpufleet.core.agent_protocol import FindingReport, FindingState
from gpufleet.core.enums import FindingSource, Severity


class FindingChange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    signature_id: str
    state: FindingState
    severity: Severity
    source: FindingSource
    title: str = ""
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    pci_bus_id: str | None = None
    component: str | None = None
    evidence: str = ""
    count: int = 1
    first_seen: dt.datetime
    last_seen: dt.datetime

    def to_report(self, seq: int) -> FindingReport:
        return FindingReport(seq=seq, **self.model_dump())
