"""Simulated GPUs for the demo and for nodes without NVIDIA hardware.

Uses the simulator's telemetry model (``gpufleet.sim`` is a lower layer than the
agent), the one the simulated fleet's agents report from, so a demo agent's readings
look like a real part's and follow the load on it: ``load`` says what runs on the node
(by default, with ``busy``, a training job on every GPU; without, an idle node). Faults
are not invented here: they come through the kernel-log file the agent follows
(``gpufleet inject``).
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.agent.collectors.base import CollectorResult, Condition, Sample
from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL
from gpufleet.sim.load import IDLE, NodeLoad
from gpufleet.sim.telemetry import (
    BUSY,
    GpuTelemetry,
    gpu_model_or_default,
    initial_telemetry,
    next_telemetry,
)


@dataclass
class SimCollector:
    gpus: int = 8
    model_name: str = DEFAULT_GPU_MODEL
    seed: int = 0
    busy: bool = True
    # What runs on the node now; None: ``busy`` decides (every GPU, or none).
    load: Callable[[], NodeLoad] | None = None
    name: str = "sim"
    _rng: random.Random = field(init=False)
    _state: list[GpuTelemetry] = field(init=False)
    _uuids: list[str] = field(init=False)
    _last: dt.datetime | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 - telemetry noise
        model = gpu_model_or_default(self.model_name)
        self._state = [initial_telemetry(model, rng=self._rng) for _ in range(self.gpus)]
        self._uuids = [str(uuid.UUID(int=self._rng.getrandbits(128))) for _ in range(self.gpus)]

    async def collect(self, now: dt.datetime) -> CollectorResult:
        model = gpu_model_or_default(self.model_name)
        elapsed = 1.0 if self._last is None else (now - self._last).total_seconds()
        self._last = now
        gpus = self._load().gpus
        self._state = [
            next_telemetry(t, model=model, load=gpus.get(i), elapsed_s=elapsed, rng=self._rng)
            for i, t in enumerate(self._state)
        ]
        result = CollectorResult()
        result.conditions.append(Condition("nvml_init_failed", False))
        for i, t in enumerate(self._state):
            values = {
                "utilization_pct": t.utilization_pct,
                "memory_used_mib": t.memory_used_mib,
                "memory_total_mib": t.memory_total_mib,
                "temperature_c": t.temperature_c,
                "power_w": t.power_w,
                "sm_clock_mhz": t.sm_clock_mhz,
                "ecc_sbe_volatile": float(t.ecc_sbe_volatile),
                "ecc_dbe_volatile": float(t.ecc_dbe_volatile),
                "ecc_sbe_aggregate": float(t.ecc_sbe_aggregate),
                "ecc_dbe_aggregate": float(t.ecc_dbe_aggregate),
                "clocks_event_reasons": 0.0,
            }
            if model.nvlinks:  # an SXM part's NVLink counters, as NVML sums them: a
                # healthy simulated fabric never retries (the sim's NVLink faults are
                # findings, not counters)
                values |= dict.fromkeys(
                    ("nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors"), 0.0
                )
            result.samples.append(
                Sample(
                    "gpu",
                    values,
                    gpu_index=i,
                    gpu_uuid=f"GPU-{self._uuids[i]}",
                    pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0",
                    model=model.name,
                    minor_number=i,
                )
            )
        return result

    def _load(self) -> NodeLoad:
        if self.load is not None:
            return self.load()
        if not self.busy:
            return IDLE
        return NodeLoad(gpus=dict.fromkeys(range(self.gpus), BUSY))

    async def close(self) -> None:
        return None
