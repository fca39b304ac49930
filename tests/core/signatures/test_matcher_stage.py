"""The Hyperscan matcher stage: only lines holding a regex's required literal reach Python.

The reference is the ``python`` engine with its targets' required literals taken away:
it gives every prefilter-token line to every regex of its tokens (as the matcher once
did). The ``python`` engine itself checks those literals with ``in`` before each regex,
and the Hyperscan stage looks for them over the chunk. Both must give the reference's
matches, in the same order, on the recorded logs and on generated ones built to stress
what they skip: multi-line windows split over chunks and interleaved with other
candidate lines, /dev/kmsg escapes inside a literal, non-ASCII lines, caseless patterns,
CRLF.
"""

from __future__ import annotations

import mmap
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.core.kernel_log import split_line
from gpufleet.core.signatures import prefilter
from gpufleet.core.signatures.factors import Literal, required_literals
from gpufleet.core.signatures.kernel_rules import packaged_rules
from gpufleet.core.signatures.matcher import (
    KernelLogMatcher,
    Match,
    _Program,
    _program,
    _select,
    select_lines,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kernel-logs"
LOGS = sorted(FIXTURES.glob("*.log")) + sorted((FIXTURES / "variants").glob("*.log"))

needs_hyperscan = pytest.mark.skipif(
    not prefilter.hyperscan_available(), reason="the hyperscan wheel is not installed"
)

# Lines the stage must not lose, and lines near them that must stay quiet.
TRICKY = [
    "NVRM: The NVIDIA GPU 0000:3b:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: API mismatch: the client has the version 535.104.05, but",
    "NVRM: this kernel module has the version 535.86.10.",
    "6,9,1234,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed "
    "in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
    "4,10,1235,-;NVRM: Xid (PCI:0000:3b:00):\\x2079, pid=1, GPU has fallen off the bus.",
    "4,11,1236,-;NVRM: GPU 0000:3b:00.0: GPU has\\x20fallen off the bus.",
    "NVRM: GPU 0000:3b:00.0: GPU haſ fallen off the buſ.",  # long s: (?i) folds it to s
    "NVRM: GPU 0000:3B:00.0: GPU HAS FALLEN OFF THE BUS.",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
    "NVRM: GPU at PCI:0000:3b:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
    "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable ECC error — Ünïcode",
    "NVRM: Xid (PCI:0000:3b:00)\u00a0: 13, non-breaking space before the colon",
    "NVRM: Xid (PCI:0000:3b:00): \u0661\u0663, Arabic-Indic digits",
    "NVRM: Xid (PCI:0000:3b:00):\x1c13, a file separator is whitespace to str.isspace",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05",
    "NVRM: RmInitAdapter failed! (0x25:0x65:1457)",
    "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 44 LTSSM Fault Up",
    "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Severity 5 Engine instance 44",
    "mlx5_core 0000:0c:00.0 mlx5_2: Port: 1 Link DOWN",
    "mlx5_core 0000:0c:00.0 mlx5_2: Port: 1 Link ACTIVE",
    "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0",
    "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    "mlx5_core 0000:0c:00.0: Detected insufficient power on the PCIe slot (27W).",
    "python3[123]: segfault at 7f00 ip 7f01 sp 7f02 error 4 in libnccl.so.2[7f00+100]",
]
NOISE = [
    "usb 1-1: new high-speed USB device number 3 using xhci_hcd",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode",
    "NVRM: nvAssertOkFailedNoLog: Assertion failed: Call timed out",
    "NVRM: GPU Board Serial Number: 1653723012345",
    "mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838: ACCESS_REG(0x805) failed",
]
PREFIXES = [
    "",
    "[ 1234.567890] ",
    "[Tue Mar  5 10:12:01 2024] ",
    "Mar  5 10:12:01 gpu-7 kernel: ",
    "2024-03-05T10:12:01.123456+0000 gpu-7 kernel: ",
    "<4>[ 1234.567890] ",
    "  ",
]


def _generated(seed: int, lines: int = 3_000) -> bytes:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        pool = TRICKY if rng.random() < 0.3 else NOISE
        line = rng.choice(pool)
        if not re.match(r"\d+,\d+,", line):
            line = rng.choice(PREFIXES) + line
        out.append(line + ("\r\n" if rng.random() < 0.05 else "\n"))
    data = "".join(out).encode()
    if seed % 2:
        data += b"\xff\xfe not UTF-8, NVRM: Xid (PCI:0000:3b:00): 31, last line, no newline"
    return data


def _unchecked() -> _Program:
    """The ``python`` engine's program without required literals: every regex is tried."""
    program = _Program(packaged_rules(), "python")
    for targets in program.by_token.values():
        for target in targets:
            target.need = None
    return program


def _scan(data: bytes, engine: str, chunks: list[int]) -> list[Match]:
    if engine == "reference":
        matcher = KernelLogMatcher(engine="python", year=2024)
        matcher._program = _unchecked()
    else:
        matcher = KernelLogMatcher(engine=engine, year=2024)  # type: ignore[arg-type]
    out: list[Match] = []
    pos = 0
    for size in chunks:
        out.extend(matcher.feed_bytes(data[pos : pos + size]))
        pos += size
    out.extend(matcher.feed_bytes(data[pos:]))
    return out + matcher.finish()


def _chunks(rng: random.Random, total: int) -> list[int]:
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(rng.choice([1, 7, 80, 333, 4096, 65_537]))
    return sizes


@needs_hyperscan
@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_recorded_logs_match_alike(path: Path) -> None:
    data = path.read_bytes()
    want = _scan(data, "reference", [])
    assert _scan(data, "python", []) == want
    assert _scan(data, "hyperscan", []) == want
    assert _scan(data, "hyperscan", _chunks(random.Random(path.name), len(data))) == want


@needs_hyperscan
@pytest.mark.parametrize("seed", range(8))
def test_generated_logs_match_alike(seed: int) -> None:
    data = _generated(seed)
    want = _scan(data, "reference", [])
    assert len(want) > 50  # the generator does produce findings
    assert _scan(data, "python", []) == want
    assert _scan(data, "hyperscan", []) == want
    assert _scan(data, "hyperscan", _chunks(random.Random(seed), len(data))) == want


@needs_hyperscan
def test_the_stage_skips_lines_that_only_hold_a_token() -> None:
    data = b"".join(
        (p + n + "\n").encode() for p in PREFIXES for n in NOISE if "NVRM" in n or "mlx5" in n
    )
    lines, newlines, spill = select_lines(data, program=_program(None, "hyperscan"))
    assert (lines, spill) == ([], 0)
    assert newlines == data.count(b"\n")


@needs_hyperscan
def test_lines_after_a_window_start_are_selected_across_chunks() -> None:
    program = _program(None, "hyperscan")
    first = b"x\nNVRM: The NVIDIA GPU 0000:3b:00.0\n"
    lines, _, spill = select_lines(first, program=program)
    assert [n for n, _ in lines] == [2]
    assert spill == program.window_span
    second = b"noise\nNVRM: (PCI ID: 10de:2330) installed in this system has\nNVRM: more\n"
    lines, _, spill = select_lines(second, program=program, spill=spill)
    assert [n for n, _ in lines] == [2, 3]
    assert spill == program.window_span - 2


def test_required_literals() -> None:
    assert required_literals(r"NVRM: Xid(?: \(x\))?:\s*(?P<xid>\d+)") == (
        Literal("NVRM: Xid", caseless=False),
    )
    # Case-insensitive: never across i, k or s (they fold to non-ASCII letters).
    assert required_literals(r"(?i:has fallen off the bus)") == (
        Literal(" fallen off the bu", caseless=True),
    )
    assert required_literals(r"NVRM: (?:RmInitAdapter failed|rm_init_adapter)") == (
        Literal("RmInitAdapter failed", caseless=False),
        Literal("rm_init_adapter", caseless=False),
    )
    # The prefilter token counts for little: the longer literal without it wins.
    assert required_literals(
        r"mlx5_core (?P<pci>\S+) (?P<dev>mlx5_\d+): Port: (?P<port>\d+) Link DOWN",
        avoid=("mlx5",),
    ) == (Literal(" Link DOWN", caseless=False),)
    assert required_literals(r"(?:optional)?\d+[a-z]*") is None
    assert required_literals(r"ab|cd") is None  # shorter than three characters


def test_every_catalog_regex_has_a_required_literal() -> None:
    # A regex without one would make the stage fall back to its prefilter tokens: still
    # right, but every line holding the token would reach Python again.
    program = _program(None, "python")
    for targets in program.by_token.values():
        for target in targets:
            pattern = getattr(target, "regex", None) or target.start  # type: ignore[union-attr]
            assert required_literals(pattern.pattern, avoid=program.tokens), pattern.pattern


def _masks(program: _Program, lines: list[str]) -> list[tuple[str, int]]:
    """Each line with the bits of the stage literals it holds, as the stage gives them."""
    data = "".join(line + "\n" for line in lines).encode()
    picked, _, _ = _select(program, data, 0, len(data), 0)
    return [(lines[number - 1], mask) for number, _, mask in picked]


@needs_hyperscan
def test_the_fast_path_tries_what_feed_tries_in_its_order() -> None:
    # feed tries a target when its token is in the line and one of its literals in the
    # message; the fast path, the targets of the literals the line holds, in feed's
    # order. The tries that matter (those whose regex can match) must be the same.
    program = _program(None, "hyperscan")
    lines = [p + line for p in PREFIXES for line in TRICKY + NOISE]
    lines += (FIXTURES / "reference-1.10.log").read_text().splitlines()
    fast_lines = 0
    for line, mask in _masks(program, lines):
        fast = program.fast_path(mask)
        if fast is None:
            assert mask == 0 or mask >> (len(program._owners) - 1) & 1  # the kmsg escape
            continue
        fast_lines += 1
        message = split_line(line)[0]
        tried = [t for t, token in fast.targets if token in line]
        feed_tries = [t for t in program.targets(line) if t.need is None or t.need.held_by(message)]
        assert [t for t in tried if t in feed_tries] == feed_tries
        assert fast.uuid == ("NVRM: GPU at PCI:" in line)
    assert fast_lines > 100


@needs_hyperscan
def test_a_kmsg_escape_or_a_target_under_two_tokens_takes_the_general_path() -> None:
    program = _program(None, "hyperscan")
    escaped = "4,10,1235,-;NVRM: Xid (PCI:0000:3b:00):\\x2079, pid=1, GPU has fallen off"
    [(_, mask)] = _masks(program, [escaped])
    assert program.fast_path(mask) is None
    rules = packaged_rules()
    shared = (replace(rules[0], prefilter=(*rules[0].prefilter, "SXid")), *rules[1:])
    two_tokens = _Program(shared, "hyperscan")
    assert all(two_tokens.fast_path(1 << k) is None for k in range(len(two_tokens._owners)))
    # ...and it still matches what the reference does, line by line.
    data = _generated(3)
    matcher = KernelLogMatcher(engine="hyperscan", year=2024)
    matcher._program = two_tokens
    reference = KernelLogMatcher(engine="python", year=2024)
    reference._program = _Program(shared, "python")
    assert matcher.feed_bytes(data) + matcher.finish() == (
        reference.feed_bytes(data) + reference.finish()
    )


@needs_hyperscan
def test_a_range_of_a_mapped_file_matches_what_its_bytes_match(tmp_path: Path) -> None:
    data = b"".join(_generated(seed) for seed in (2, 4, 6))  # whole lines: even seeds
    log = tmp_path / "kern.log"
    log.write_bytes(data)
    begin = data.index(b"\n", len(data) // 3) + 1
    end = data.rindex(b"\n", 0, 2 * len(data) // 3) + 1
    want = KernelLogMatcher(year=2024).feed_bytes(data[begin:end])
    with log.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        matcher = KernelLogMatcher(year=2024)
        assert matcher.feed_range(mm, begin, end) == want
        assert matcher.line_count == data.count(b"\n", begin, end)
        matcher.feed_bytes(b"partial line")
        with pytest.raises(ValueError, match="partial line"):
            matcher.feed_range(mm, end, len(data))
