"""NVML through ``pynvml`` (package ``nvidia-ml-py``), imported lazily.

A node without the library still runs the agent's other collectors; a node where the
library or driver fails reports ``nvml_init_failed``, so it turns unhealthy instead of
silently looking healthy. Pass ``nvml=`` a module-like object to test without a GPU.

Cost: the per-second fields are ~15 calls per GPU (~0.1 ms each, handle cached).
NVLink counters are 4 calls × up to 18 links per GPU, so they and other slow-moving
counters are read every ``slow_interval_s`` and reused in between. A field that raises
``NVML_ERROR_NOT_SUPPORTED`` is left out of the sample and never asked for again on
that GPU.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.collectors.base import CollectorResult, Condition, EmitEvents, Event, Sample
from gpufleet.core.enums import FindingSource
from gpufleet.core.signatures.catalog import get_signature_for_xid
from gpufleet.core.signatures.matcher import normalize_pci

log = logging.getLogger(__name__)

# NVML_ERROR_* values (failure-signatures §2); the pynvml names have changed over time.
ERR_NOT_SUPPORTED = 3
ERR_TIMEOUT = 10
ERR_GPU_IS_LOST = 15
ERR_RESET_REQUIRED = 16
ERR_LIB_RM_VERSION_MISMATCH = 18
XID_EVENT = 0x8
FI_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS is 36 on new headers; no part has over 18 yet


class _GpuLost(Exception):
    pass


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str
    pci: str | None
    serial: str | None
    model: str | None
    minor: int | None = None
    unsupported: set[str] = field(default_factory=set)
    reset_required: bool = False
    nvlinks: list[int] | None = None  # links up when first seen
    slow: dict[str, float] = field(default_factory=dict)
    slow_at: float = 0.0


def load_pynvml() -> Any:
    """The real binding. Any, because pynvml ships no type information."""
    return importlib.import_module("pynvml")


def _err(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    name = "nvml"

    def __init__(
        self,
        *,
        nvml: Any = None,
        expected_gpus: int | None = None,
        slow_interval_s: float = 10.0,
        event_timeout_ms: int = 1000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._expected = expected_gpus
        self._slow_s = slow_interval_s
        self._event_timeout_ms = event_timeout_ms
        self._monotonic = monotonic
        self._ready = False
        self._gpus: dict[int, _Gpu] = {}
        self._event_set: Any = None
        self._closed = False

    # -- sampling -------------------------------------------------------------------

    async def collect(self, now: dt.datetime) -> CollectorResult:
        return await asyncio.to_thread(self.collect_sync, now)

    def collect_sync(self, now: dt.datetime) -> CollectorResult:
        del now  # NVML stamps nothing we use; the loop's time is the sample's
        result = CollectorResult()
        try:
            self._init()
        except Exception as exc:  # noqa: BLE001 - any failure here means "no NVML"
            code = _err(exc)
            result.conditions.append(Condition("nvml_init_failed", True, f"nvmlInit: {exc!r}"))
            result.conditions.append(
                Condition("nvml_driver_mismatch", code == ERR_LIB_RM_VERSION_MISMATCH, str(exc))
            )
            return result
        result.conditions.append(Condition("nvml_init_failed", False))
        result.conditions.append(Condition("nvml_driver_mismatch", False))
        nvml = self._nvml
        count = int(nvml.nvmlDeviceGetCount())
        if self._expected is not None:
            result.conditions.append(
                Condition(
                    "gpu_count_below_expected",
                    count < self._expected,
                    f"NVML sees {count} GPUs, expected {self._expected}",
                )
            )
        for index in range(count):
            self._sample_gpu(index, result)
        return result

    def _init(self) -> None:
        if self._ready:
            return
        if self._nvml is None:
            self._nvml = load_pynvml()
        self._nvml.nvmlInit()
        self._ready = True

    def _sample_gpu(self, index: int, result: CollectorResult) -> None:
        try:
            gpu = self._gpu(index)
            values = self._read(gpu)
        except _GpuLost as exc:
            known = self._gpus.get(index)
            result.conditions.append(
                Condition(
                    "nvml_gpu_lost",
                    True,
                    f"GPU {index}: {exc} (NVML_ERROR_GPU_IS_LOST)",
                    gpu_index=index,
                    gpu_uuid=known.uuid if known else None,
                    pci_bus_id=known.pci if known else None,
                )
            )
            return
        where = {"gpu_index": index, "gpu_uuid": gpu.uuid, "pci_bus_id": gpu.pci}
        result.conditions.append(Condition("nvml_gpu_lost", False, **where))  # type: ignore[arg-type]
        result.conditions.append(
            Condition(
                "nvml_reset_required",
                gpu.reset_required,
                f"GPU {index}: NVML_ERROR_RESET_REQUIRED",
                **where,  # type: ignore[arg-type]
            )
        )
        if gpu.nvlinks is not None:
            down = [link for link in gpu.nvlinks if values.get(f"_nvlink_{link}_up") == 0]
            result.conditions.append(
                Condition("nvlink_link_inactive", bool(down), f"NVLink down: {down}", **where)  # type: ignore[arg-type]
            )
        values = {k: v for k, v in values.items() if not k.startswith("_")}
        result.samples.append(
            Sample(
                "gpu",
                values,
                index,
                gpu.uuid,
                gpu.pci,
                serial=gpu.serial,
                model=gpu.model,
                minor_number=gpu.minor,
            )
        )

    def _gpu(self, index: int) -> _Gpu:
        gpu = self._gpus.get(index)
        if gpu is not None:
            return gpu
        nvml = self._nvml
        handle = self._call(None, "handle", nvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call(None, "uuid", nvml.nvmlDeviceGetUUID, handle))
        pci_info = self._call(None, "pci", nvml.nvmlDeviceGetPciInfo, handle)
        pci = normalize_pci(_text(pci_info.busId)) if pci_info is not None else None
        serial = self._call(None, "serial", nvml.nvmlDeviceGetSerial, handle)
        name = self._call(None, "name", nvml.nvmlDeviceGetName, handle)
        minor_fn = getattr(nvml, "nvmlDeviceGetMinorNumber", None)
        minor = self._call(None, "minor", minor_fn, handle) if minor_fn is not None else None
        gpu = _Gpu(
            index,
            handle,
            uuid,
            pci,
            _text(serial) if serial is not None else None,
            _text(name) if name is not None else None,
            int(minor) if isinstance(minor, int) else None,
        )
        self._gpus[index] = gpu
        return gpu

    def _call(self, gpu: _Gpu | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; None for an unsupported or failing field, _GpuLost for a lost GPU."""
        if gpu is not None and what in gpu.unsupported:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            code = _err(exc)
            if code == ERR_GPU_IS_LOST:
                raise _GpuLost(str(exc)) from exc
            if gpu is not None:
                if code == ERR_NOT_SUPPORTED:
                    gpu.unsupported.add(what)
                elif code == ERR_RESET_REQUIRED:
                    gpu.reset_required = True
            if code not in (ERR_NOT_SUPPORTED, ERR_RESET_REQUIRED):
                log.debug("NVML %s failed: %r", what, exc)
            return None

    def _read(self, gpu: _Gpu) -> dict[str, float]:
        nvml, h, call = self._nvml, gpu.handle, self._call
        gpu.reset_required = False
        values: dict[str, float] = {}

        def put(name: str, value: Any, scale: float = 1.0) -> None:
            if value is not None:
                values[name] = float(value) * scale

        util = call(gpu, "util", nvml.nvmlDeviceGetUtilizationRates, h)
        put("utilization_pct", util.gpu if util is not None else None)
        mem = call(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            put("memory_used_mib", mem.used, 1 / 2**20)
            put("memory_total_mib", mem.total, 1 / 2**20)
        put("temperature_c", call(gpu, "temp", nvml.nvmlDeviceGetTemperature, h, 0))
        put("power_w", call(gpu, "power", nvml.nvmlDeviceGetPowerUsage, h), 1e-3)
        put("sm_clock_mhz", call(gpu, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, 1))
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if reasons is not None:
            put("clocks_event_reasons", call(gpu, "clocks_event", reasons, h))
        for name, etype, ctype in (
            ("ecc_sbe_volatile", 0, 0),
            ("ecc_dbe_volatile", 1, 0),
            ("ecc_sbe_aggregate", 0, 1),
            ("ecc_dbe_aggregate", 1, 1),
        ):
            put(name, call(gpu, name, nvml.nvmlDeviceGetTotalEccErrors, h, etype, ctype))
        rows = call(gpu, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            put("remapped_rows_correctable", corr)
            put("remapped_rows_uncorrectable", unc)
            put("remapped_rows_pending", pending)
            put("remapped_rows_failure", failure)
        put("pcie_replay_count", call(gpu, "replay", nvml.nvmlDeviceGetPcieReplayCounter, h))
        now = self._monotonic()
        if not gpu.slow or now - gpu.slow_at >= self._slow_s:
            gpu.slow, gpu.slow_at = self._read_slow(gpu), now
        values.update(gpu.slow)
        return values

    def _read_slow(self, gpu: _Gpu) -> dict[str, float]:
        """Counters that move slowly or cost many calls; read every slow_interval_s."""
        nvml, h, call = self._nvml, gpu.handle, self._call
        out: dict[str, float] = {}
        for name, fn in (
            ("retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus),
            ("pcie_link_width", nvml.nvmlDeviceGetCurrPcieLinkWidth),
            ("pcie_link_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth),
            ("pcie_link_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration),
            ("pcie_link_gen_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration),
        ):
            value = call(gpu, name, fn, h)
            if value is not None:
                out[name] = float(value)
        fields = call(gpu, "fields", nvml.nvmlDeviceGetFieldValues, h, [FI_GPU_RECOVERY_ACTION])
        if fields:
            fv = fields[0]
            if int(fv.nvmlReturn) == 0:
                out["gpu_recovery_action"] = float(fv.value.uiVal)
        out.update(self._read_nvlink(gpu))
        return out

    def _read_nvlink(self, gpu: _Gpu) -> dict[str, float]:
        nvml, h = self._nvml, gpu.handle
        if "nvlink" in gpu.unsupported:
            return {}
        links = range(MAX_NVLINKS) if gpu.nvlinks is None else gpu.nvlinks
        up: list[int] = []
        out: dict[str, float] = {}
        totals = {
            "nvlink_replay_errors": 0.0,
            "nvlink_recovery_errors": 0.0,
            "nvlink_crc_errors": 0.0,
        }
        for link in links:
            try:
                state = nvml.nvmlDeviceGetNvLinkState(h, link)
            except Exception as exc:
                if _err(exc) == ERR_GPU_IS_LOST:
                    raise _GpuLost(str(exc)) from exc
                continue
            out[f"_nvlink_{link}_up"] = 1.0 if state == 1 else 0.0
            if state != 1:
                continue
            up.append(link)
            for name, counters in (
                ("nvlink_replay_errors", (0,)),
                ("nvlink_recovery_errors", (1,)),
                ("nvlink_crc_errors", (2, 3)),
            ):
                for counter in counters:
                    value = self._call(
                        gpu,
                        f"nvlink_err_{counter}",
                        nvml.nvmlDeviceGetNvLinkErrorCounter,
                        h,
                        link,
                        counter,
                    )
                    totals[name] += float(value or 0)
        if gpu.nvlinks is None:
            gpu.nvlinks = up  # the links that were up at start are the ones to watch
            if not up:
                gpu.unsupported.add("nvlink")
                return {}
        return {**out, **totals}

    # -- Xid events -----------------------------------------------------------------

    async def run(self, emit: EmitEvents) -> None:
        """Wait for NVML Xid events in a thread; each wait returns within the timeout."""
        while not self._closed:
            if not self._ready or not self._gpus:
                await asyncio.sleep(1.0)
                continue
            events = await asyncio.to_thread(self.wait_events)
            if events:
                await emit(events)

    def wait_events(self) -> list[Event]:
        nvml = self._nvml
        if self._event_set is None:
            self._event_set = nvml.nvmlEventSetCreate()
            for gpu in self._gpus.values():
                supported = self._call(
                    gpu, "events", nvml.nvmlDeviceGetSupportedEventTypes, gpu.handle
                )
                if supported is not None and int(supported) & XID_EVENT:
                    self._call(
                        gpu,
                        "register",
                        nvml.nvmlDeviceRegisterEvents,
                        gpu.handle,
                        XID_EVENT,
                        self._event_set,
                    )
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, self._event_timeout_ms)
        except Exception as exc:  # noqa: BLE001 - NVMLError_Timeout is the normal case
            if _err(exc) != ERR_TIMEOUT:
                log.debug("nvmlEventSetWait_v2: %r", exc)
                time.sleep(self._event_timeout_ms / 1000)  # don't spin on a broken set
            return []
        if not int(data.eventType) & XID_EVENT:
            return []
        xid = int(data.eventData)
        found = self._gpu_for_handle(data.device)
        sig = get_signature_for_xid(xid)
        return [
            Event(
                signature_id=sig.id if sig else "xid-unknown",
                at=dt.datetime.now(dt.UTC),
                source=FindingSource.NVML,
                evidence=f"NVML event: Xid {xid} on GPU {found.index if found else '?'}",
                xid=xid,
                gpu_index=found.index if found else None,
                gpu_uuid=found.uuid if found else None,
                pci_bus_id=found.pci if found else None,
            )
        ]

    def _gpu_for_handle(self, handle: Any) -> _Gpu | None:
        try:
            uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        except Exception:  # noqa: BLE001 - a lost GPU cannot name itself
            return None
        return next((g for g in self._gpus.values() if g.uuid == uuid), None)

    async def close(self) -> None:
        self._closed = True
        if self._ready and self._nvml is not None:
            try:
                if self._event_set is not None:
                    self._nvml.nvmlEventSetFree(self._event_set)
                self._nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.debug("nvmlShutdown: %r", exc)
        self._ready = False
