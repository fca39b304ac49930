"""GPU telemetry model: what one simulated GPU reports, sample after sample. Pure.

Each reading moves from the previous one toward a target with its own time constant
(utilisation in seconds, temperature in about a minute), so consecutive samples look
like a real part's: power follows utilisation, temperature follows power.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL, GPU_MODELS, GpuModel

# Time constants, seconds: how fast each reading closes the gap to its target.
_TAU_UTIL_S = 3.0
_TAU_MEMORY_S = 5.0
_TAU_POWER_S = 3.0
_TAU_TEMP_S = 60.0

# Busy memory: 55-78 GB of an 80 GB part, as a share of the part's memory.
_BUSY_MEMORY_SHARE = (55 * 1024 / 81559, 78 * 1024 / 81559)
_IDLE_MEMORY_MIB = 512.0
# Single-bit ECC errors are corrected and rare: about one per GPU per ~4 months of
# 10 s samples. Double-bit errors are faults, injected elsewhere, never drawn here.
_SBE_PER_SAMPLE = 1e-6


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    """One GPU's readings (the ``GpuSample`` fields) plus the state the next sample needs."""

    utilization_pct: float
    memory_used_mib: float
    memory_total_mib: float
    temperature_c: float
    power_w: float
    sm_clock_mhz: float
    ecc_sbe_volatile: int
    ecc_dbe_volatile: int
    ecc_sbe_aggregate: int
    ecc_dbe_aggregate: int
    # Model state, not telemetry: where the job's load and memory sit, the GPU's cooling.
    busy_util_target: float
    busy_memory_share: float
    thermal_offset_c: float


def gpu_model_or_default(name: str) -> GpuModel:
    """The model's figures; an unknown name falls back to the default part."""
    return GPU_MODELS.get(name) or GPU_MODELS[DEFAULT_GPU_MODEL]


def _approach(current: float, target: float, *, elapsed_s: float, tau_s: float) -> float:
    return target + (current - target) * math.exp(-max(elapsed_s, 0.0) / tau_s)


def initial_telemetry(model: GpuModel, *, rng: random.Random) -> GpuTelemetry:
    """A freshly booted, idle GPU. Its ECC aggregate may carry a few old corrected errors."""
    offset = rng.uniform(0.0, 6.0)
    return GpuTelemetry(
        utilization_pct=0.0,
        memory_used_mib=_IDLE_MEMORY_MIB,
        memory_total_mib=float(model.memory_mib),
        temperature_c=32.0 + offset,
        power_w=float(model.idle_power_w),
        sm_clock_mhz=float(model.idle_sm_clock_mhz),
        ecc_sbe_volatile=0,
        ecc_dbe_volatile=0,
        ecc_sbe_aggregate=rng.randint(1, 4) if rng.random() < 0.02 else 0,
        ecc_dbe_aggregate=0,
        busy_util_target=rng.uniform(90.0, 99.0),
        busy_memory_share=rng.uniform(*_BUSY_MEMORY_SHARE),
        thermal_offset_c=offset,
    )


def next_telemetry(
    previous: GpuTelemetry,
    *,
    model: GpuModel,
    busy: bool,
    elapsed_s: float,
    rng: random.Random,
) -> GpuTelemetry:
    """The reading ``elapsed_s`` after ``previous``, for a GPU that is busy or idle."""
    # The job's load wanders a little around its level; bounded so it stays in 85-100.
    util_target_level = min(99.5, max(87.0, previous.busy_util_target + rng.gauss(0.0, 1.0)))
    if busy:
        util_target = min(100.0, max(85.0, util_target_level + rng.gauss(0.0, 1.5)))
        mem_target = previous.busy_memory_share * model.memory_mib
    else:
        util_target = rng.uniform(0.0, 3.0)
        mem_target = _IDLE_MEMORY_MIB + rng.uniform(-16.0, 16.0)
    util = _approach(previous.utilization_pct, util_target, elapsed_s=elapsed_s, tau_s=_TAU_UTIL_S)
    util = min(100.0, max(0.0, util))
    memory = _approach(
        previous.memory_used_mib, mem_target, elapsed_s=elapsed_s, tau_s=_TAU_MEMORY_S
    )

    span_w = model.power_limit_w - model.idle_power_w
    power_target = model.idle_power_w + span_w * 0.92 * (util / 100.0) ** 1.3
    power_target += rng.gauss(0.0, span_w * 0.01)
    power = _approach(previous.power_w, power_target, elapsed_s=elapsed_s, tau_s=_TAU_POWER_S)
    power = min(float(model.power_limit_w), max(model.idle_power_w * 0.9, power))

    # Idle ~32-38 C, full power ~70-77 C: inside 30-40 idle and 55-80 busy.
    load = (power - model.idle_power_w) / span_w if span_w > 0 else 0.0
    temp_target = 32.0 + previous.thermal_offset_c + 39.0 * max(0.0, load)
    temp = _approach(previous.temperature_c, temp_target, elapsed_s=elapsed_s, tau_s=_TAU_TEMP_S)
    temp = min(80.0, max(30.0, temp + rng.gauss(0.0, 0.15)))

    # Clocks ramp with any load and sit a little under max under sustained load.
    clock_span = model.max_sm_clock_mhz - model.idle_sm_clock_mhz
    clock = model.idle_sm_clock_mhz + clock_span * min(1.0, util / 20.0)
    if util > 20.0:
        clock -= rng.uniform(0.0, 45.0)

    sbe = previous.ecc_sbe_volatile
    sbe_agg = previous.ecc_sbe_aggregate
    if rng.random() < _SBE_PER_SAMPLE * max(1.0, elapsed_s / 10.0):
        sbe += 1
        sbe_agg += 1
    return replace(
        previous,
        utilization_pct=round(util, 1),
        memory_used_mib=round(max(0.0, min(memory, float(model.memory_mib))), 1),
        temperature_c=round(temp, 1),
        power_w=round(power, 1),
        sm_clock_mhz=float(round(clock)),
        ecc_sbe_volatile=sbe,
        ecc_sbe_aggregate=sbe_agg,
        busy_util_target=util_target_level,
    )
