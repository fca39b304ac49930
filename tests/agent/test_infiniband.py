from __future__ import annotations

from pathlib import Path

from gpufleet.agent.collectors.base import CollectorResult
from gpufleet.agent.collectors.infiniband import InfinibandCollector, parse_rate, parse_state
from gpufleet.agent.detectors import Detector
from gpufleet.core.clock import FakeClock


def make_port(root: Path, device: str = "mlx5_0", port: str = "1", **files: str) -> Path:
    base = root / device / "ports" / port
    (base / "counters").mkdir(parents=True)
    defaults = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)"}
    for name, text in {**defaults, **files}.items():
        (base / name).write_text(text + "\n")
    for counter in ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery"):
        (base / "counters" / counter).write_text("0\n")
    return base


def set_counter(port: Path, name: str, value: int) -> None:
    (port / "counters" / name).write_text(f"{value}\n")


def values(result: CollectorResult) -> dict[str, float]:
    [sample] = result.samples
    assert sample.component == "mlx5_0/1"
    return dict(sample.values)


def test_parsers() -> None:
    assert parse_state("4: ACTIVE") == 4 and parse_state("garbage") is None
    assert parse_rate("200 Gb/sec (2X NDR)") == 200.0


def test_deltas_between_samples_and_wrap(tmp_path: Path) -> None:
    port = make_port(tmp_path)
    c = InfinibandCollector(root=tmp_path)
    now = FakeClock().now()
    assert values(c.collect_sync(now))["ib_symbol_error_delta"] == 0
    set_counter(port, "symbol_error", 25)
    assert values(c.collect_sync(now))["ib_symbol_error_delta"] == 25
    set_counter(port, "symbol_error", 3)  # reset (perfquery -R) or 32-bit wrap
    v = values(c.collect_sync(now))
    assert v["ib_symbol_error_delta"] == 0 and v["ib_symbol_error"] == 3
    set_counter(port, "symbol_error", 5)
    assert values(c.collect_sync(now))["ib_symbol_error_delta"] == 2


def test_rate_downgrade_against_the_best_seen(tmp_path: Path) -> None:
    port = make_port(tmp_path)
    c = InfinibandCollector(root=tmp_path)
    clock, det = FakeClock(), Detector()
    det.observe(c.collect_sync(clock.now()), clock.now())
    (port / "rate").write_text("200 Gb/sec (2X NDR)\n")
    found = []
    for _ in range(60):
        clock.advance(1)
        found += det.observe(c.collect_sync(clock.now()), clock.now())
    assert [f.signature_id for f in found] == ["ib-rate-downgrade"]
    assert found[0].component == "mlx5_0/1"


def test_link_down_and_flap_findings(tmp_path: Path) -> None:
    port = make_port(tmp_path)
    c = InfinibandCollector(root=tmp_path)
    clock, det = FakeClock(), Detector()
    det.observe(c.collect_sync(clock.now()), clock.now())
    set_counter(port, "link_downed", 1)
    (port / "phys_state").write_text("2: Polling\n")
    (port / "state").write_text("1: DOWN\n")
    found = []
    for _ in range(30):
        clock.advance(1)
        found += det.observe(c.collect_sync(clock.now()), clock.now())
    assert {f.signature_id for f in found} == {"ib-link-flap", "ib-link-down"}


def test_excluded_devices_and_missing_root(tmp_path: Path) -> None:
    make_port(tmp_path, device="mlx5_0")
    make_port(tmp_path, device="mlx5_bond")
    c = InfinibandCollector(root=tmp_path, exclude=("mlx5_bond",))
    assert len(c.collect_sync(FakeClock().now()).samples) == 1
    missing = InfinibandCollector(root=tmp_path / "nope")
    assert missing.collect_sync(FakeClock().now()).samples == []
