from __future__ import annotations

import datetime as dt

from gpufleet.agent.collectors.base import CollectorResult, Condition, Event, Sample
from gpufleet.agent.detectors import Detector
from gpufleet.core.agent_protocol import FindingState
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import FindingSource

PCI = "0000:3b:00.0"


def gpu(**values: float) -> CollectorResult:
    return CollectorResult(
        samples=[Sample("gpu", values, gpu_index=0, gpu_uuid="GPU-a", pci_bus_id=PCI)]
    )


def xid(n: int, at: dt.datetime, source: FindingSource = FindingSource.KERNEL_LOG) -> Event:
    return Event(f"xid-{n}", at, source, f"NVRM: Xid (PCI:0000:3b:00): {n}", pci_bus_id=PCI)


def test_repeats_fold_into_one_finding() -> None:
    clock, det = FakeClock(), Detector(fold_emit_interval_s=10)
    [first] = det.events([xid(48, clock.now())], clock.now())
    assert first.count == 1 and first.key == f"xid-48@{PCI}"
    clock.advance(1)
    assert det.events([xid(48, clock.now())], clock.now()) == []  # folded, sent later
    clock.advance(1)
    assert det.events([xid(48, clock.now())], clock.now()) == []
    clock.advance(10)
    [folded] = det.tick(clock.now())
    assert folded.count == 3 and folded.first_seen == first.first_seen
    assert folded.last_seen == clock.now() - dt.timedelta(seconds=10)
    assert len(det.open_findings()) == 1


def test_nvml_event_and_log_line_of_the_same_xid_count_once() -> None:
    clock, det = FakeClock(), Detector(fold_emit_interval_s=0)
    det.events([xid(79, clock.now(), FindingSource.NVML)], clock.now())
    clock.advance(0.5)
    [change] = det.events([xid(79, clock.now())], clock.now())
    assert change.count == 1 and "NVRM" in change.evidence


def test_log_only_signature_clears_after_quiet_period() -> None:
    clock, det = FakeClock(), Detector()
    det.events([xid(13, clock.now())], clock.now())  # catalog: quiet 3600 s
    clock.advance(3599)
    assert det.tick(clock.now()) == []
    clock.advance(1)
    [cleared] = det.tick(clock.now())
    assert cleared.state is FindingState.CLEARED and det.open_findings() == []


def test_repair_mode_signature_never_clears_on_its_own() -> None:
    clock, det = FakeClock(), Detector(local_ttl_s=86_400)
    det.events([xid(79, clock.now())], clock.now())
    clock.advance(7 * 86_400)
    assert det.tick(clock.now()) == []  # nothing sent: the server owns that clear
    assert det.open_findings() == []  # forgotten locally after the TTL


def test_metric_finding_clears_with_hysteresis() -> None:
    clock, det = FakeClock(), Detector()
    [opened] = det.observe(gpu(remapped_rows_pending=1), clock.now())
    assert opened.signature_id == "row-remap-pending"
    clock.advance(1)
    [cleared] = det.observe(gpu(remapped_rows_pending=0), clock.now())  # samples = 1
    assert cleared.state is FindingState.CLEARED


def test_windowed_rule_counts_buckets_not_raw_samples() -> None:
    # hw-slowdown: 6 of 10 one-minute buckets in 10 minutes, then 10 clean samples.
    clock, det = FakeClock(), Detector()
    for _ in range(30):  # 30 s of slowdown at 1 Hz is one bucket: no finding
        assert det.observe(gpu(clocks_event_reasons=0x8), clock.now()) == []
        clock.advance(1)
    opened = []
    for _ in range(6 * 60):
        opened += det.observe(gpu(clocks_event_reasons=0x8), clock.now())
        clock.advance(1)
    assert [c.signature_id for c in opened] == ["hw-slowdown"]
    cleared = []
    for _ in range(15 * 60):
        cleared += det.observe(gpu(clocks_event_reasons=0), clock.now())
        clock.advance(1)
    assert [c.state for c in cleared] == [FindingState.CLEARED]


def test_delta_rule_ignores_counter_reset() -> None:
    clock, det = FakeClock(), Detector()
    det.observe(gpu(ecc_dbe_volatile=5), clock.now())  # baseline, not an increase
    clock.advance(1)
    assert det.observe(gpu(ecc_dbe_volatile=0), clock.now()) == []  # driver reload
    clock.advance(1)
    [opened] = det.observe(gpu(ecc_dbe_volatile=1), clock.now())
    assert opened.signature_id == "ecc-dbe"


def test_condition_recurrence_counts() -> None:
    clock, det = FakeClock(), Detector()
    down = CollectorResult(conditions=[Condition("nvlink_link_inactive", True, "link 3")])
    up = CollectorResult(conditions=[Condition("nvlink_link_inactive", False)])
    assert len(det.observe(down, clock.now())) == 1
    assert det.observe(down, clock.now()) == []  # still down: same occurrence
    assert det.observe(up, clock.now()) == []  # 1 of 3 clean samples
    [again] = det.observe(down, clock.now())
    assert again.count == 2 and again.state is FindingState.OPEN
    for _ in range(2):
        assert det.observe(up, clock.now()) == []
    [cleared] = det.observe(up, clock.now())
    assert cleared.state is FindingState.CLEARED


def test_slurm_reason_rules() -> None:
    det, now = Detector(), FakeClock().now()

    def slurm(state: str, reason: str) -> CollectorResult:
        attrs = {"state": state, "reason": reason}
        return CollectorResult(
            conditions=[Condition("slurm_node_reason", True, reason, attrs=attrs)]
        )

    ids = {c.signature_id for c in det.observe(slurm("drain", "NHC: check_gpu:  bad"), now)}
    assert ids == {"slurm-foreign-drain"}
    own = Detector().observe(slurm("drain", "gpufleet: repair r-1"), now)
    assert own == []
    gres = {
        c.signature_id
        for c in Detector().observe(
            slurm("drain", "gres/gpu count reported lower than configured (7 < 8)"), now
        )
    }
    assert "slurm-gres-gpu-count-low" in gres


def test_restore_keeps_folding_after_restart() -> None:
    clock, det = FakeClock(), Detector(fold_emit_interval_s=0)
    det.events([xid(48, clock.now())], clock.now())
    again = Detector(fold_emit_interval_s=0)
    again.restore(det.open_findings())
    clock.advance(60)
    [change] = again.events([xid(48, clock.now())], clock.now())
    assert change.count == 2


def test_a_held_back_repeat_survives_a_restart() -> None:
    clock, det = FakeClock(), Detector(fold_emit_interval_s=10)
    det.events([xid(48, clock.now())], clock.now())
    clock.advance(1)
    assert det.events([xid(48, clock.now())], clock.now()) == []  # held back for folding
    assert det.unsent_keys() == [f"xid-48@{PCI}"]
    # The agent dies now; the snapshot names the unsent key, and the restart sends it.
    again = Detector(fold_emit_interval_s=10)
    again.restore(det.open_findings(), unsent=det.unsent_keys())
    clock.advance(10)
    [change] = again.tick(clock.now())
    assert change.count == 2
    assert again.unsent_keys() == []


def test_kernel_log_match_gets_the_gpu_from_nvml() -> None:
    clock, det = FakeClock(), Detector()
    det.observe(gpu(utilization_pct=1), clock.now())
    [change] = det.events([xid(48, clock.now())], clock.now())
    assert (change.gpu_uuid, change.gpu_index) == ("GPU-a", 0)
