"""The check thresholds shipped as package data (``thresholds.toml``), validated on load.

Keyed by GPU model (as ``core/gpu_models.py`` spells it) for single-node NCCL, and by
fabric (NDR, HDR, EDR) for ib_write_bw and multi-node NCCL. Look-ups accept a unique
case-insensitive part of a name (``H100`` for ``NVIDIA H100 80GB HBM3``), so the CLI
stays short to type; anything ambiguous or unknown is an error that lists the names.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.core.gpu_models import GPU_MODELS

THRESHOLDS_RESOURCE = "thresholds.toml"


class ThresholdsError(ValueError):
    """The thresholds data is malformed; the message names the entry and the field."""


class UnknownName(ValueError):
    """A GPU model or fabric the table has no entry for (or more than one matches)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Limit(_Frozen):
    """Below ``fail_below`` fails, below ``warn_below`` warns; ``expected`` is healthy."""

    expected: float | None = Field(default=None, gt=0)
    warn_below: float = Field(gt=0)
    fail_below: float = Field(gt=0)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> Limit:
        if self.fail_below > self.warn_below:
            raise ValueError(f"fail_below {self.fail_below} is above warn_below {self.warn_below}")
        return self

    def scaled(self, factor: float) -> Limit:
        return Limit(
            expected=self.expected * factor if self.expected is not None else None,
            warn_below=self.warn_below * factor,
            fail_below=self.fail_below * factor,
            source=f"{self.source} (scaled ×{factor:g})",
        )


class GpuModelLimits(_Frozen):
    nccl_all_reduce_single_node: Limit


class FabricLimits(_Frozen):
    title: str
    line_rate_gbits: float = Field(gt=0)
    nics_per_node: int = Field(default=8, ge=1)
    ib_write_bw: Limit
    nccl_all_reduce_multi_node: Limit


class GpuBurnLimits(_Frozen):
    slow_gpu_below_median_pct: float = Field(gt=0, lt=100)
    source: str


class ThresholdTable(_Frozen):
    version: int
    gpu_models: dict[str, GpuModelLimits]
    fabrics: dict[str, FabricLimits]
    gpu_burn: GpuBurnLimits

    @model_validator(mode="after")
    def _known_models(self) -> ThresholdTable:
        unknown = sorted(set(self.gpu_models) - set(GPU_MODELS))
        if unknown:
            raise ValueError(
                f"GPU models not in core/gpu_models.py: {unknown}; known: {sorted(GPU_MODELS)}"
            )
        return self

    def resolve_gpu_model(self, name: str) -> str:
        """The table's spelling of ``name``. Raises :class:`UnknownName`."""
        return _resolve(name, list(self.gpu_models), "GPU model")

    def resolve_fabric(self, name: str) -> str:
        """The table's spelling of ``name`` (``ndr`` → ``NDR``). Raises :class:`UnknownName`."""
        return _resolve(name, list(self.fabrics), "fabric")

    def nccl_single_node(self, gpu_model: str) -> Limit:
        return self.gpu_models[self.resolve_gpu_model(gpu_model)].nccl_all_reduce_single_node

    def nccl_multi_node(self, fabric: str, *, nics_per_node: int | None = None) -> Limit:
        entry = self.fabrics[self.resolve_fabric(fabric)]
        limit = entry.nccl_all_reduce_multi_node
        if nics_per_node is None or nics_per_node == entry.nics_per_node:
            return limit
        return limit.scaled(nics_per_node / entry.nics_per_node)

    def ib_write_bw(self, fabric: str) -> Limit:
        return self.fabrics[self.resolve_fabric(fabric)].ib_write_bw


def _resolve(name: str, known: list[str], what: str) -> str:
    wanted = " ".join(name.split()).lower()
    if not wanted:
        raise UnknownName(f"empty {what} name; known: {', '.join(known)}")
    exact = [k for k in known if k.lower() == wanted]
    if exact:
        return exact[0]
    partial = [k for k in known if wanted in k.lower()]
    if len(partial) == 1:
        return partial[0]
    if partial:
        raise UnknownName(f"{what} {name!r} is ambiguous: {', '.join(partial)}")
    raise UnknownName(f"unknown {what} {name!r}; known: {', '.join(known)}")


def load_thresholds(text: str, *, origin: str = "<string>") -> ThresholdTable:
    """Parse and validate thresholds TOML. Raises :class:`ThresholdsError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{origin}: not valid TOML: {exc}") from exc
    try:
        return ThresholdTable.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ThresholdsError(f"{origin}: invalid thresholds:\n" + "\n".join(lines)) from None


@cache
def get_thresholds() -> ThresholdTable:
    """The table shipped in the package, parsed and validated on first use."""
    ref = resources.files("gpufleet.checks").joinpath(THRESHOLDS_RESOURCE)
    return load_thresholds(ref.read_text(encoding="utf-8"), origin=THRESHOLDS_RESOURCE)
