"""What an active check produces: the verdict (pass / warn / fail with reasons, per node and
per GPU), and the error every parser raises.

The parsed figures are tool-specific and live with each parser (``nccl.NcclResult``,
``dcgm.DcgmDiagResult``, ``perftest.IbWriteBwResult``, ``gpuburn.GpuBurnResult``); this
module holds only what every check shares, below the parsers (they import it; it imports
none of them). The result that holds a parse next to its verdict is ``result.CheckResult``.
Everything here is a frozen dataclass: a verdict is a record of what happened, never
edited after the fact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class CheckKind(StrEnum):
    """An active check, named as ``gpufleet checks parse KIND`` takes it."""

    DCGM_DIAG = "dcgm-diag"  # dcgmi diag -r 1..4 -j
    NCCL = "nccl"  # nccl-tests *_perf (all_reduce_perf and the other collectives)
    IB_WRITE_BW = "ib-write-bw"  # perftest ib_write_bw, one HCA pair
    GPU_BURN = "gpu-burn"  # wilicc/gpu-burn

    @classmethod
    def from_name(cls, name: str) -> CheckKind:
        """A kind from its own name or the tool's (``dcgmi``, ``all_reduce_perf`` and the
        other nccl-tests binaries, ``ib_write_bw``, ``gpu_burn``), any case, ``_`` or
        ``-``. Raises ``ValueError`` naming what is accepted."""
        key = name.strip().lower().replace("_", "-")
        if key.endswith(".exe"):
            key = key[:-4]
        kind = _TOOL_NAMES.get(key)
        if kind is None and key.endswith("-perf"):
            kind = cls.NCCL  # all_reduce_perf, alltoall_perf, sendrecv_perf, ...
        if kind is None:
            try:
                kind = cls(key)
            except ValueError:
                raise ValueError(
                    f"{name!r} is no check this parses: one of "
                    f"{', '.join(k.value for k in cls)} (or the tool's own name: dcgmi, "
                    "all_reduce_perf, ib_write_bw, gpu_burn)"
                ) from None
        return kind


_TOOL_NAMES = {
    "dcgmi": CheckKind.DCGM_DIAG,
    "dcgm": CheckKind.DCGM_DIAG,
    "dcgmi-diag": CheckKind.DCGM_DIAG,
    "nccl-tests": CheckKind.NCCL,
    "ib-write-bw": CheckKind.IB_WRITE_BW,
    "gpuburn": CheckKind.GPU_BURN,
}


class ParseError(ValueError):
    """The text is not output of the tool asked for (empty, garbage, another tool's output).

    The only exception a parser raises. ``evaluate.check_output`` turns it into a failed
    verdict, so garbage can never pass.
    """


class Outcome(StrEnum):
    """Ordered from best to worst; ``worst()`` relies on this order."""

    PASS = "pass"  # noqa: S105 (a verdict, not a password)
    WARN = "warn"  # passed, but a figure is near its limit or evidence is thin
    FAIL = "fail"


_RANK = {Outcome.PASS: 0, Outcome.WARN: 1, Outcome.FAIL: 2}


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    """The worst of ``outcomes``; ``PASS`` for none."""
    return max(outcomes, key=_RANK.__getitem__, default=Outcome.PASS)


class ReasonCode(StrEnum):
    """Why a verdict is what it is; stable strings scripts and the console can key on."""

    NOT_RECOGNIZED = "not-recognized"  # not this tool's output at all
    DID_NOT_FINISH = "did-not-finish"  # truncated, hung, killed: no final summary
    CRASHED = "crashed"  # the tool reported a fatal error
    WRONG_RESULTS = "wrong-results"  # data corruption seen by the tool's own validation
    BELOW_THRESHOLD = "below-threshold"  # a figure under its fail limit
    NEAR_THRESHOLD = "near-threshold"  # a figure under its warn limit
    TEST_FAILED = "test-failed"  # a DCGM test reported Fail
    TEST_WARNING = "test-warning"  # a DCGM test reported Warn, or did not run
    GPU_FAULTY = "gpu-faulty"  # gpu-burn: wrong GEMM results
    GPU_DIED = "gpu-died"  # gpu-burn: the worker for a GPU died
    GPU_MISSING = "gpu-missing"  # fewer GPUs in the output than expected
    NO_WORK = "no-work"  # a GPU reported OK but did no work
    SLOW_GPU = "slow-gpu"  # one GPU well below the others on the node
    MISSING_NODES = "missing-nodes"  # fewer nodes in the output than expected
    MODEL_MISMATCH = "model-mismatch"  # the output shows another GPU model than judged for
    NOTE = "note"  # information, never changes the outcome


@dataclass(frozen=True, slots=True)
class CheckContext:
    """What the caller knows about a run that its output does not say.

    ``gpu_model`` and ``fabric`` may be any unique part of a name in the thresholds table
    (``H100``, ``ndr``); ``check_output`` resolves them and raises ``UnknownName`` for one
    it does not know, before reading the output.
    """

    node: str | None = None  # the node a single-node check ran on
    gpu_model: str | None = None  # judge single-node NCCL busbw against this model
    fabric: str | None = None  # judge ib_write_bw and multi-node NCCL against this fabric
    expected_gpus: int | None = None  # GPUs each node should have shown
    expected_nodes: int | None = None  # nodes an NCCL run should have spanned
    nics_per_node: int | None = None  # multi-node NCCL: scales the fabric's limit


@dataclass(frozen=True, slots=True)
class Reason:
    """One finding behind a verdict, in words a person can act on.

    ``figure`` and ``threshold`` carry the numbers the message names (units in ``unit``),
    so a console can render them and a script can compare them without parsing text.
    """

    outcome: Outcome  # what this reason does to the verdict (NOTE reasons are PASS)
    code: ReasonCode
    message: str
    node: str | None = None
    gpu_index: int | None = None
    figure: float | None = None
    threshold: float | None = None
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """One GPU: judged only on reasons that name it (a slow ring is not a GPU's fault)."""

    index: int
    outcome: Outcome
    reasons: tuple[Reason, ...] = ()
    figures: Mapping[str, float | int | str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node: its own reasons plus every reason that concerns the whole run.

    ``node`` is ``None`` when the output does not say which host it came from (gpu-burn,
    dcgmi, ib_write_bw); the runner, which knows, passes it to ``evaluate``.
    """

    node: str | None
    outcome: Outcome
    reasons: tuple[Reason, ...] = ()
    gpus: tuple[GpuVerdict, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: CheckKind
    outcome: Outcome
    reasons: tuple[Reason, ...]  # every reason, in the order found
    nodes: tuple[NodeVerdict, ...]
    figures: Mapping[str, float | int | str | None] = field(default_factory=dict)
    thresholds: Mapping[str, float] = field(default_factory=dict)  # the limits applied

    @property
    def passed(self) -> bool:
        """A warning still passes; only ``FAIL`` fails (exit 1, node not accepted)."""
        return self.outcome is not Outcome.FAIL
