"""ib_write_bw parser, on the recorded outputs in tests/fixtures/checks (see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.checks.models import ParseError
from gpufleet.checks.perftest import MIB_PER_SEC_TO_GBITS, parse_ib_write_bw

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_reference_ndr_row_in_gbits() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-ndr-reference.txt"))
    assert result.finished and result.passed
    assert (result.test, result.device, result.link_type) == ("RDMA_Write BW Test", "mlx5_0", "IB")
    assert (result.connection_type, result.qps, result.unit) == ("RC", 1, "Gb/sec")
    (row,) = result.rows
    assert (row.msg_bytes, row.iterations) == (65536, 5000)
    assert (row.bw_peak_gbits, row.bw_avg_gbits, row.msg_rate_mpps) == (389.42, 388.77, 0.741456)
    assert (result.bw_avg_gbits, result.msg_bytes) == (388.77, 65536)


def test_mb_per_sec_is_converted_to_gbits() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-mbsec-all-sizes-numa-bound.txt"))
    assert result.finished and result.unit == "MB/sec"
    assert len(result.rows) == 23  # 2 B ... 8 MiB; "Conflicting CPU frequency" lines skipped
    assert result.msg_bytes == 8388608
    # perftest's MB is 2^20 bytes: 22292.76 MiB/s = 187.0 Gb/s (not 178.3 as 10^6 would give).
    assert result.bw_avg_gbits == pytest.approx(22292.76 * 1048576 * 8 / 1e9)
    assert result.bw_avg_gbits == pytest.approx(187.005, abs=0.01)


def test_mib_reading_agrees_with_the_message_rate() -> None:
    """Why MB/sec is MiB/s: bytes × messages/s from the MsgRate column matches it."""
    for name in ("ib-write-bw-mbsec-all-sizes-numa-bound.txt", "ib-write-bw-mbsec-server-side.txt"):
        row = parse_ib_write_bw(read(name)).largest
        assert row is not None and row.msg_rate_mpps is not None
        from_rate = row.msg_bytes * row.msg_rate_mpps * 1e6 * 8 / 1e9
        assert row.bw_avg_gbits == pytest.approx(from_rate, rel=0.01)
        assert row.bw_avg_gbits / MIB_PER_SEC_TO_GBITS * 8 / 1000 != pytest.approx(
            from_rate, rel=0.01
        )  # the 10^6 reading would be 4.6 % off


def test_the_row_with_the_largest_message_wins() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-roce100g-gbits-dc-client.txt"))
    assert result.finished and result.connection_type == "DC" and result.link_type == "Ethernet"
    assert (result.msg_bytes, result.bw_avg_gbits) == (8388608, 97.57)
    assert result.rows[0].msg_bytes == 2 and result.rows[0].bw_avg_gbits == pytest.approx(0.092692)


def test_server_side_single_row() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-mbsec-server-side.txt"))
    assert result.finished and len(result.rows) == 1
    assert result.bw_avg_gbits == pytest.approx(10787.86 * MIB_PER_SEC_TO_GBITS)


def test_server_still_waiting_did_not_finish() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-server-waiting-variant.txt"))
    assert result.rows == () and not result.finished and not result.passed


def test_connect_failure_is_recognized_and_fails() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-connect-failure-variant.txt"))
    assert not result.passed
    assert [e.line for e in result.errors] == [
        "Couldn't connect to 10.0.0.2:18515",
        "Unable to init the socket connection",
    ]


def test_truncated_table_did_not_finish() -> None:
    result = parse_ib_write_bw(read("ib-write-bw-truncated-variant.txt"))
    assert len(result.rows) == 9 and not result.closed and not result.finished


def test_duration_mode_peak_zero_and_last_table_wins() -> None:
    text = read("ib-write-bw-ndr-reference.txt")
    twice = text + text.replace("389.42             388.77", "0.00               391.02")
    result = parse_ib_write_bw(twice)
    assert result.tables == 2 and result.finished
    assert (result.rows[0].bw_peak_gbits, result.bw_avg_gbits) == (0.0, 391.02)


@pytest.mark.parametrize("text", ["", "nothing here\n", "65536 5000 389.42 388.77\n"])
def test_not_perftest_output_raises(text: str) -> None:
    with pytest.raises(ParseError, match="no ib_write_bw output"):
        parse_ib_write_bw(text)
