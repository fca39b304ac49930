"""Hand-made kernel-log variants (``tests/fixtures/kernel-logs/variants``) find the right
signature, code, GPU or switch address, and nothing else.

The files are constructed from the documented formats, not recorded (their README says
how). Each is scanned as ``gpufleet scan`` does (``feed_bytes`` then ``finish``) on every
prefilter engine, and line by line: all must agree.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpufleet.core.enums import Severity
from gpufleet.core.kernel_log import parse_line
from gpufleet.core.signatures import prefilter
from gpufleet.core.signatures.matcher import KernelLogMatcher, Match, match_line

VARIANTS = Path(__file__).parents[2] / "fixtures" / "kernel-logs" / "variants"
ENGINES = ["hyperscan", "python"] if prefilter.hyperscan_available() else ["python"]

# (line number, signature, xid or sxid, pci) per file; pci None: redacted or absent.
Row = tuple[int, str, int | None, str | None]
EXPECTED: dict[str, list[Row]] = {
    "xid-pci-redacted.log": [
        (1, "xid-79", 79, None),
        (2, "xid-48", 48, None),
        (3, "xid-13", 13, None),
        (4, "xid-94", 94, None),
        (5, "xid-31", 31, None),
        (6, "xid-63", 63, None),  # a UUID where the address was: no address
        (7, "xid-43", 43, None),  # the parenthesis cut out whole
        (8, "xid-95", 95, "0000:52:00.0"),
        # line 9 has no Xid number: nothing
    ],
    "fallen-off-bus-older-wording.log": [
        (1, "gpu-fallen-off-bus", None, "0000:02:00.0"),
        (2, "gpu-fallen-off-bus", None, "0000:03:00.0"),
        (3, "gpu-fallen-off-bus-probe", None, "0000:04:00.0"),
        (4, "gpu-fallen-off-bus-probe", None, "0000:05:00.0"),
        (7, "gpu-fallen-off-bus", None, None),
        (8, "gpu-fallen-off-bus", None, None),
        # lines 9-11: "is not supported by the driver", not fallen off the bus
        (12, "gpu-fallen-off-bus-probe", None, None),  # dmesg-indented, address redacted
    ],
    "fallen-off-bus-kmsg-escaped.log": [
        (1, "gpu-fallen-off-bus-probe", None, "0000:b3:00.0"),
    ],
    "sxid-multiline-records.log": [
        (1, "sxid-ltssm-fault-up", 20034, "0000:06:00.0"),
        (2, "sxid-ltssm-fault-up", 20034, "0000:07:00.0"),
        (7, "sxid-reset-fabric", 12028, "0000:89:00.0"),
        (10, "sxid-reset-fabric", 10007, "0000:05:00.0"),
        (12, "sxid-nonfatal", 12345, "0000:05:00.0"),
        (13, "sxid-link-mechanical", 20009, None),
    ],
    "reader-prefixes.log": [
        (1, "xid-79", 79, "0000:3b:00.0"),
        (2, "xid-154", 154, "0000:3b:00.0"),
        (3, "sxid-ltssm-fault-up", 20034, "0000:c1:00.0"),
        (5, "fm-nvswitch-fatal", 20034, None),
        (6, "fm-nvswitch-nonfatal", 12028, "0000:86:00.0"),
    ],
    "xid-crlf-bom-raw.log": [
        (1, "xid-79", 79, "0000:3b:00.0"),
        (3, "sxid-ltssm-fault-up", 20034, "0000:06:00.0"),
        (4, "gpu-fallen-off-bus", None, "0000:3c:00.0"),
    ],
}


def _scan(data: bytes, engine: prefilter.Engine, chunk: int | None = None) -> list[Match]:
    m = KernelLogMatcher(engine=engine)
    step = chunk or max(len(data), 1)
    found = [x for i in range(0, len(data), step) for x in m.feed_bytes(data[i : i + step])]
    return found + m.finish()


def _rows(found: list[Match]) -> list[Row]:
    return [
        (m.line_number or 0, m.signature, m.xid if m.xid is not None else m.sxid, m.pci)
        for m in found
    ]


def test_every_variant_file_is_listed() -> None:
    assert sorted(p.name for p in VARIANTS.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_variant_file_findings(name: str, engine: prefilter.Engine) -> None:
    data = (VARIANTS / name).read_bytes()
    assert _rows(_scan(data, engine)) == EXPECTED[name]
    # Chunks that split lines (and the CRLF pairs) anywhere change nothing.
    assert _rows(_scan(data, engine, chunk=7)) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_line_by_line_agrees(name: str) -> None:
    m = KernelLogMatcher()
    lines = (VARIANTS / name).read_bytes().decode().splitlines()
    found = [x for n, line in enumerate(lines, 1) for x in m.feed(line, line_number=n)]
    assert _rows(found) == EXPECTED[name]


def test_sxid_record_is_one_finding_with_switch_and_link() -> None:
    data = (VARIANTS / "sxid-multiline-records.log").read_bytes()
    found = _scan(data, "auto")
    assert [(m.device, m.link) for m in found] == [
        ("nvidia-nvswitch1", 48),
        ("nvidia-nvswitch2", 12),
        ("nvidia-nvswitch3", 4),  # printed "Link 04"
        ("nvidia-nvswitch0", None),  # "IO failure" names no link
        ("nvidia-nvswitch0", 7),
        ("nvidia-nvswitch5", 30),  # address redacted: the device name still says which
    ]
    # The follow-up lines belong to the record before them: no finding of their own.
    assert all("Severity" not in m.line and "Data" not in m.line for m in found)
    assert found[0].severity is Severity.FATAL
    assert found[2].severity is Severity.CRITICAL  # 12028 needs a fabric reset, non-fatal


def test_probe_message_split_at_other_words_is_joined() -> None:
    data = (VARIANTS / "fallen-off-bus-older-wording.log").read_bytes()
    probe = [m for m in _scan(data, "auto") if m.line_number == 4]
    assert [m.line.count("\n") for m in probe] == [2]  # its three lines, one finding
    assert probe[0].uptime_s == pytest.approx(12.300001)


def test_kmsg_escaped_record_reads_as_one_message() -> None:
    line = (VARIANTS / "fallen-off-bus-kmsg-escaped.log").read_text().splitlines()[0]
    parsed = parse_line(line)
    assert "\\x0a" not in parsed.message
    assert parsed.message.startswith("NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: (PCI ID")
    assert parsed.level == "err"
    assert parsed.uptime_s == pytest.approx(1843.308145)


def test_bom_crlf_and_raw_priority_prefixes() -> None:
    data = (VARIANTS / "xid-crlf-bom-raw.log").read_bytes()
    found = _scan(data, "auto")
    assert [m.uptime_s for m in found] == pytest.approx([5012.118822, 5012.3, 5012.4])
    assert not any(m.line.endswith("\r") or m.message.startswith("\ufeff") for m in found)
    assert parse_line("<3>[ 5012.400000] NVRM: x").level == "err"


def test_journal_precise_and_unix_prefixes_keep_time_and_host() -> None:
    found = _scan((VARIANTS / "reader-prefixes.log").read_bytes(), "auto")
    precise, unix, sxid, fm, _ = found
    assert precise.host == unix.host == sxid.host == "gpu-node-7"
    assert precise.timestamp is None  # a year-less stamp needs the year from the caller
    assert unix.timestamp == dt.datetime(2024, 3, 5, 10, 12, 2, 500000, tzinfo=dt.UTC)
    assert (sxid.device, sxid.link) == ("nvidia-nvswitch4", 36)
    assert fm.link == 33  # the switch port
    [dated] = KernelLogMatcher(year=2024).feed(
        (VARIANTS / "reader-prefixes.log").read_text().splitlines()[0]
    )
    assert dated.timestamp == dt.datetime(2024, 3, 5, 10, 12, 1, 123456)


@pytest.mark.parametrize(
    "line",
    [
        # A bare Xid number after a colon in other text is not an Xid line.
        "audit: type=1400 msg='grep NVRM: Xid 79 /var/log/kern.log'",
        "NVRM: Xid (PCI:0000:3b:00)",
        "NVRM: Xid (PCI:<redacted>): pid=2131, name=python3",
        # SXid follow-up lines, however spaced, never open a finding of their own.
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034,Data {0x1}",
        "nvidia-nvswitch0: SXid (PCI:<redacted>): 20034,  Severity 1 Engine instance 6",
        # The probe-time "not supported" message shares the first words only.
        "NVRM: The NVIDIA GPU 0000:06:00.0 (PCI ID: 10de:1eb8) installed in this system is "
        "not supported by the NVIDIA 535.104.05 driver release.",
        # A redaction marker alone is no fallen-off-the-bus line.
        "NVRM: GPU <redacted>: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
    ],
)
def test_near_misses_stay_quiet(line: str) -> None:
    assert match_line(line) == []


def test_a_colon_after_the_driver_tag_is_no_syslog_host() -> None:
    # ``[mono] host tag: `` (journalctl -o short-monotonic) must not eat ``NVRM: Xid:``.
    parsed = parse_line("[ 5013.000002] NVRM: Xid: 43, pid=1, Ch 00000008")
    assert (parsed.host, parsed.message[:13]) == (None, "NVRM: Xid: 43")
    assert parse_line("[ 1.5] gpu-node-7 kernel: NVRM: x").host == "gpu-node-7"
