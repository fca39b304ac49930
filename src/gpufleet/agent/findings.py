"""A finding change before the spool numbers it: the ``FindingReport`` minus ``seq``."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict

from gpufleet.core.agent_protocol import MAX_EVIDENCE_CHARS, FindingReport, FindingState
from gpufleet.core.enums import FindingSource, Severity

# FindingReport.evidence's max_length: a longer one is refused by the wire model.
EVIDENCE_LIMIT = MAX_EVIDENCE_CHARS
# A context line cut shorter than this says nothing useful: it is left out instead.
_MIN_CONTEXT = 20


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


def with_context(change: FindingChange, line: str) -> FindingChange:
    """``change`` with ``line`` (e.g. the pods on the node) as the evidence's last line.

    The evidence itself is never cut: the line is, to what fits in ``EVIDENCE_LIMIT``
    (ending in "…"), and left out where less than ``_MIN_CONTEXT`` would fit."""
    line = line.strip()
    if not line:
        return change
    prefix = f"{change.evidence}\n" if change.evidence else ""
    room = EVIDENCE_LIMIT - len(prefix)
    if len(line) > room:
        if room < _MIN_CONTEXT:
            return change
        line = line[: room - 1] + "…"
    return change.model_copy(update={"evidence": prefix + line})
