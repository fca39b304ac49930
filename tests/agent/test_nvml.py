from __future__ import annotations

import datetime as dt

import pynvml
from agent_fakes import FakeNvml, h100s

from gpufleet.agent.collectors.nvml import NvmlCollector
from gpufleet.agent.detectors import Detector
from gpufleet.core.agent_protocol import FindingState
from gpufleet.core.clock import FakeClock


def conditions(result, name):
    return [c for c in result.conditions if c.condition == name]


def test_reads_every_field_of_every_gpu() -> None:
    fake = FakeNvml(h100s(2))
    fake.gpus[1].ecc = {(0, 0): 3, (1, 1): 1}
    fake.gpus[1].reasons = 0x40
    result = NvmlCollector(nvml=fake, expected_gpus=2).collect_sync(FakeClock().now())
    assert [s.gpu_index for s in result.samples] == [0, 1]
    s = result.samples[1]
    assert s.pci_bus_id == "0000:28:00.0"
    assert s.minor_number == 1  # /dev/nvidia1: the exporter's device="nvidia1"
    assert s.values["utilization_pct"] == 50
    assert s.values["power_w"] == 350.0
    assert s.values["memory_total_mib"] == 80 * 1024
    assert s.values["ecc_sbe_volatile"] == 3 and s.values["ecc_dbe_aggregate"] == 1
    assert s.values["clocks_event_reasons"] == 0x40
    assert s.values["pcie_link_width"] == 16
    assert not any(c.active for c in result.conditions)


def test_not_supported_fields_are_omitted_and_not_asked_again() -> None:
    fake = FakeNvml(h100s(1))
    fake.gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetRemappedRows"}
    collector = NvmlCollector(nvml=fake)
    first = collector.collect_sync(FakeClock().now())
    collector.collect_sync(FakeClock().now())
    values = first.samples[0].values
    assert "power_w" not in values and "remapped_rows_pending" not in values
    assert values["temperature_c"] == 55
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1


def test_gpu_lost_is_a_condition_and_a_fatal_finding() -> None:
    fake = FakeNvml(h100s(2))
    collector = NvmlCollector(nvml=fake)
    collector.collect_sync(FakeClock().now())
    fake.gpus[1].lost = True
    result = collector.collect_sync(FakeClock().now())
    lost = [c for c in conditions(result, "nvml_gpu_lost") if c.active]
    assert len(lost) == 1 and lost[0].gpu_index == 1 and lost[0].pci_bus_id == "0000:28:00.0"
    assert [s.gpu_index for s in result.samples] == [0]
    changes = Detector().observe(result, FakeClock().now())
    assert [(c.signature_id, c.severity.value) for c in changes] == [("gpu-lost", "fatal")]
    assert isinstance(pynvml.NVMLError(15), pynvml.NVMLError_GpuIsLost)


def test_init_failure_makes_the_node_unhealthy_never_silent() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    result = NvmlCollector(nvml=fake).collect_sync(FakeClock().now())
    assert conditions(result, "nvml_init_failed")[0].active
    changes = Detector().observe(result, FakeClock().now())
    assert [c.signature_id for c in changes] == ["nvml-init-failed"]


def test_driver_mismatch_is_named() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    result = NvmlCollector(nvml=fake).collect_sync(FakeClock().now())
    ids = {c.signature_id for c in Detector().observe(result, FakeClock().now())}
    assert ids == {"nvml-init-failed", "nvml-driver-mismatch"}


def test_gpu_count_below_expected() -> None:
    result = NvmlCollector(nvml=FakeNvml(h100s(7)), expected_gpus=8).collect_sync(FakeClock().now())
    changes = Detector().observe(result, FakeClock().now())
    assert [c.signature_id for c in changes] == ["gpu-missing"]
    assert "7 GPUs, expected 8" in changes[0].evidence


def test_xid_event_through_the_event_api() -> None:
    fake = FakeNvml(h100s(2))
    collector = NvmlCollector(nvml=fake, event_timeout_ms=10)
    collector.collect_sync(FakeClock().now())
    assert collector.wait_events() == []  # timeout: no event
    assert fake.registered == [0, 1]
    fake.inject_xid(1, 79)
    [event] = collector.wait_events()
    assert (event.signature_id, event.xid, event.gpu_index) == ("xid-79", 79, 1)
    assert event.pci_bus_id == "0000:28:00.0"
    [change] = Detector().events([event], event.at)
    assert change.signature_id == "xid-79" and change.source.value == "nvml"


def test_nvlink_counters_and_a_link_going_down() -> None:
    fake = FakeNvml(h100s(1))
    fake.gpus[0].nvlinks = 4
    fake.gpus[0].nvlink_errors = 2
    t = [0.0]
    collector = NvmlCollector(nvml=fake, slow_interval_s=10, monotonic=lambda: t[0])
    first = collector.collect_sync(FakeClock().now())
    assert first.samples[0].values["nvlink_replay_errors"] == 8  # 4 links × 2
    assert not conditions(first, "nvlink_link_inactive")[0].active
    fake.gpus[0].links_down = {2}
    t[0] = 11.0
    later = collector.collect_sync(FakeClock().now())
    assert conditions(later, "nvlink_link_inactive")[0].active


def test_sample_becomes_a_finding_via_catalog_thresholds() -> None:
    fake = FakeNvml(h100s(1))
    clock = FakeClock()
    collector = NvmlCollector(nvml=fake)
    detector = Detector()
    detector.observe(collector.collect_sync(clock.now()), clock.now())
    fake.gpus[0].ecc = {(1, 0): 1}  # one uncorrectable error
    clock.advance(1)
    changes = detector.observe(collector.collect_sync(clock.now()), clock.now())
    assert [c.signature_id for c in changes] == ["ecc-dbe"]
    assert changes[0].state is FindingState.OPEN


def test_close_shuts_nvml_down() -> None:
    import asyncio

    fake = FakeNvml(h100s(1))
    collector = NvmlCollector(nvml=fake)
    collector.collect_sync(dt.datetime.now(dt.UTC))
    asyncio.run(collector.close())
    assert fake.shutdown
