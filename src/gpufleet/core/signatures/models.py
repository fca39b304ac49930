"""The failure-signature catalog's schema: frozen pydantic models with strict validation.

The catalog itself is data (``catalog.toml``); these models are what it must look like.
Validation runs once when the package data is loaded, so a bad edit fails the first
test that touches the catalog with a message naming the entry and the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from gpufleet.core.enums import FindingSource, RepairAction, Severity

# From least to most drastic (DESIGN: "Failure signatures and actions").
ACTION_ORDER: tuple[RepairAction, ...] = tuple(RepairAction)

# Fields a metric rule may name. The agent's collectors publish samples under these names
# (docs/signatures.md lists units); a closed set turns a typo in the catalog into a load
# error instead of a rule that silently never fires.
METRIC_FIELDS: frozenset[str] = frozenset(
    {
        "clocks_event_reasons",  # NVML clock-event (throttle) bitmask
        "ecc_dbe_volatile",  # uncorrected ECC, since driver load (counter)
        "ecc_sbe_volatile",  # corrected ECC, since driver load (counter)
        "remapped_rows_pending",  # 0/1
        "remapped_rows_failure",  # 0/1
        "remapped_rows_uncorrectable",  # count
        "retired_pages_pending",  # 0/1 (pre-Ampere)
        "pcie_replay_count",  # counter
        "pcie_link_width",
        "pcie_link_width_max",
        "pcie_link_gen",
        "pcie_link_gen_max",
        "nvlink_replay_errors",  # counter, summed over links
        "nvlink_recovery_errors",  # counter, summed over links
        "nvlink_crc_errors",  # counter (flit + data), summed over links
        "gpu_recovery_action",  # NVML field 230 enum
        "ib_port_state",  # 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE
        "ib_phys_state",  # 2 Polling, 3 Disabled, 5 LinkUp, ...
        "ib_rate_gbps",
        "ib_rate_expected_gbps",
        "ib_link_downed",  # counter
        "ib_symbol_error",  # counter
        "ib_port_rcv_errors",  # counter
        "ib_link_error_recovery",  # counter
    }
)

# Conditions a state rule may name; the agent implements each one by name.
STATE_CONDITIONS: frozenset[str] = frozenset(
    {
        "gpu_count_below_expected",  # NVML device count < configured GPUs per node
        "nvml_init_failed",  # nvmlInit raised (driver not loaded, library missing, ...)
        "nvml_gpu_lost",  # an NVML call raised NVMLError_GpuIsLost
        "nvml_reset_required",  # an NVML call raised NVMLError_ResetRequired
        "nvml_driver_mismatch",  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
        "nvlink_link_inactive",  # a link that was up at start is no longer active
        "fabric_not_ready",  # GPU fabric state present but not COMPLETED
        "slurm_node_reason",  # the node is drained/down with a reason (see params)
        "daemon_flapping",  # the agent restarted a node daemon too often (params: daemon)
        "slurm_gres_mismatch",  # Slurm's GPUs vs the hardware (params: mismatch)
    }
)

_ID = r"^[a-z0-9][a-z0-9-]*[a-z0-9]$"

Op = Literal[">", ">=", "<", "<=", "==", "!=", "&"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _compile(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
    return pattern


class Override(_Frozen):
    """Severity/action from the line itself (e.g. Xid 154's stated action, ``Nonfatal``)."""

    pattern: str
    severity: Severity | None = None
    action: RepairAction | None = None

    _check = field_validator("pattern")(_compile)


class MultiLine(_Frozen):
    """A message the driver splits over several lines; ``pattern`` sees them joined.

    ``start`` opens a window of up to ``max_lines`` candidate lines (lines that pass the
    prefilter), joined with a space, that ``pattern`` is tried against after each line.
    """

    start: str
    max_lines: int = Field(default=4, ge=2, le=16)

    _check = field_validator("start")(_compile)


class KernelLogRule(_Frozen):
    kind: Literal["kernel-log"] = "kernel-log"
    # Exactly one of ``pattern`` and ``pattern_ref`` (a name in the catalog's [patterns]).
    pattern: str | None = None
    pattern_ref: str | None = None
    # Literals, one of which every matching line contains: the cheap check before regex.
    prefilter: tuple[str, ...] = Field(min_length=1)
    # The value of the pattern's ``xid`` or ``sxid`` group must be one of these ...
    codes: tuple[int, ...] = ()
    # ... or, with ``fallback``, any code no other rule on the same pattern claims.
    fallback: bool = False
    contains: tuple[str, ...] = ()  # substrings the message must all contain
    excludes: tuple[str, ...] = ()  # substrings that veto a match
    multiline: MultiLine | None = None
    overrides: tuple[Override, ...] = ()

    _check = field_validator("pattern")(lambda v: v if v is None else _compile(v))

    @model_validator(mode="after")
    def _one_pattern(self) -> KernelLogRule:
        if (self.pattern is None) == (self.pattern_ref is None):
            raise ValueError("give exactly one of pattern and pattern_ref")
        if self.fallback and self.codes:
            raise ValueError("a fallback rule takes no codes")
        if any(not p for p in self.prefilter):
            raise ValueError("prefilter literals must not be empty")
        return self


class MetricRule(_Frozen):
    """A threshold the agent evaluates on samples of one field.

    ``mode = "value"`` compares each sample; ``"delta"`` compares the counter's increase
    over the last ``window_s`` seconds (a reset or rollover counts as no increase). In
    value mode with ``window_s``, the rule fires when at least ``min_count`` samples in
    the window breach (e.g. 6 of 10 one-minute samples).
    """

    kind: Literal["metric"] = "metric"
    field: str
    op: Op
    value: float | None = None
    value_field: str | None = None  # compare against another field of the same sample
    mode: Literal["value", "delta"] = "value"
    window_s: float | None = Field(default=None, gt=0)
    min_count: int = Field(default=1, ge=1)
    scope: Literal["gpu", "node", "port"] = "gpu"

    @model_validator(mode="after")
    def _consistent(self) -> MetricRule:
        for name in (self.field, self.value_field):
            if name is not None and name not in METRIC_FIELDS:
                raise ValueError(f"unknown metric field {name!r}; known: {sorted(METRIC_FIELDS)}")
        if (self.value is None) == (self.value_field is None):
            raise ValueError("give exactly one of value and value_field")
        if self.mode == "delta" and self.window_s is None:
            raise ValueError("a delta rule needs window_s")
        if self.min_count > 1 and self.window_s is None:
            raise ValueError("min_count needs window_s")
        if self.op == "&" and (self.value is None or self.value != int(self.value)):
            raise ValueError("op '&' needs an integer bit mask as value")
        return self


class StateRule(_Frozen):
    kind: Literal["state"] = "state"
    condition: str
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> StateRule:
        if self.condition not in STATE_CONDITIONS:
            raise ValueError(
                f"unknown condition {self.condition!r}; known: {sorted(STATE_CONDITIONS)}"
            )
        reason = self.params.get("reason_pattern")
        if isinstance(reason, str):
            _compile(reason)
        return self


class CheckRule(_Frozen):
    """A failed active check the server judged (``checks/aggregate.py``): ``check`` is the
    check kind, ``codes`` the verdict reason codes (``checks.models.ReasonCode``) that
    raise this entry; an entry with no codes takes the failures no other entry of the
    same check claims. Only the server raises these, never the agent."""

    kind: Literal["check"] = "check"
    check: Literal["dcgm-diag", "nccl", "ib-write-bw", "gpu-burn"]
    codes: tuple[str, ...] = ()
    scope: Literal["gpu", "node"] = "node"


class StackRule(_Frozen):
    """A node runs a ``component`` other than its cluster's software stack pins
    (``core.stacks``): the server compares what the agent reports with the stack. Only
    the server raises these, never the agent."""

    kind: Literal["stack"] = "stack"
    component: Literal["driver"]


Rule = Annotated[
    KernelLogRule | MetricRule | StateRule | CheckRule | StackRule, Field(discriminator="kind")
]


class Escalation(_Frozen):
    """Seen ``repeat`` times on the same GPU/node within ``within_s`` → ``then``."""

    repeat: int = Field(ge=2)
    within_s: int = Field(gt=0)
    then: RepairAction


class ClearRule(_Frozen):
    """When an open finding clears. ``samples``: N good samples in a row (hysteresis);
    ``quiet``: no recurrence for ``quiet_s``; ``repair``: after its repair is verified;
    ``manual``: an operator clears it (hardware marked for service)."""

    mode: Literal["samples", "quiet", "repair", "manual"]
    samples: int | None = Field(default=None, ge=1)
    quiet_s: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _needs(self) -> ClearRule:
        if self.mode == "samples" and self.samples is None:
            raise ValueError("mode 'samples' needs samples")
        if self.mode == "quiet" and self.quiet_s is None:
            raise ValueError("mode 'quiet' needs quiet_s")
        return self


class Companion(_Frozen):
    """In a burst on one GPU, this signature together with ``xids`` → ``action``."""

    xids: tuple[int, ...] = Field(min_length=1)
    action: RepairAction


class NvidiaBuckets(_Frozen):
    """NVIDIA's resolution buckets from the Xid catalog, verbatim (empty when blank)."""

    immediate: str = ""
    investigatory: str = ""


class Signature(_Frozen):
    id: str = Field(pattern=_ID)
    title: str = Field(min_length=3)
    category: Literal[
        "application",
        "gpu-memory",
        "gpu-bus",
        "gpu-firmware",
        "gpu-engine",
        "driver",
        "nvlink",
        "nvswitch",
        "thermal",
        "power",
        "pcie",
        "infiniband",
        "scheduler",
        "informational",
    ]
    severity: Severity
    source: FindingSource
    match: Rule
    action: RepairAction
    escalation: Escalation | None = None
    clear: ClearRule | None = None
    companions: tuple[Companion, ...] = ()
    solo_action: RepairAction | None = None  # when no other Xid came in the same burst
    treat_as_xid: int | None = None  # e.g. fallen-off-the-bus without an Xid ≡ Xid 79
    nvidia: NvidiaBuckets | None = None
    reference: str = Field(min_length=3)
    notes: str = ""

    @field_validator("match", mode="before")
    @classmethod
    def _default_kind(cls, value: object) -> object:
        # Most entries are kernel-log rules; let them leave ``kind`` out.
        if isinstance(value, dict) and "kind" not in value:
            return {**value, "kind": "kernel-log"}
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Signature:
        kernel = isinstance(self.match, KernelLogRule)
        if kernel != (self.source is FindingSource.KERNEL_LOG):
            raise ValueError("source 'kernel-log' goes with a kernel-log rule, and only it")
        if isinstance(self.match, StackRule) != (self.source is FindingSource.STACK):
            raise ValueError("source 'stack' goes with a stack rule, and only it")
        if isinstance(self.match, CheckRule) != (self.source is FindingSource.ACTIVE_CHECK):
            raise ValueError("source 'active-check' goes with a check rule, and only it")
        if isinstance(self.match, MetricRule) and self.source not in (
            FindingSource.NVML,
            FindingSource.DCGM,
            FindingSource.INFINIBAND,
        ):
            raise ValueError("a metric rule needs source nvml, dcgm or infiniband")
        if self.escalation is not None and ACTION_ORDER.index(
            self.escalation.then
        ) <= ACTION_ORDER.index(self.action):
            raise ValueError(
                f"escalation.then ({self.escalation.then}) must be more drastic "
                f"than action ({self.action})"
            )
        return self


class Catalog(_Frozen):
    version: str
    group_window_s: float = Field(default=10.0, gt=0)  # one incident's Xid burst
    patterns: dict[str, str] = Field(default_factory=dict)
    signatures: tuple[Signature, ...] = Field(min_length=1)

    _by_id: dict[str, Signature] = PrivateAttr(default_factory=dict)
    _by_xid: dict[int, Signature] = PrivateAttr(default_factory=dict)

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _compile(pattern)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Catalog:
        seen: set[str] = set()
        claimed: dict[tuple[str, int], str] = {}
        for sig in self.signatures:
            if sig.id in seen:
                raise ValueError(f"duplicate signature id {sig.id!r}")
            seen.add(sig.id)
            rule = sig.match
            if not isinstance(rule, KernelLogRule):
                continue
            if rule.pattern_ref is not None and rule.pattern_ref not in self.patterns:
                raise ValueError(f"{sig.id}: unknown pattern_ref {rule.pattern_ref!r}")
            pattern = self.pattern_of(rule)
            if (rule.codes or rule.fallback) and not re.search(r"\(\?P<s?xid>", pattern):
                raise ValueError(f"{sig.id}: codes need a pattern with an xid or sxid group")
            for code in rule.codes:
                key = (pattern + "\0" + "\0".join(rule.contains), code)
                if key in claimed:
                    raise ValueError(f"{sig.id}: code {code} already claimed by {claimed[key]}")
                claimed[key] = sig.id
        return self

    def model_post_init(self, context: object, /) -> None:  # noqa: ARG002 - pydantic hook
        self._by_id.update({s.id: s for s in self.signatures})
        for sig in self.signatures:
            rule = sig.match
            if isinstance(rule, KernelLogRule) and rule.pattern_ref == "nvrm-xid":
                for code in rule.codes:
                    self._by_xid.setdefault(code, sig)

    def pattern_of(self, rule: KernelLogRule) -> str:
        if rule.pattern is not None:
            return rule.pattern
        assert rule.pattern_ref is not None  # guaranteed by KernelLogRule's validator
        return self.patterns[rule.pattern_ref]

    def get(self, signature_id: str) -> Signature | None:
        return self._by_id.get(signature_id)

    def for_xid(self, xid: int) -> Signature | None:
        """The entry for a GPU Xid number, or None for an Xid the catalog does not list."""
        return self._by_xid.get(xid)

    def by_source(self, source: FindingSource) -> tuple[Signature, ...]:
        return tuple(s for s in self.signatures if s.source is source)
