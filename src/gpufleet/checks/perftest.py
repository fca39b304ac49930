"""Pure parser for perftest ``ib_write_bw`` (one HCA pair; client or server side).

Format (``shared/reference/failure-signatures.md`` §4.2, perftest ``RESULT_FMT`` /
``RESULT_FMT_G``): a banner (``RDMA_Write BW Test``, ``Device : mlx5_0``, link type, ...),
then ``#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]`` (``[Gb/sec]``
with ``--report_gbits``), one row per message size, and a dashed line that closes the table.
``Conflicting CPU frequency`` warnings may sit between rows; they are skipped.

Units: perftest's "MB/sec" is MiB/s (it divides by 0x100000, ``perftest_resources.c``
``format_factor``), and its "Gb/sec" is 10^9 bit/s (125,000,000 bytes). Both are converted
to Gb/s here; a row's MsgRate × size agrees with the MiB reading (checked in the tests on
the recorded outputs).

A run *finished* when at least one row was printed and the closing dashed line followed
it. The server side of a pair prints no row until the client is done; a server still
waiting is a run that did not finish.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.checks._text import split_lines, strip_launcher_prefix, to_float, to_int
from gpufleet.checks.models import ParseError

MIB_PER_SEC_TO_GBITS = 1048576 * 8 / 1e9  # perftest "MB/sec" → Gb/s

_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(?P<unit>MB|Gb|MiB|GB)/sec\]\s+BW average\[[^\]]*\]",
    re.I,
)
_DEVICE = re.compile(r"\bDevice\s*:\s*(\S+)")
_LINK = re.compile(r"\bLink type\s*:\s*(\S+)")
_QPS = re.compile(r"\bNumber of qps\s*:\s*(\d+)")
_CONNECTION = re.compile(r"\bConnection type\s*:\s*(\S+)")
_TITLE = re.compile(r"^(RDMA_Write|RDMA_Read|Send|Atomic)\b.*\bBW Test", re.I)

# perftest's own failure messages (perftest_resources.c, perftest_communication.c): they
# mark the text as perftest output even when the banner never came (no connection).
_PERFTEST_ERRORS = re.compile(
    r"(Couldn't connect to|Unable to (?:open|init|resolve|connect)|Failed to (?:modify|create|"
    r"register|post|allocate|init|connect|exchange)|Couldn't (?:allocate|post|create|get|"
    r"find|open|init)|Completion with error|Problems with warm up|No IB devices found|"
    r"IB device \S+ not found|Failed status \d+|Error in (?:func|init))",
    re.I,
)
# Generic failures: errors only in text already known to be perftest's.
_OTHER_ERRORS = re.compile(r"(ibv_\w+ failed|Segmentation fault|core dumped|^Killed$)", re.I)
_WAITING = "Waiting for client to connect"


@dataclass(frozen=True, slots=True)
class IbWriteBwRow:
    msg_bytes: int
    iterations: int
    bw_peak_gbits: float  # 0.0 with -D (duration): "BW peak won't be measured"
    bw_avg_gbits: float
    msg_rate_mpps: float | None


@dataclass(frozen=True, slots=True)
class IbWriteBwError:
    line_number: int
    line: str


@dataclass(frozen=True, slots=True)
class IbWriteBwResult:
    test: str | None  # "RDMA_Write BW Test"
    device: str | None  # the local HCA, e.g. "mlx5_0"
    link_type: str | None  # "IB" or "Ethernet" (RoCE)
    connection_type: str | None  # RC, UC, DC, ...
    qps: int | None
    unit: str | None  # as printed: "MB/sec" or "Gb/sec"
    rows: tuple[IbWriteBwRow, ...]  # the last table in the output
    tables: int  # how many result tables the output holds
    closed: bool  # the last table's closing dashed line was printed
    errors: tuple[IbWriteBwError, ...]

    @property
    def finished(self) -> bool:
        return bool(self.rows) and self.closed

    @property
    def largest(self) -> IbWriteBwRow | None:
        """The row with the largest message size (later rows win a tie)."""
        best: IbWriteBwRow | None = None
        for row in self.rows:
            if best is None or row.msg_bytes >= best.msg_bytes:
                best = row
        return best

    @property
    def bw_avg_gbits(self) -> float | None:
        row = self.largest
        return row.bw_avg_gbits if row else None

    @property
    def msg_bytes(self) -> int | None:
        row = self.largest
        return row.msg_bytes if row else None

    @property
    def passed(self) -> bool:
        """Finished and no error line. No line-rate threshold (that needs a fabric)."""
        return self.finished and not self.errors


def _row(tokens: list[str], scale: float) -> IbWriteBwRow | None:
    if len(tokens) < 4:
        return None
    size, iterations = to_int(tokens[0]), to_int(tokens[1])
    peak, avg = to_float(tokens[2]), to_float(tokens[3])
    if size is None or iterations is None or peak is None or avg is None:
        return None
    rate = to_float(tokens[4]) if len(tokens) > 4 else None
    return IbWriteBwRow(
        msg_bytes=size,
        iterations=iterations,
        bw_peak_gbits=peak * scale,
        bw_avg_gbits=avg * scale,
        msg_rate_mpps=rate,
    )


def parse_ib_write_bw(text: str) -> IbWriteBwResult:
    """Parse one side's saved ``ib_write_bw`` output.

    Raises:
        ParseError: no perftest banner, result header or perftest error in ``text``.
    """
    test = device = link = connection = unit = None
    qps: int | None = None
    rows: list[IbWriteBwRow] = []
    errors: list[IbWriteBwError] = []
    tables = 0
    in_table = closed = recognized = False
    scale = 1.0

    for number, raw in enumerate(split_lines(text), start=1):
        line = " ".join(strip_launcher_prefix(raw).split())  # tabs, runs of spaces: one space
        if not line:
            continue
        if line.startswith("---"):
            if in_table and rows:
                closed = True
                in_table = False
            continue
        if in_table and line[0].isdigit():
            row = _row(line.split(), scale)
            if row is not None:
                rows.append(row)
                closed = False
                continue
        if "#bytes" in line and (m := _HEADER.search(line)):
            tables += 1
            rows, in_table, closed, recognized = [], True, False, True
            name = m.group("unit")
            unit = name + "/sec"
            # MB/sec is 2^20 bytes (see the module docstring); Gb/sec is 10^9 bits.
            scale = 1.0 if name == "Gb" else 8.0 if name == "GB" else MIB_PER_SEC_TO_GBITS
            continue
        if _TITLE.match(line):
            test, recognized = line, True
            continue
        if device is None and (m := _DEVICE.search(line)):
            device = m.group(1)
        if link is None and (m := _LINK.search(line)):
            link = m.group(1)
        if connection is None and (m := _CONNECTION.search(line)):
            connection = m.group(1)
        if qps is None and (m := _QPS.search(line)):
            qps = int(m.group(1))
        if "Conflicting CPU frequency" in line or "BW peak won't be measured" in line:
            continue
        if _WAITING in line:
            recognized = True
        elif _PERFTEST_ERRORS.search(line):
            errors.append(IbWriteBwError(line_number=number, line=line))
            recognized = True
        elif _OTHER_ERRORS.search(line):
            errors.append(IbWriteBwError(line_number=number, line=line))
    if not recognized:
        raise ParseError(
            "no ib_write_bw output found (no 'BW Test' banner and no "
            "'#bytes #iterations BW peak' header)"
        )
    return IbWriteBwResult(
        test=test,
        device=device,
        link_type=link,
        connection_type=connection,
        qps=qps,
        unit=unit,
        rows=tuple(rows),
        tables=tables,
        closed=closed,
        errors=tuple(errors),
    )
