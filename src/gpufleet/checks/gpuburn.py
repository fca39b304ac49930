"""Pure parser for gpu-burn (wilicc/gpu-burn) output.

Format (``shared/reference/failure-signatures.md`` §4.3, ``gpu_burn-drv.cpp``): the
``nvidia-smi -L`` lines (``GPU 0: NAME (UUID: GPU-...)``), one ``Initialized device N
with ...`` per GPU, then a progress line rewritten in place with ``\\r``::

    12.3%  proc'd: 23400 (51234 Gflop/s) - 23380 (51190 Gflop/s)   errors: 0 - 0   temps: 61 C \
    - 63 C

one column per GPU separated by `` - ``; an error count shows `` (WARNING!)`` when above
zero, and a dead worker `` (DIED!)`` (in the errors column in older versions, after the
Gflop/s in newer ones). About every 10 % a ``Summary at:`` line resets the counters, so
this parser keeps the highest count seen. The run ends with::

    Tested 8 GPUs:
        GPU 0: OK
        GPU 1: FAULTY

A run *finished* when the ``Tested N GPUs:`` block was printed. gpu-burn's own OK only
means "no wrong result"; the evaluator also fails a GPU that never did any work (a real
capture in the fixtures shows six GPUs at 0 Gflop/s all reported OK).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from gpufleet.checks._text import split_lines, strip_launcher_prefix, to_float, to_int
from gpufleet.checks.models import ParseError

_LISTED = re.compile(r"^GPU\s+(\d+):\s+(.+?)\s+\(UUID:\s*(GPU-[0-9A-Fa-f-]+)\)")
_INITIALIZED = re.compile(
    r"^Initialized device\s+(\d+)\s+with\s+(\d+)\s+MB of memory.*?using\s+(FLOATS|DOUBLES)"
    r"(?P<tensor>,\s*using Tensor Cores)?"
)
_BURNING = re.compile(r"^Burning for\s+(\d+)\s+seconds")
_PROGRESS = re.compile(
    r"^(?P<pct>\d+(?:\.\d+)?)%\s+proc'd:\s*(?P<procd>.*?)\s+errors:\s*(?P<errors>.*?)"
    r"(?:\s+temps:\s*(?P<temps>.*?))?(?:\s+power:\s*(?P<power>.*?))?\s*$"
)
_PROCD = re.compile(r"(-?\d+)\s*\(\s*(\d+(?:\.\d+)?)\s*([GT])flop/s\)")
# Columns are joined by "- ": after a space, or right after "(DIED!)" in old versions
# ("0  (DIED!)- 0"). A dash that starts a number ("-1") or "--" (no temperature) is not one.
_COLUMN_SEP = re.compile(r"(?:(?<=\s)|(?<=\)))-\s+")
_TESTED = re.compile(r"^Tested\s+(\d+)\s+GPUs?:")
_STATUS = re.compile(r"^GPU\s+(\d+):\s*(OK|FAULTY)\b")
_FATAL = re.compile(
    r"(No clients are alive!|Couldn't init a GPU test|Failure during compute|No CUDA devices|"
    r"Error in \"|Segmentation fault|core dumped|^Killed$|terminate called)"
)


@dataclass(frozen=True, slots=True)
class GpuBurnGpu:
    index: int
    model: str | None = None
    uuid: str | None = None
    status: str | None = None  # "OK" / "FAULTY" from the final block; None: not listed
    errors_max: int = 0  # highest error count a progress line showed
    died: bool = False
    processed_last: int | None = None
    gflops_last: float | None = None
    gflops_max: float | None = None  # best reading at the end of a run of repaints
    temp_max_c: int | None = None
    precision: str | None = None  # FLOATS or DOUBLES
    tensor_cores: bool = False


@dataclass(frozen=True, slots=True)
class GpuBurnError:
    line_number: int
    line: str


@dataclass(frozen=True, slots=True)
class GpuBurnResult:
    duration_s: int | None
    tested: int | None  # N of "Tested N GPUs:"; None: the run did not get there
    progress_pct: float | None  # the last progress line's percentage
    gpus: tuple[GpuBurnGpu, ...]
    errors: tuple[GpuBurnError, ...]

    @property
    def finished(self) -> bool:
        return self.tested is not None

    @property
    def faulty(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if g.status == "FAULTY")

    @property
    def passed(self) -> bool:
        """gpu-burn's own verdict: finished, every GPU OK, no error count, nothing died."""
        return (
            self.finished
            and not self.errors
            and bool(self.gpus)
            and len([g for g in self.gpus if g.status is not None]) >= (self.tested or 0)
            and all(g.status == "OK" and not g.died and g.errors_max == 0 for g in self.gpus)
        )


@dataclass(slots=True)
class _Gpu:
    index: int
    model: str | None = None
    uuid: str | None = None
    status: str | None = None
    errors_max: int = 0
    died: bool = False
    processed_last: int | None = None
    gflops_last: float | None = None
    gflops_max: float | None = None
    temp_max_c: int | None = None
    precision: str | None = None
    tensor_cores: bool = False

    def freeze(self) -> GpuBurnGpu:
        return GpuBurnGpu(**asdict(self))


@dataclass(slots=True)
class _State:
    gpus: dict[int, _Gpu] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # device index of each progress column

    def gpu(self, index: int) -> _Gpu:
        if index not in self.gpus:
            self.gpus[index] = _Gpu(index)
        return self.gpus[index]

    def column(self, position: int) -> _Gpu:
        index = self.order[position] if position < len(self.order) else position
        return self.gpu(index)


def _progress(state: _State, m: re.Match[str]) -> None:
    for i, part in enumerate(_COLUMN_SEP.split(m.group("procd"))):
        gpu = state.column(i)
        if found := _PROCD.search(part):
            gpu.processed_last = int(found.group(1))
            gflops = float(found.group(2)) * (1000.0 if found.group(3) == "T" else 1.0)
            gpu.gflops_last = gflops
            gpu.gflops_max = max(gpu.gflops_max or 0.0, gflops)
            if gpu.processed_last < 0:
                gpu.died = True
        if "DIED" in part:
            gpu.died = True
    for i, part in enumerate(_COLUMN_SEP.split(m.group("errors"))):
        gpu = state.column(i)
        tokens = part.split()
        count = to_int(tokens[0]) if tokens else None
        if count is not None:
            gpu.errors_max = max(gpu.errors_max, count)
        if "DIED" in part:
            gpu.died = True
    for i, part in enumerate(_COLUMN_SEP.split(m.group("temps") or "")):
        tokens = part.split()
        temp = to_float(tokens[0]) if tokens else None
        if temp is not None:
            gpu = state.column(i)
            gpu.temp_max_c = max(gpu.temp_max_c or 0, int(temp))


def parse_gpu_burn(text: str) -> GpuBurnResult:
    """Parse a saved gpu-burn run.

    Raises:
        ParseError: no gpu-burn line (device init, progress, final block, gpu-burn error).
    """
    state = _State()
    duration: int | None = None
    tested: int | None = None
    pct: float | None = None
    errors: list[GpuBurnError] = []
    recognized = False

    lines = split_lines(text)
    last = len(lines) - 1
    for number, raw in enumerate(lines, start=1):
        # A terminal capture keeps every repaint of the progress line (~70 per 0.1 %, tens
        # of MB an hour). Counts only grow between summaries and a death is sticky, so the
        # last repaint before any other line carries everything the earlier ones did.
        if number <= last and "proc'd:" in raw and "proc'd:" in lines[number]:
            continue
        line = " ".join(strip_launcher_prefix(raw).split())  # tabs, runs of spaces: one space
        if not line:
            continue
        if tested is not None and (m := _STATUS.match(line)):
            state.gpu(int(m.group(1))).status = m.group(2)
            continue
        if "proc'd:" in line and (m := _PROGRESS.match(line)):
            pct = float(m.group("pct"))
            _progress(state, m)
            recognized = True
            continue
        if m := _TESTED.match(line):
            tested = int(m.group(1))
            recognized = True
            continue
        if m := _LISTED.match(line):
            gpu = state.gpu(int(m.group(1)))
            gpu.model, gpu.uuid = m.group(2), m.group(3)
            continue
        if m := _INITIALIZED.match(line):
            index = int(m.group(1))
            gpu = state.gpu(index)
            gpu.precision, gpu.tensor_cores = m.group(3), m.group("tensor") is not None
            if index not in state.order:
                state.order.append(index)
            recognized = True
            continue
        if m := _BURNING.match(line):
            duration = int(m.group(1))
            recognized = True
            continue
        if _FATAL.search(line):
            errors.append(GpuBurnError(line_number=number, line=line))
            if "No clients are alive" in line or "Couldn't init a GPU test" in line:
                recognized = True
    if not recognized:
        raise ParseError(
            "no gpu-burn output found (no 'Initialized device', progress line, "
            "'Tested N GPUs:' block or gpu-burn error)"
        )
    return GpuBurnResult(
        duration_s=duration,
        tested=tested,
        progress_pct=pct,
        gpus=tuple(state.gpus[i].freeze() for i in sorted(state.gpus)),
        errors=tuple(errors),
    )
