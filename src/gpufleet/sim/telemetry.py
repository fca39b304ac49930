"""GPU telemetry model: what one simulated GPU reports, sample after sample. Pure.

The job on the GPU (a ``GpuLoad``, or None when it idles) sets the targets: utilisation
near the job's level (steady for training, in bursts for inference), memory the share
the job holds, power between idle and the board limit in proportion to utilisation,
the SM clock at boost under load. Each reading moves from the previous one toward its
target with its own time constant (utilisation and power in seconds, temperature in
about a minute), so consecutive samples look like a real part's and a GPU warms up when
a job starts and cools down slowly after it ends. An idle GPU reads ~0 %, half a GiB,
idle power and 30-40 C.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL, GPU_MODELS, GpuModel
from gpufleet.sim.load import TRAINING, GpuLoad, job_load

# Time constants, seconds: how fast each reading closes the gap to its target.
_TAU_UTIL_S = 3.0
_TAU_MEMORY_S = 5.0  # a job allocates over seconds ...
_TAU_MEMORY_FREE_S = 0.5  # ... and its memory is free the moment its process exits
_TAU_POWER_S = 3.0
_TAU_TEMP_S = 60.0
_TAU_LEVEL_S = 60.0  # how long a steady job's per-GPU wander remembers itself
_LEVEL_WANDER = 1.5  # its spread, percentage points

_IDLE_MEMORY_MIB = 512.0
# Single-bit ECC errors are corrected and rare: about one per GPU per ~4 months of
# 10 s samples. Double-bit errors are faults, injected elsewhere, never drawn here.
_SBE_PER_SAMPLE = 1e-6

# A job's load when a caller only knows "busy" (the agent's sim collector on its own).
BUSY = job_load("busy", TRAINING)


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
    # Model state, not telemetry: the job the GPU runs, where its load sits now (a
    # steady job's level plus this GPU's wander, or an inference burst's level), and the
    # part's own cooling (how much warmer than its neighbours it runs).
    job_id: str | None
    util_level: float
    thermal_offset_c: float


def gpu_model_or_default(name: str) -> GpuModel:
    """The model's figures; an unknown name falls back to the default part."""
    return GPU_MODELS.get(name) or GPU_MODELS[DEFAULT_GPU_MODEL]


def _approach(current: float, target: float, *, elapsed_s: float, tau_s: float) -> float:
    return target + (current - target) * math.exp(-max(elapsed_s, 0.0) / tau_s)


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def initial_telemetry(model: GpuModel, *, rng: random.Random) -> GpuTelemetry:
    """A freshly booted, idle GPU. Its ECC aggregate may carry a few old corrected errors."""
    offset = rng.uniform(0.0, 6.0)
    return GpuTelemetry(
        utilization_pct=0.0,
        memory_used_mib=_IDLE_MEMORY_MIB,
        memory_total_mib=float(model.memory_mib),
        temperature_c=32.0 + offset,
        power_w=float(model.idle_power_w) + 2.0 * offset,
        sm_clock_mhz=float(model.idle_sm_clock_mhz),
        ecc_sbe_volatile=0,
        ecc_dbe_volatile=0,
        ecc_sbe_aggregate=rng.randint(1, 4) if rng.random() < 0.02 else 0,
        ecc_dbe_aggregate=0,
        job_id=None,
        util_level=0.0,
        thermal_offset_c=offset,
    )


def _next_level(
    previous: GpuTelemetry, load: GpuLoad, *, elapsed_s: float, rng: random.Random
) -> float:
    """Where the job's load on this GPU sits now."""
    profile = load.profile
    if previous.job_id != load.job_id:
        return _clamp(load.level_pct + rng.gauss(0.0, _LEVEL_WANDER), *profile.util_band)
    if profile.burst_s is not None:
        # Bursts: the level holds, then jumps anywhere in the band (a Poisson process).
        if rng.random() < 1.0 - math.exp(-max(elapsed_s, 0.0) / profile.burst_s):
            return rng.uniform(*profile.util_band)
        return previous.util_level
    # Steady: a mean-reverting wander around the job's level (an AR(1) in time).
    keep = math.exp(-max(elapsed_s, 0.0) / _TAU_LEVEL_S)
    wander = (previous.util_level - load.level_pct) * keep
    wander += rng.gauss(0.0, _LEVEL_WANDER * math.sqrt(1.0 - keep * keep))
    return _clamp(load.level_pct + wander, *profile.util_band)


def next_telemetry(
    previous: GpuTelemetry,
    *,
    model: GpuModel,
    load: GpuLoad | None,
    elapsed_s: float,
    rng: random.Random,
) -> GpuTelemetry:
    """The reading ``elapsed_s`` after ``previous``, for a GPU running ``load`` (None:
    idle)."""
    if load is not None:
        level = _next_level(previous, load, elapsed_s=elapsed_s, rng=rng)
        noise = 4.0 if load.profile.burst_s is not None else 1.5
        util_target = _clamp(level + rng.gauss(0.0, noise), *load.profile.util_band)
        mem_target = load.memory_share * model.memory_mib * (1.0 + rng.gauss(0.0, 0.002))
    else:
        level = 0.0
        util_target = 0.0
        mem_target = _IDLE_MEMORY_MIB + rng.uniform(-16.0, 16.0)
    util = _approach(previous.utilization_pct, util_target, elapsed_s=elapsed_s, tau_s=_TAU_UTIL_S)
    util = _clamp(util, 0.0, 100.0)
    memory = _approach(
        previous.memory_used_mib,
        mem_target,
        elapsed_s=elapsed_s,
        tau_s=_TAU_MEMORY_S if load is not None else _TAU_MEMORY_FREE_S,
    )

    # Idle draw differs a little from part to part (70-82 W on an H100); under load the
    # draw grows with utilisation up to near the board limit.
    span_w = model.power_limit_w - model.idle_power_w
    idle_w = model.idle_power_w + 2.0 * previous.thermal_offset_c
    power_target = idle_w + span_w * 0.92 * (util / 100.0) ** 1.3
    power_target += rng.gauss(0.0, 1.0 + span_w * 0.01 * util / 100.0)
    power = _approach(previous.power_w, power_target, elapsed_s=elapsed_s, tau_s=_TAU_POWER_S)
    power = _clamp(power, model.idle_power_w * 0.9, float(model.power_limit_w))

    # Idle ~32-38 C, full power ~70-77 C: inside 30-40 idle and 55-80 busy.
    heat = (power - idle_w) / span_w if span_w > 0 else 0.0
    temp_target = 32.0 + previous.thermal_offset_c + 39.0 * max(0.0, heat)
    temp = _approach(previous.temperature_c, temp_target, elapsed_s=elapsed_s, tau_s=_TAU_TEMP_S)
    temp = _clamp(temp + rng.gauss(0.0, 0.15), 30.0, 80.0)

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
        memory_used_mib=round(_clamp(memory, 0.0, float(model.memory_mib)), 1),
        temperature_c=round(temp, 1),
        power_w=round(power, 1),
        sm_clock_mhz=float(round(clock)),
        ecc_sbe_volatile=sbe,
        ecc_sbe_aggregate=sbe_agg,
        job_id=None if load is None else load.job_id,
        util_level=level,
    )
