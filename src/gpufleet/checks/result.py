"""A check's result: its raw output, what the tool's parser made of it, and the verdict.

Above the parsers (``ParsedOutput`` is the union of their results) and ``models`` (the
verdict), so neither of those imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from gpufleet.checks.dcgm import DcgmDiagResult
from gpufleet.checks.gpuburn import GpuBurnResult
from gpufleet.checks.models import CheckKind, Verdict
from gpufleet.checks.nccl import NcclResult
from gpufleet.checks.perftest import IbWriteBwResult

ParsedOutput: TypeAlias = DcgmDiagResult | NcclResult | IbWriteBwResult | GpuBurnResult


@dataclass(frozen=True, slots=True)
class CheckResult:
    """A check's output, what the parser made of it, and the verdict; raw output kept.

    ``parsed`` is the tool's typed result, or ``None`` when the output was not recognised
    (``verdict`` then fails with ``NOT_RECOGNIZED``).
    """

    kind: CheckKind
    raw: str
    parsed: ParsedOutput | None
    verdict: Verdict

    @property
    def passed(self) -> bool:
        return self.verdict.passed
