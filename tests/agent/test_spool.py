from __future__ import annotations

import datetime as dt
from pathlib import Path

from gpufleet.agent.findings import FindingChange
from gpufleet.agent.spool import FindingSpool, MetricSpool
from gpufleet.core.agent_protocol import FindingState, NodeReport
from gpufleet.core.enums import FindingSource, Severity

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def change(n: int) -> FindingChange:
    return FindingChange(
        key=f"k{n}",
        signature_id="xid-48",
        state=FindingState.OPEN,
        severity=Severity.CRITICAL,
        source=FindingSource.KERNEL_LOG,
        first_seen=T0,
        last_seen=T0,
        evidence=f"line {n}",
    )


def test_findings_survive_restart_in_order(tmp_path: Path) -> None:
    spool = FindingSpool(tmp_path)
    first = spool.add([change(1), change(2)])
    spool.add([change(3)])
    spool.close()
    again = FindingSpool(tmp_path)
    pending = again.pending(100)
    assert [p.evidence for p in pending] == ["line 1", "line 2", "line 3"]
    assert [p.seq for p in pending] == [first[0].seq, first[0].seq + 1, first[0].seq + 2]


def test_torn_last_record_is_discarded(tmp_path: Path) -> None:
    spool = FindingSpool(tmp_path)
    spool.add([change(1)])
    spool.close()
    path = tmp_path / "findings.log"
    good = path.read_bytes()
    path.write_bytes(good + b'0badc0de {"f": {"seq": 9')  # crash mid-write
    again = FindingSpool(tmp_path)
    assert [p.evidence for p in again.pending(10)] == ["line 1"]
    assert path.read_bytes() == good  # cut back to the last whole record
    again.add([change(2)])  # and appending after the cut works
    again.close()
    assert [p.evidence for p in FindingSpool(tmp_path).pending(10)] == ["line 1", "line 2"]


def test_corrupt_record_in_the_middle_stops_the_load_there(tmp_path: Path) -> None:
    spool = FindingSpool(tmp_path)
    spool.add([change(1)])
    spool.add([change(2)])
    spool.close()
    path = tmp_path / "findings.log"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[-1] = lines[-1].replace(b"line 2", b"line X")  # CRC no longer matches
    path.write_bytes(b"".join(lines))
    assert [p.evidence for p in FindingSpool(tmp_path).pending(10)] == ["line 1"]


def test_acked_are_removed_and_seq_only_grows_across_restarts(tmp_path: Path) -> None:
    spool = FindingSpool(tmp_path)
    reports = spool.add([change(i) for i in range(5)])
    spool.ack(reports[2].seq)
    assert [p.seq for p in spool.pending(10)] == [r.seq for r in reports[3:]]
    spool.ack(reports[-1].seq)
    assert spool.depth() == 0
    spool.close()
    again = FindingSpool(tmp_path)
    assert again.depth() == 0
    [new] = again.add([change(9)])
    assert new.seq == reports[-1].seq + 1


def test_seq_survives_compaction(tmp_path: Path) -> None:
    spool = FindingSpool(tmp_path)
    last = 0
    for i in range(400):  # enough to pass the compaction threshold
        [r] = spool.add([change(i).model_copy(update={"evidence": "x" * 1000})])
        spool.ack(r.seq)
        last = r.seq
    assert spool.size_bytes() < 300 * 1024
    spool.close()
    [new] = FindingSpool(tmp_path).add([change(0)])
    assert new.seq == last + 1


def test_findings_are_never_dropped(tmp_path: Path) -> None:
    spool = FindingSpool(tmp_path)
    for i in range(2000):
        spool.add([change(i)])
    assert spool.depth() == 2000


def report(seq: int) -> NodeReport:
    return NodeReport(seq=seq, sampled_at=T0, gpus=[])


def test_metrics_bounded_oldest_dropped_first(tmp_path: Path) -> None:
    spool = MetricSpool(tmp_path, limit_bytes=256 * 1024)
    for seq in range(1, 20_001):
        spool.add(report(seq))
    assert spool.size_bytes() <= 256 * 1024 + 64 * 1024
    pending = spool.pending(100_000)
    seqs = [r.seq for r in pending]
    assert seqs == sorted(seqs) and seqs[-1] == 20_000 and seqs[0] > 1
    assert spool.dropped == 20_000 - len(seqs)
    assert spool.depth() == len(seqs)


def test_metrics_ack_and_restart(tmp_path: Path) -> None:
    spool = MetricSpool(tmp_path, limit_bytes=1 << 20)
    for seq in range(1, 11):
        spool.add(report(seq))
    spool.ack(4)
    assert [r.seq for r in spool.pending(3)] == [5, 6, 7]
    spool.ack(10)
    assert spool.pending(10) == [] and list(tmp_path.glob("*.seg")) == []
    spool.add(report(11))
    again = MetricSpool(tmp_path, limit_bytes=1 << 20)
    assert [r.seq for r in again.pending(10)] == [11]
