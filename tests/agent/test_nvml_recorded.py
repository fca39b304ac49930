"""The agent's NVML collector and detectors on what a real H200 reported
(``tests/fixtures/nvml``, recorded by ``bench/nvml_real.py``): the samples are what the
detectors see; a healthy GPU, idle or at 100 % with its software power cap active (clock
event reason 0x4), raises no finding; the collector's fields agree with nvidia-smi's on
the same machine."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.collectors.base import CollectorResult, Condition, Sample
from gpufleet.agent.detectors import Detector

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def as_result(data: dict[str, Any]) -> CollectorResult:
    s = data["sample"]
    sample = Sample(
        scope="gpu",
        values=s["values"],
        gpu_index=s["gpu_index"],
        gpu_uuid=s["gpu_uuid"],
        pci_bus_id=s["pci_bus_id"],
        serial=s["serial"],
        model=s["model"],
    )
    conditions = [
        Condition(c["condition"], c["active"], c["evidence"], gpu_index=s["gpu_index"])
        for c in data["conditions"]
    ]
    return CollectorResult(samples=[sample], conditions=conditions)


def query_row(name: str) -> dict[str, str]:
    with (FIXTURES / name).open() as f:
        (row,) = csv.DictReader(f, skipinitialspace=True)
    return row


@pytest.mark.parametrize("name", ["nvml-sample-h200-idle.json", "nvml-sample-h200-load.json"])
def test_a_healthy_h200_raises_no_finding(name: str) -> None:
    result = as_result(recorded(name))
    detector = Detector()
    start = dt.datetime(2026, 12, 4, 14, 0, tzinfo=dt.UTC)
    changes = []
    for second in range(120):  # two minutes of the same readings at 1 Hz
        now = start + dt.timedelta(seconds=second)
        changes += detector.observe(result, now) + detector.tick(now)
    assert changes == []


def test_under_load_the_power_cap_is_the_only_clock_event() -> None:
    values = recorded("nvml-sample-h200-load.json")["sample"]["values"]
    assert values["utilization_pct"] == 100.0
    assert int(values["clocks_event_reasons"]) == 0x4  # SW power cap, nothing thermal
    assert 600 < values["power_w"] <= 700
    load = query_row("nvidia-smi-query-h200-load.csv")
    assert load["clocks_event_reasons.active"] == "0x0000000000000004"
    assert load["power.limit [W]"] == "700.00 W"
    perf = (FIXTURES / "nvidia-smi-q-perf-h200-load.txt").read_text()
    assert "SW Power Cap                                   : Active" in perf


def test_the_collector_and_nvidia_smi_agree_on_the_same_gpu() -> None:
    sample = recorded("nvml-sample-h200-idle.json")["sample"]
    row = query_row("nvidia-smi-query-h200-idle.csv")
    assert sample["gpu_uuid"] == row["uuid"] and sample["serial"] == row["serial"]
    assert sample["model"] == row["name"] == "NVIDIA H200"
    assert sample["values"]["memory_total_mib"] == float(row["memory.total [MiB]"].split()[0])
    # nvidia-smi prints an 8-digit PCI domain; the collector normalises it to 4.
    assert row["pci.bus_id"].lower().endswith(sample["pci_bus_id"].split(":", 1)[1])
    text = (FIXTURES / "nvidia-smi-q-h200-idle.txt").read_text()
    assert f"GPU UUID                                           : {sample['gpu_uuid']}" in text


def test_the_same_readings_with_a_failed_row_remap_do_raise_one() -> None:
    data = recorded("nvml-sample-h200-load.json")
    data["sample"]["values"] = {**data["sample"]["values"], "remapped_rows_failure": 1.0}
    detector = Detector()
    now = dt.datetime(2026, 12, 4, 14, 0, tzinfo=dt.UTC)
    changes = detector.observe(as_result(data), now)
    assert [c.gpu_uuid for c in changes] == [data["sample"]["gpu_uuid"]]
    assert "remap" in changes[0].signature_id
