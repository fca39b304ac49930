"""A fake ``pynvml``: the calls the NVML collector makes, with real NVML error values.

Errors are ``pynvml.NVMLError`` itself when the package is installed (it is a base
dependency), so the collector is tested against the exception classes it will meet:
``NVMLError(15)`` is ``NVMLError_GpuIsLost``, ``NVMLError(3)`` ``NVMLError_NotSupported``.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str  # NVML's spelling: "00000000:3B:00.0"
    util: int = 50
    used: int = 10 * 2**30
    total: int = 80 * 2**30
    temp: int = 55
    power_mw: int = 350_000
    sm_clock: int = 1980
    reasons: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    replay: int = 0
    nvlinks: int = 0  # links, all up unless in links_down
    links_down: set[int] = field(default_factory=set)
    nvlink_errors: int = 0
    unsupported: set[str] = field(default_factory=set)  # function names
    lost: bool = False


class FakeNvml:
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()  # (gpu index, xid)
        self.registered: list[int] = []
        self.calls: dict[str, int] = {}
        self.shutdown = False

    # -- helpers -----------------------------------------------------------------
    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        gpu: FakeGpu = self.gpus[handle]
        if gpu.lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return gpu

    def inject_xid(self, index: int, xid: int) -> None:
        self.events.put((index, xid))

    # -- lifecycle -----------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.gpus[index].lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._gpu(h, "nvmlDeviceGetPciInfo").bus_id.encode())

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetMinorNumber")
        return int(h)

    def nvmlDeviceGetSerial(self, h: int) -> str:
        return "1650" + str(h)

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    # -- readings ------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._gpu(h, "nvmlDeviceGetUtilizationRates").util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=g.used, total=g.total, free=g.total - g.used)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self._gpu(h, "nvmlDeviceGetClockInfo").sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEccErrors").ecc.get((error_type, counter), 0)

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._gpu(h, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        return 0

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replay

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth")
        return 16

    nvmlDeviceGetMaxPcieLinkWidth = nvmlDeviceGetCurrPcieLinkWidth

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration")
        return 5

    nvmlDeviceGetMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[Any]:
        self._gpu(h, "nvmlDeviceGetFieldValues")
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=0)) for _ in ids]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if link >= g.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in g.links_down else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        return self._gpu(h, "nvmlDeviceGetNvLinkErrorCounter").nvlink_errors

    # -- events --------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, es: str) -> None:
        return None

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return 0x8 | 0x2 | 0x1

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, es: str) -> None:
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        try:
            index, xid = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(TIMEOUT) from None
        return SimpleNamespace(eventType=0x8, eventData=xid, device=index)


def h100s(n: int = 8) -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
            bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
        )
        for i in range(n)
    ]
