"""Pure parser for nccl-tests output (``all_reduce_perf`` and the other ``*_perf`` tests).

Format (``shared/reference/failure-signatures.md`` §4.1, nccl-tests ``src/common.cu``):
a ``# nThread .. nGpus ..`` header, one ``#  Rank N Group G Pid P on HOST device D [BUS]
MODEL`` line per rank, a column header, one data row per message size (size, count, type,
redop, root, then time/algbw/busbw/#wrong out-of-place and again in-place), and a footer:
``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X [OK|FAILED]``.

Rows are read by the column header's names, not by position from the end, so extra
trailing columns (rccl-tests prints algorithm/protocol/channels) and tests without
``redop``/``root`` (all_gather in old versions) parse too. A file may hold several runs
(nccl-tests 2.18+ prints ``# Collective test starting: NAME`` before each); each is its
own ``NcclRun``. Lines that are not the tool's own (``mpirun`` help messages, NCCL INFO,
CPU warnings) are skipped; fatal ones (``Test NCCL failure``, signals, MPI aborts) are
kept as ``NcclError`` with the host they name.

A run *finished* when its ``Avg bus bandwidth`` line was printed. Everything else (header
only, cut mid-table, crashed) is a run that did not finish; the evaluator fails it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpufleet.checks._text import split_lines, strip_launcher_prefix, to_float, to_int
from gpufleet.checks.models import ParseError

GIB = 1 << 30

# Bytes per element of nccl-tests' -d types, to tell all_reduce (count × size = bytes) from
# reduce_scatter (count × size × ranks = bytes) when the output does not name the test.
TYPE_BYTES: dict[str, int] = {
    "int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
    "half": 2, "bfloat16": 2, "float16": 2,
    "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4,
    "int64": 8, "uint64": 8, "double": 8, "float64": 8,
}  # fmt: skip

_THREAD_HEADER = re.compile(
    r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)"
)
_RANK = re.compile(
    r"Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*)$"
)
_VERSION = re.compile(r"^[nr]ccl-tests version\s+(\S+)")
_OUT_OF_BOUNDS = re.compile(r"^Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?", re.I)
_BITWISE = re.compile(r"^Bitwise mismatches\s*:\s*(\d+)\s*(OK|FAILED)?", re.I)
_AVG_BUSBW = re.compile(r"^Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?", re.I)
_STARTING = re.compile(r"^Collective test starting:\s*(\S+)")
_CONCLUDED = re.compile(r"^Collective test concluded:\s*(\S+)")

# Fatal lines: (kind, pattern), most specific first (an MPI abort line names the signal
# too). A named group ``host`` attributes the failure to a node.
_FATAL: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nccl-failure", re.compile(r"^(?:(?P<host>[^\s:]+):\s+)?Test NCCL failure\s+(?P<msg>.*)")),
    ("cuda-failure", re.compile(r"^(?:(?P<host>[^\s:]+):\s+)?Test CUDA failure\s+(?P<msg>.*)")),
    ("test-failure",
     re.compile(r"^\.\.\s+(?P<host>\S+)\s+pid\s+\d+:\s+Test failure\s+(?P<msg>.*)")),
    ("mpi-abort", re.compile(
        r"(?P<msg>mpirun noticed that process rank \d+ with PID \d+ on node (?P<host>\S+)"
        r" exited on signal.*|MPI_ABORT was invoked.*|mpirun has exited due to process rank.*)")),
    ("srun-error", re.compile(r"^srun: error: (?P<host>[^\s:]+): task \d+: (?P<msg>.*)")),
    ("killed", re.compile(r"(?P<msg>\*\*\* (?:STEP|JOB) \S+ .*CANCELLED.*|^Killed$)")),
    ("exception", re.compile(r"(?P<msg>terminate called after throwing.*)")),
    ("signal", re.compile(
        r"(?P<msg>Segmentation fault|Bus error|core dumped|Caught signal \d+"
        r"|\*\*\* Process received signal \*\*\*|Signal: \S+ \(\d+\))")),
)  # fmt: skip
# Prefilter: only lines holding one of these can match a fatal pattern.
_FATAL_HINT = re.compile(
    r"Test |fault|Bus error|core dumped|[sS]ignal|mpirun|MPI_ABORT|srun: error|CANCELLED|"
    r"Killed|terminate called"
)
_NCCL_WARN = re.compile(r"^(?P<host>[^\s:]+):\d+:\d+ \[(?P<dev>\d+)\] .*NCCL WARN (?P<msg>.*)")


@dataclass(frozen=True, slots=True)
class NcclRank:
    rank: int
    host: str
    device: int  # CUDA device index on that host
    bus_id: str
    model: str  # as the output prints it, e.g. "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One message size. Bandwidths in GB/s (10^9 bytes/s), as nccl-tests prints them."""

    size: int  # bytes
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_time_us: float | None
    out_algbw: float | None
    out_busbw: float | None
    out_wrong: int | None  # None: "N/A" (e.g. sendrecv in-place) or not printed
    in_time_us: float | None = None
    in_algbw: float | None = None
    in_busbw: float | None = None
    in_wrong: int | None = None
    max_error: float | None = None  # nccl-tests < 2.10 printed a max deviation, not a count

    @property
    def busbw(self) -> float | None:
        """The better of out-of-place and in-place."""
        values = [v for v in (self.out_busbw, self.in_busbw) if v is not None]
        return max(values) if values else None

    @property
    def wrong(self) -> int:
        return (self.out_wrong or 0) + (self.in_wrong or 0)


@dataclass(frozen=True, slots=True)
class NcclError:
    """A line that reports a failure. ``fatal`` lines fail the run; NCCL WARN lines do not
    by themselves, but say which node and GPU to look at when the run failed."""

    line_number: int  # 1-based, in the parsed text
    kind: str  # nccl-failure | cuda-failure | test-failure | signal | mpi-abort | ... | nccl-warn
    message: str
    line: str
    fatal: bool
    host: str | None = None
    device: int | None = None


@dataclass(frozen=True, slots=True)
class NcclRun:
    """One test run: header, ranks, rows, footer."""

    collective: str | None  # "all_reduce", "alltoall", ...; None when it cannot be told
    n_threads: int | None
    n_gpus: int | None  # GPUs per thread (-g)
    min_bytes: int | None
    max_bytes: int | None
    ranks: tuple[NcclRank, ...]
    rows: tuple[NcclRow, ...]
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    avg_busbw: float | None  # GB/s, averaged over ALL sizes (small ones too), as printed
    min_bw_check: str | None  # "OK"/"FAILED" when NCCL_TESTS_MIN_BW was set
    errors: tuple[NcclError, ...]
    named: bool  # started by "# Collective test starting" (nccl-tests 2.18+)
    concluded: bool  # "# Collective test concluded" seen; printed right after the footer
    bitwise_mismatches: int | None = None  # "# Bitwise mismatches" (newest nccl-tests)

    @property
    def finished(self) -> bool:
        """Rows and the footer were printed, and the closing line too when the run was
        announced.

        nccl-tests 2.18+ prints ``# Collective test concluded`` right after the footer of
        a run it announced with ``# Collective test starting``; without it, the output
        was cut after the footer (a later run in the same file would be missing unseen).
        """
        return self.avg_busbw is not None and bool(self.rows) and (self.concluded or not self.named)

    @property
    def gpus(self) -> int | None:
        """Ranks in the run. ``#  …`` elisions are covered by the highest rank number."""
        if self.ranks:
            return max(len(self.ranks), max(r.rank for r in self.ranks) + 1)
        return None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.model for r in self.ranks if r.model))

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)

    @property
    def largest_size(self) -> int | None:
        return max((r.size for r in self.rows), default=None)

    @property
    def busbw_large(self) -> float | None:
        """Best busbw over rows of at least 1 GiB, or at the largest size when none is.

        "Avg bus bandwidth" averages every size, tiny ones included, so it says little
        about the fabric; the reference (§4.1) judges on busbw at the largest sizes.
        """
        largest = self.largest_size
        if largest is None:
            return None
        floor = min(GIB, largest)
        values = [bw for r in self.rows if r.size >= floor and (bw := r.busbw) is not None]
        return max(values) if values else None

    @property
    def clean(self) -> bool:
        """Finished, no fatal error, no wrong data, tool's own checks OK."""
        return (
            self.finished
            and not any(e.fatal for e in self.errors)
            and self.wrong == 0
            and self.out_of_bounds_ok is not False
            and self.min_bw_check != "FAILED"
            and not self.bitwise_mismatches
        )


@dataclass(frozen=True, slots=True)
class NcclResult:
    version: str | None
    runs: tuple[NcclRun, ...]
    errors: tuple[NcclError, ...]  # every error line, in or outside a run

    @property
    def fatal_errors(self) -> tuple[NcclError, ...]:
        return tuple(e for e in self.errors if e.fatal)

    @property
    def finished(self) -> bool:
        return bool(self.runs) and all(r.finished for r in self.runs)

    @property
    def avg_busbw(self) -> float | None:
        """The lowest ``Avg bus bandwidth`` of the finished runs (the one run's, usually)."""
        values = [r.avg_busbw for r in self.runs if r.avg_busbw is not None]
        return min(values) if values else None

    @property
    def gpus(self) -> int | None:
        values = [g for r in self.runs if (g := r.gpus) is not None]
        return max(values) if values else None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h for r in self.runs for h in r.hosts))

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.runs)

    @property
    def passed(self) -> bool:
        """What nccl-tests itself would say: every run clean, nothing fatal. No thresholds."""
        return self.finished and not self.fatal_errors and all(r.clean for r in self.runs)


@dataclass(slots=True)
class _RunBuilder:
    collective: str | None = None
    n_threads: int | None = None
    n_gpus: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    ranks: list[NcclRank] = field(default_factory=list)
    rows: list[NcclRow] = field(default_factory=list)
    columns: dict[str, list[int]] | None = None
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    avg_busbw: float | None = None
    min_bw_check: str | None = None
    errors: list[NcclError] = field(default_factory=list)
    named: bool = False
    concluded: bool = False
    bitwise_mismatches: int | None = None

    def started(self) -> bool:
        """Anything of a run seen; an announced run counts even if nothing followed."""
        return bool(
            self.named or self.n_threads is not None or self.ranks or self.rows or self.columns
            or self.avg_busbw is not None or self.out_of_bounds is not None
        )  # fmt: skip

    def build(self) -> NcclRun:
        rows = tuple(self.rows)
        collective = self.collective or _infer_collective(rows, len(self.ranks))
        return NcclRun(
            collective=collective,
            n_threads=self.n_threads,
            n_gpus=self.n_gpus,
            min_bytes=self.min_bytes,
            max_bytes=self.max_bytes,
            ranks=tuple(self.ranks),
            rows=rows,
            out_of_bounds=self.out_of_bounds,
            out_of_bounds_ok=self.out_of_bounds_ok,
            avg_busbw=self.avg_busbw,
            min_bw_check=self.min_bw_check,
            errors=tuple(self.errors),
            named=self.named,
            concluded=self.concluded,
            bitwise_mismatches=self.bitwise_mismatches,
        )


# nccl-tests' own layout (common.cu), for rows that come without a column header.
_DEFAULT_COLUMNS: dict[str, list[int]] = {
    "size": [0], "count": [1], "type": [2], "redop": [3], "root": [4],
    "time": [5, 9], "algbw": [6, 10], "busbw": [7, 11], "#wrong": [8, 12],
}  # fmt: skip
_WRONG_NAMES = ("#wrong", "wrong", "error", "#error")


def _columns(header_tokens: list[str]) -> dict[str, list[int]]:
    columns: dict[str, list[int]] = {}
    for i, token in enumerate(header_tokens):
        name = token.lower()
        if name in _WRONG_NAMES:
            name = "#wrong" if "wrong" in name else "error"
        columns.setdefault(name, []).append(i)
    return columns


def _at(tokens: list[str], columns: dict[str, list[int]], name: str, which: int) -> str | None:
    idx = columns.get(name)
    if idx is None or which >= len(idx) or idx[which] >= len(tokens):
        return None
    return tokens[idx[which]]


def _wrong(token: str | None) -> int | None:
    if token is None:
        return None
    value = to_int(token)
    if value is not None:
        return value
    number = to_float(token)  # "1e+00" style counts from some builds
    return int(number) if number is not None and number.is_integer() else None


def _row(tokens: list[str], columns: dict[str, list[int]]) -> NcclRow | None:
    size = to_int(tokens[0])
    count = to_int(tokens[1]) if len(tokens) > 1 else None
    if size is None or count is None or len(tokens) < 4:
        return None
    dtype = _at(tokens, columns, "type", 0) or tokens[2]
    if not dtype[:1].isalpha():
        return None
    root_token = _at(tokens, columns, "root", 0)
    old_error = "error" in columns

    def num(name: str, which: int) -> float | None:
        token = _at(tokens, columns, name, which)
        return to_float(token) if token is not None else None

    out_busbw, in_busbw = num("busbw", 0), num("busbw", 1)
    if out_busbw is None and in_busbw is None:
        return None
    errors = [e for e in (num("error", 0), num("error", 1)) if e is not None]
    return NcclRow(
        size=size,
        count=count,
        dtype=dtype,
        redop=_at(tokens, columns, "redop", 0),
        root=to_int(root_token) if root_token is not None else None,
        out_time_us=num("time", 0),
        out_algbw=num("algbw", 0),
        out_busbw=out_busbw,
        out_wrong=None if old_error else _wrong(_at(tokens, columns, "#wrong", 0)),
        in_time_us=num("time", 1),
        in_algbw=num("algbw", 1),
        in_busbw=in_busbw,
        in_wrong=None if old_error else _wrong(_at(tokens, columns, "#wrong", 1)),
        max_error=max(errors) if errors else None,
    )


def _infer_collective(rows: tuple[NcclRow, ...], nranks: int) -> str | None:
    """all_reduce or reduce_scatter from the first row's shape; None when not sure."""
    if not rows:
        return None
    row = rows[0]
    width = TYPE_BYTES.get(row.dtype.lower())
    if width is None or row.redop in (None, "none") or row.root != -1 or row.size == 0:
        return None
    if row.count * width == row.size:
        return "all_reduce"
    if nranks and row.count * width * nranks == row.size:
        return "reduce_scatter"
    return None


def _fatal(line: str, number: int) -> NcclError | None:
    if not _FATAL_HINT.search(line):
        return None
    for kind, pattern in _FATAL:
        if m := pattern.search(line):
            groups = m.groupdict()
            return NcclError(
                line_number=number,
                kind=kind,
                message=(groups.get("msg") or line).strip(),
                line=line,
                fatal=True,
                host=groups.get("host"),
            )
    return None


def parse_nccl(text: str) -> NcclResult:
    """Parse the saved output of one nccl-tests binary (or several, one after another).

    Raises:
        ParseError: nothing in ``text`` is nccl-tests output (no header, table, footer or
            nccl-tests failure line).
    """
    version: str | None = None
    runs: list[NcclRun] = []
    errors: list[NcclError] = []
    current = _RunBuilder()
    recognized = False

    def close() -> None:
        nonlocal current
        if current.started():
            runs.append(current.build())
        current = _RunBuilder()

    for number, raw in enumerate(split_lines(text), start=1):
        line = strip_launcher_prefix(raw).strip()
        if not line:
            continue
        if line[0] == "#":
            body = " ".join(line.lstrip("#").split())  # tabs, runs of spaces: one space
            if not body:
                continue
            if body.startswith("Collective test"):
                if m := _STARTING.match(body):
                    close()
                    current.collective = m.group(1).removesuffix("_perf")
                    current.named = recognized = True
                elif _CONCLUDED.match(body):
                    current.concluded = True
                continue
            if body.startswith("nThread") and (m := _THREAD_HEADER.match(body)):
                if current.n_threads is not None or current.rows or current.avg_busbw is not None:
                    close()
                current.n_threads, current.n_gpus = int(m.group(1)), int(m.group(2))
                current.min_bytes, current.max_bytes = int(m.group(3)), int(m.group(4))
                recognized = True
                continue
            if body.startswith("Rank") and (m := _RANK.match(body)):
                current.ranks.append(
                    NcclRank(
                        rank=int(m.group(1)),
                        host=m.group(3),
                        device=int(m.group(4)),
                        bus_id=m.group(5),
                        model=m.group(6).strip(),
                    )
                )
                recognized = True
                continue
            if m := _AVG_BUSBW.match(body):
                current.avg_busbw = to_float(m.group(1))
                if current.avg_busbw is None:  # "nan": printed, but not a figure
                    current.avg_busbw = 0.0
                current.min_bw_check = m.group(2).upper() if m.group(2) else None
                recognized = True
                continue
            if m := _OUT_OF_BOUNDS.match(body):
                current.out_of_bounds = int(m.group(1))
                ok = m.group(2)
                current.out_of_bounds_ok = (
                    (ok.upper() == "OK") if ok else current.out_of_bounds == 0
                )
                recognized = True
                continue
            if m := _BITWISE.match(body):
                current.bitwise_mismatches = int(m.group(1))
                continue
            if m := _VERSION.match(body):
                version = m.group(1)
                recognized = True
                continue
            tokens = body.split()
            if "size" in tokens and "busbw" in tokens:
                if current.rows or current.avg_busbw is not None:
                    close()  # a second table without a new header: a new run
                current.columns = _columns(tokens)
                recognized = True
            continue
        if "NCCL INFO" in line:  # the bulk of a debug log; never a result or a failure
            continue
        first = line[0]
        if first.isdigit() and (current.columns is not None or current.n_threads is not None):
            row = _row(line.split(), current.columns or _DEFAULT_COLUMNS)
            if row is not None:
                if current.avg_busbw is not None:  # rows after a footer: a new run
                    columns = current.columns
                    close()
                    current.columns = columns
                current.rows.append(row)
                continue
        if (error := _fatal(line, number)) is not None:
            current.errors.append(error)
            errors.append(error)
            recognized = True
            continue
        if "NCCL WARN" in line and (m := _NCCL_WARN.match(line)):
            warn = NcclError(
                line_number=number,
                kind="nccl-warn",
                message=m.group("msg").strip(),
                line=line,
                fatal=False,
                host=m.group("host"),
                device=int(m.group("dev")),
            )
            current.errors.append(warn)
            errors.append(warn)
    close()
    if not recognized:
        raise ParseError(
            "no nccl-tests output found (no '# nThread' header, result table, "
            "'# Avg bus bandwidth' line or 'Test NCCL failure')"
        )
    return NcclResult(version=version, runs=tuple(runs), errors=tuple(errors))
