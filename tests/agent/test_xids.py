from __future__ import annotations

import datetime as dt

from gpufleet.agent.collectors.base import Event, Sample
from gpufleet.agent.xids import XidCounter
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import FindingSource

KMSG, NVML = FindingSource.KERNEL_LOG, FindingSource.NVML
T0 = FakeClock().now()
PCI = "0000:3b:00.0"


def xid(code: int, source: FindingSource, at_s: float, **where: object) -> Event:
    at = T0 + dt.timedelta(seconds=at_s)
    return Event(f"xid-{code}", at, source, "x", xid=code, **where)  # type: ignore[arg-type]


def counter() -> XidCounter:
    c = XidCounter(cross_source_window_s=5.0)
    c.learn([Sample("gpu", {}, 2, "GPU-c", PCI)])
    return c


def totals(c: XidCounter) -> dict[int, int]:
    return {x.xid: x.count for x in c.counts()}


def test_both_sources_of_one_occurrence_count_once() -> None:
    c = counter()
    c.observe([xid(79, KMSG, 0, pci_bus_id=PCI), xid(79, NVML, 2, gpu_uuid="GPU-c")])
    [count] = c.counts()
    assert (count.xid, count.count) == (79, 1)
    assert (count.pci_bus_id, count.gpu_uuid) == (PCI, "GPU-c")


def test_each_report_pairs_once() -> None:
    # Two Xids a second apart, each seen by both sources, in the order they arrive:
    # pairing "the last one from the other source" would count 1.
    c = counter()
    c.observe(
        [
            xid(48, NVML, 0, gpu_index=2),
            xid(48, KMSG, 1, pci_bus_id=PCI),
            xid(48, NVML, 2, gpu_index=2),
            xid(48, KMSG, 3, pci_bus_id=PCI),
        ]
    )
    assert totals(c) == {48: 2}


def test_repeats_from_one_source_and_late_reports_all_count() -> None:
    c = counter()
    c.observe([xid(13, KMSG, 0, pci_bus_id=PCI), xid(13, KMSG, 1, pci_bus_id=PCI)])
    c.observe([xid(13, NVML, 60, gpu_uuid="GPU-c")])  # outside the window: a third one
    c.observe([xid(31, KMSG, 61, pci_bus_id=PCI)])
    assert totals(c) == {13: 3, 31: 1}


def test_gpus_apart_and_events_without_a_code_ignored() -> None:
    c = counter()
    c.observe(
        [
            xid(79, KMSG, 0, pci_bus_id=PCI),
            xid(79, KMSG, 0, pci_bus_id="0000:5d:00.0"),
            Event("kernel-oom", T0, KMSG, "x"),
        ]
    )
    assert sorted((x.pci_bus_id, x.count) for x in c.counts()) == [
        ("0000:3b:00.0", 1),
        ("0000:5d:00.0", 1),
    ]


def test_a_report_without_its_gpu_pairs_with_the_other_sources() -> None:
    """A kernel-log Xid whose PCI address was redacted or cut names no GPU: it counts
    for the node, once, and NVML's report of the same Xid does not count it again."""
    c = counter()
    c.observe([xid(79, KMSG, 0), xid(79, NVML, 1, gpu_uuid="GPU-c")])
    [count] = c.counts()
    assert (count.xid, count.count, count.pci_bus_id) == (79, 1, None)
    # The other order, and a GPU-less report well after the window: a second Xid.
    c = counter()
    c.observe([xid(48, NVML, 0, gpu_uuid="GPU-c"), xid(48, KMSG, 2), xid(48, KMSG, 30)])
    assert {(x.pci_bus_id, x.count) for x in c.counts()} == {(None, 1), (PCI, 1)}
    # Two GPU-less reports from the same source are two occurrences.
    c = counter()
    c.observe([xid(13, KMSG, 0), xid(13, KMSG, 0.5)])
    assert totals(c) == {13: 2}
