"""GPU models gpufleet knows, as data: memory, power limit, clocks.

Used to validate cluster specs and to give the simulator realistic ranges. Figures are the
SXM parts' board limits as nvidia-smi reports them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str  # as nvidia-smi prints it
    memory_mib: int
    power_limit_w: int
    idle_power_w: int
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    slowdown_temp_c: int
    nvlinks: int = 0  # NVLink links per GPU (SXM parts); 0 for a part without NVLink


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("NVIDIA H100 80GB HBM3", 81559, 700, 70, 1980, 345, 87, nvlinks=18),
        GpuModel("NVIDIA H200", 143771, 700, 75, 1980, 345, 87, nvlinks=18),
        GpuModel("NVIDIA A100-SXM4-80GB", 81920, 400, 60, 1410, 210, 88, nvlinks=12),
        GpuModel("NVIDIA B200", 183359, 1000, 140, 1965, 420, 87, nvlinks=18),
    )
}

DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"


def get_gpu_model(name: str) -> GpuModel | None:
    return GPU_MODELS.get(name)
