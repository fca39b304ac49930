from __future__ import annotations

import itertools
import random

import pytest

from gpufleet.core.agent_protocol import GpuSample
from gpufleet.core.gpu_models import GPU_MODELS, GpuModel
from gpufleet.sim.telemetry import (
    BUSY,
    GpuTelemetry,
    gpu_model_or_default,
    initial_telemetry,
    next_telemetry,
)

H100 = GPU_MODELS["NVIDIA H100 80GB HBM3"]


def run(model: GpuModel, *, busy: bool, steps: int, seed: int = 1) -> list[GpuTelemetry]:
    rng = random.Random(seed)
    t = initial_telemetry(model, rng=rng)
    out = []
    for _ in range(steps):
        t = next_telemetry(t, model=model, load=BUSY if busy else None, elapsed_s=10.0, rng=rng)
        out.append(t)
    return out


def test_idle_gpu_stays_in_idle_ranges() -> None:
    for t in run(H100, busy=False, steps=60):
        assert 0 <= t.utilization_pct <= 3
        assert 400 <= t.memory_used_mib <= 600
        assert 30 <= t.temperature_c <= 40
        assert H100.idle_power_w * 0.9 <= t.power_w <= H100.idle_power_w + 40
        assert t.sm_clock_mhz <= H100.idle_sm_clock_mhz + 300


def test_busy_gpu_settles_in_busy_ranges() -> None:
    settled = run(H100, busy=True, steps=120)[30:]  # temperature needs ~5 minutes
    for t in settled:
        assert 85 <= t.utilization_pct <= 100
        assert 55 * 1024 <= t.memory_used_mib <= 78 * 1024
        assert 55 <= t.temperature_c <= 80
        assert H100.idle_power_w < t.power_w <= H100.power_limit_w
        assert t.sm_clock_mhz >= H100.max_sm_clock_mhz - 100


@pytest.mark.parametrize("name", sorted(GPU_MODELS))
def test_every_model_gives_valid_samples(name: str) -> None:
    model = GPU_MODELS[name]
    for busy in (True, False):
        for t in run(model, busy=busy, steps=40):
            GpuSample(
                index=0,
                uuid="GPU-x",
                utilization_pct=t.utilization_pct,
                memory_used_mib=t.memory_used_mib,
                memory_total_mib=t.memory_total_mib,
                temperature_c=t.temperature_c,
                power_w=t.power_w,
                sm_clock_mhz=t.sm_clock_mhz,
                ecc_sbe_volatile=t.ecc_sbe_volatile,
                ecc_sbe_aggregate=t.ecc_sbe_aggregate,
            )
            assert t.power_w <= model.power_limit_w
            assert t.memory_total_mib == model.memory_mib


def test_consecutive_samples_move_smoothly() -> None:
    samples = run(H100, busy=True, steps=200)[10:]
    for a, b in itertools.pairwise(samples):
        assert abs(a.temperature_c - b.temperature_c) < 5
        assert abs(a.utilization_pct - b.utilization_pct) < 10
        assert abs(a.power_w - b.power_w) < 0.1 * H100.power_limit_w


def test_temperature_warms_gradually_when_a_job_starts() -> None:
    rng = random.Random(2)
    t = initial_telemetry(H100, rng=rng)
    temps = []
    for _ in range(12):
        t = next_telemetry(t, model=H100, load=BUSY, elapsed_s=10.0, rng=rng)
        temps.append(t.temperature_c)
    assert temps[0] < 50 < temps[-1]
    assert all(b - a < 8 for a, b in itertools.pairwise(temps))


def test_ecc_counters_only_grow_and_aggregate_covers_volatile() -> None:
    rng = random.Random(3)
    t = initial_telemetry(H100, rng=rng)
    for _ in range(2000):
        prev = t
        # A long gap makes an SBE likelier, to see the counters move at all.
        t = next_telemetry(t, model=H100, load=BUSY, elapsed_s=50_000.0, rng=rng)
        assert t.ecc_sbe_volatile >= prev.ecc_sbe_volatile
        assert t.ecc_sbe_aggregate >= t.ecc_sbe_volatile
        assert t.ecc_dbe_aggregate >= t.ecc_dbe_volatile == 0
    assert t.ecc_sbe_volatile > 0


def test_sbe_is_rare_at_the_normal_interval() -> None:
    samples = run(H100, busy=True, steps=5000)
    assert samples[-1].ecc_sbe_volatile <= 1


def test_unknown_model_falls_back_to_default() -> None:
    assert gpu_model_or_default("NVIDIA K80").name == "NVIDIA H100 80GB HBM3"
