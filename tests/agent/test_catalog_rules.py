"""Every metric and state rule in the catalog: a case that fires it and a near miss.

The kernel-log entries have theirs in ``tests/core/signatures/test_matcher.py``; this is
the same contract for the entries the agent's :class:`Detector` evaluates on samples and
conditions (sources nvml, infiniband, scheduler, agent). Cases are keyed by signature id
and the key set must equal the catalog's, so a new rule entry without a case fails here.

Inputs are shaped like the collectors' output: an NVML cycle reports the node-level
conditions, then per GPU ``nvml_gpu_lost``, ``nvml_reset_required``,
``nvlink_link_inactive`` and a sample carrying every field; an InfiniBand cycle is one
sample per port with raw counters and their ``*_delta``; Slurm is one
``slurm_node_reason`` condition built the way ``SlurmCollector`` builds it. Two GPUs and
two ports are reported, so "exactly that signature opens" also means "on that GPU/port".
Time comes from a ``FakeClock``; windows are walked at a realistic sample rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pytest

from gpufleet.agent.collectors.base import CollectorResult, Condition, Sample
from gpufleet.agent.collectors.infiniband import COUNTERS
from gpufleet.agent.collectors.slurm import SlurmNode
from gpufleet.agent.detectors import Detector
from gpufleet.agent.findings import FindingChange
from gpufleet.agent.rules import BUCKETS_PER_WINDOW
from gpufleet.core.agent_protocol import FindingState
from gpufleet.core.clock import FakeClock
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.models import MetricRule, StateRule

CATALOG = get_catalog()
RULE_IDS: tuple[str, ...] = tuple(
    s.id for s in CATALOG.signatures if isinstance(s.match, MetricRule | StateRule)
)

# Entries no detector code path evaluates: each becomes a strict xfail (so it turns into
# a failure the day a path exists), never a faked pass. Empty: every rule entry is
# evaluated by Detector.observe.
NO_DETECTOR_PATH: dict[str, str] = {}

PCI = ("0000:3b:00.0", "0000:5e:00.0")
UUID = ("GPU-3b000000-0000-0000-0000-000000000000", "GPU-5e000000-0000-0000-0000-000000000000")
PORT = ("mlx5_0/1", "mlx5_1/1")
NODE = "node"

# What a healthy, busy H100 reports (every catalog field the NVML collector reads).
HEALTHY_GPU: Mapping[str, float] = {
    "utilization_pct": 97.0,
    "memory_used_mib": 61_000.0,
    "memory_total_mib": 81_559.0,
    "temperature_c": 64.0,
    "power_w": 612.0,
    "sm_clock_mhz": 1980.0,
    "clocks_event_reasons": 0.0,
    "ecc_sbe_volatile": 3.0,
    "ecc_dbe_volatile": 0.0,
    "ecc_sbe_aggregate": 12.0,
    "ecc_dbe_aggregate": 0.0,
    "remapped_rows_correctable": 2.0,
    "remapped_rows_uncorrectable": 0.0,
    "remapped_rows_pending": 0.0,
    "remapped_rows_failure": 0.0,
    "pcie_replay_count": 41.0,
    "retired_pages_pending": 0.0,
    "pcie_link_width": 16.0,
    "pcie_link_width_max": 16.0,
    "pcie_link_gen": 5.0,
    "pcie_link_gen_max": 5.0,
    "gpu_recovery_action": 0.0,  # NVML_GPU_RECOVERY_ACTION_NONE
    "nvlink_replay_errors": 0.0,
    "nvlink_recovery_errors": 2.0,
    "nvlink_crc_errors": 120.0,
}
# A healthy NDR port: ACTIVE / LinkUp at its best rate, lifetime counters non-zero.
HEALTHY_PORT: Mapping[str, float] = {
    "ib_port_state": 4.0,
    "ib_phys_state": 5.0,
    "ib_rate_gbps": 400.0,
    "ib_rate_expected_gbps": 400.0,
    "ib_link_downed": 1.0,
    "ib_symbol_error": 0.0,
    "ib_port_rcv_errors": 7.0,
    "ib_link_error_recovery": 0.0,
}
# Clock-event bits that are not faults: GPU idle, applications clocks, SW power cap,
# display clock. None of them is a catalog bit (0x8, 0x20, 0x40, 0x80).
BENIGN_CLOCK_EVENTS = 0x1 | 0x2 | 0x4 | 0x100
SW_POWER_CAP = 0x4


# -- collector-shaped inputs ------------------------------------------------------------


def nvml(
    *,
    gpu0: Mapping[str, float] | None = None,
    present: int = 2,
    expected: int = 2,
    lost: Iterable[int] = (),
    reset_required: Iterable[int] = (),
    nvlink_down: Mapping[int, list[int]] | None = None,
    init_error: int | None = None,
) -> CollectorResult:
    """One ``NvmlCollector.collect_sync`` cycle, condition for condition."""
    result = CollectorResult()
    if init_error is not None:
        result.conditions.append(
            Condition("nvml_init_failed", True, f"nvmlInit: NVMLError({init_error})")
        )
        result.conditions.append(
            Condition("nvml_driver_mismatch", init_error == 18, f"NVMLError({init_error})")
        )
        return result
    result.conditions.append(Condition("nvml_init_failed", False))
    result.conditions.append(Condition("nvml_driver_mismatch", False))
    result.conditions.append(
        Condition(
            "gpu_count_below_expected",
            present < expected,
            f"NVML sees {present} GPUs, expected {expected}",
        )
    )
    lost, reset_required, nvlink_down = set(lost), set(reset_required), nvlink_down or {}
    for index in range(present):
        where = {"gpu_index": index, "gpu_uuid": UUID[index], "pci_bus_id": PCI[index]}
        if index in lost:
            result.conditions.append(
                Condition("nvml_gpu_lost", True, f"GPU {index}: (NVML_ERROR_GPU_IS_LOST)", **where)  # type: ignore[arg-type]
            )
            continue
        result.conditions.append(Condition("nvml_gpu_lost", False, **where))  # type: ignore[arg-type]
        result.conditions.append(
            Condition(
                "nvml_reset_required",
                index in reset_required,
                f"GPU {index}: NVML_ERROR_RESET_REQUIRED",
                **where,  # type: ignore[arg-type]
            )
        )
        down = nvlink_down.get(index, [])
        result.conditions.append(
            Condition("nvlink_link_inactive", bool(down), f"NVLink down: {down}", **where)  # type: ignore[arg-type]
        )
        values = {**HEALTHY_GPU, **(gpu0 or {})} if index == 0 else dict(HEALTHY_GPU)
        result.samples.append(
            Sample(
                "gpu", values, index, UUID[index], PCI[index], serial=f"165{index}", model="H100"
            )
        )
    return result


def slurm(states: Iterable[str], reason: str = "") -> CollectorResult:
    """One ``SlurmCollector.collect`` cycle for a node in ``states`` with ``reason``."""
    node = SlurmNode(frozenset(states), reason)
    return CollectorResult(
        conditions=[
            Condition(
                "slurm_node_reason",
                node.state in ("down", "drain"),
                f"State={'+'.join(sorted(node.states))} Reason={node.reason}",
                attrs={"state": node.state, "reason": node.reason},
            )
        ]
    )


def flapping(daemon: str, active: bool) -> CollectorResult:
    """One ``DaemonSupervisor`` report for ``daemon``."""
    return CollectorResult(
        conditions=[
            Condition(
                "daemon_flapping",
                active,
                f"{daemon}: restarted",
                component=daemon,
                attrs={"daemon": daemon},
            )
        ]
    )


def gres(kind: str, active: bool) -> CollectorResult:
    """One ``GresCheck`` report of one kind of mismatch."""
    return CollectorResult(
        conditions=[
            Condition(
                "slurm_gres_mismatch",
                active,
                f"{kind}: Slurm 8, node 6",
                component=f"slurm-gres-{kind.replace('_', '-')}",
                attrs={"mismatch": kind},
            )
        ]
    )


def gres_case(kind: str) -> Case:
    at = f"slurm-gres-{kind.replace('_', '-')}"
    return state_case(gres(kind, False), gres(kind, True), gres(kind, False), at)


UP = ("IDLE",)
DRAIN = ("IDLE", "DRAIN")
DOWN = ("DOWN",)


class Run:
    """A detector, a fake clock, and every change it returned, by step."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.det = Detector()
        self.changes: list[tuple[int, FindingChange]] = []
        self.steps = 0
        self.fire_step: int | None = None
        self._ib_last: dict[str, dict[str, float]] = {}

    def feed(self, result: CollectorResult, *, then: float = 1.0) -> None:
        for change in self.det.observe(result, self.clock.now()):
            self.changes.append((self.steps, change))
        self.steps += 1
        self.clock.advance(then)

    def fires_next(self) -> None:
        """The next feed is the one that must open the finding."""
        self.fire_step = self.steps

    def align(self, width: float) -> None:
        """Move to the start of a rule bucket, so "N buckets" means exactly N."""
        t = self.clock.now().timestamp()
        if t % width:
            self.clock.advance(width - t % width)

    def ib(self, port0: Mapping[str, float] | None = None) -> CollectorResult:
        """One ``InfinibandCollector`` cycle: raw counters plus ``*_delta`` per port."""
        result = CollectorResult()
        for i, component in enumerate(PORT):
            values = {**HEALTHY_PORT, **(port0 or {})} if i == 0 else dict(HEALTHY_PORT)
            before = self._ib_last.get(component, {})
            for metric in COUNTERS.values():
                prev, now = before.get(metric), values[metric]
                values[f"{metric}_delta"] = 0 if prev is None or now < prev else now - prev
            self._ib_last[component] = {m: values[m] for m in COUNTERS.values()}
            result.samples.append(Sample("port", values, component=component))
        return result

    def sample(self, target: str, values: Mapping[str, float], *, then: float) -> None:
        self.feed(nvml(gpu0=values) if target == "gpu" else self.ib(values), then=then)


Script = Callable[[Run], None]


@dataclass(frozen=True)
class Case:
    fire: Script
    near_miss: Script
    at: str  # what follows "@" in the finding key: a PCI address, a port, or "node"
    fire_also: frozenset[str] = frozenset()  # opened by the same input, by design
    miss_also: frozenset[str] = frozenset()


# -- case builders -----------------------------------------------------------------------


def value_case(field: str, breach: float, ok: float, *, miss_also: Iterable[str] = ()) -> Case:
    """A value rule without a window: the sample itself decides."""

    def fire(run: Run) -> None:
        for _ in range(3):
            run.feed(nvml())
        run.fires_next()
        for _ in range(3):  # holds on: still one finding
            run.feed(nvml(gpu0={field: breach}))

    def near_miss(run: Run) -> None:
        for _ in range(10):
            run.feed(nvml(gpu0={field: ok}))

    return Case(fire, near_miss, PCI[0], miss_also=frozenset(miss_also))


def windowed_case(
    target: str,
    breach: Mapping[str, float],
    ok: Mapping[str, float],
    *,
    window_s: float,
    min_count: int,
) -> Case:
    """``min_count`` breaching buckets of ``window_s / 10`` fire; one fewer must not.

    Sampled six times a bucket, so counting raw samples instead of buckets would fire
    the near miss."""
    width = window_s / BUCKETS_PER_WINDOW
    step = width / 6

    def buckets(run: Run, values: Mapping[str, float], n: int) -> None:
        for _ in range(6 * n):
            run.sample(target, values, then=step)

    def fire(run: Run) -> None:
        run.align(width)
        buckets(run, {}, 1)
        buckets(run, breach, min_count - 1)
        run.fires_next()
        buckets(run, breach, 1)

    def near_miss(run: Run) -> None:
        run.align(width)
        for _ in range(2):  # one bucket short, twice, a clean window apart
            buckets(run, breach, min_count - 1)
            buckets(run, ok, BUCKETS_PER_WINDOW)
        if 2 * min_count > BUCKETS_PER_WINDOW:
            # Every other bucket for two windows: never min_count in any one window.
            for _ in range(BUCKETS_PER_WINDOW):
                buckets(run, breach, 1)
                buckets(run, ok, 1)

    return Case(fire, near_miss, PCI[0] if target == "gpu" else PORT[0])


def delta_case(target: str, field: str, *, base: float, need: int, window_s: float) -> Case:
    """A counter rising by ``need`` within ``window_s`` fires. The near miss: a lifetime
    counter already at ``base`` when the agent starts, a reset to 0, and then rises of
    ``need - 1`` twice, more than a window apart."""
    step = window_s / 60

    def at(run: Run, value: float) -> None:
        run.sample(target, {field: value}, then=step)

    def fire(run: Run) -> None:
        for _ in range(5):
            at(run, base)
        first = need // 2
        at(run, base + first)
        at(run, base + first)
        run.fires_next()
        at(run, base + need)
        at(run, base + need)

    def near_miss(run: Run) -> None:
        for _ in range(5):
            at(run, base)
        at(run, 0)  # driver reload / perfquery -R / 32-bit wrap
        low = need - 1
        at(run, low // 2)
        at(run, low)
        for _ in range(61):  # hold past the window: those rises age out
            at(run, low)
        at(run, low + low // 2)
        for _ in range(5):
            at(run, 2 * low)

    return Case(fire, near_miss, PCI[0] if target == "gpu" else PORT[0])


def state_case(
    healthy: CollectorResult,
    bad: CollectorResult,
    benign: CollectorResult,
    at: str,
    *,
    fire_also: Iterable[str] = (),
    miss_also: Iterable[str] = (),
) -> Case:
    """A condition with no grace: the first active report opens it."""

    def fire(run: Run) -> None:
        run.feed(healthy)
        run.feed(healthy)
        run.fires_next()
        for _ in range(3):  # holds on: one occurrence
            run.feed(bad)

    def near_miss(run: Run) -> None:
        for _ in range(10):
            run.feed(benign)

    return Case(fire, near_miss, at, frozenset(fire_also), frozenset(miss_also))


def fabric(active: bool) -> CollectorResult:
    state = "IN_PROGRESS" if active else "COMPLETED"
    return CollectorResult(
        conditions=[
            Condition(
                "fabric_not_ready",
                active,
                f"GPU 0: fabric state {state}",
                gpu_index=0,
                gpu_uuid=UUID[0],
                pci_bus_id=PCI[0],
            )
        ]
    )


def fabric_case() -> Case:
    """grace_s = 300: still registering after 300 s fires; 290 s, then done, must not."""

    def fire(run: Run) -> None:
        for _ in range(30):  # 0 .. 290 s
            run.feed(fabric(True), then=10)
        run.fires_next()
        run.feed(fabric(True), then=10)  # 300 s

    def near_miss(run: Run) -> None:
        for _ in range(2):  # the grace restarts after a COMPLETED report
            for _ in range(30):
                run.feed(fabric(True), then=10)
            run.feed(fabric(False), then=10)

    return Case(fire, near_miss, PCI[0])


def slurm_case(
    states: Iterable[str], reason: str, own: str, *, fire_also: Iterable[str] = ()
) -> Case:
    """Fires on a foreign reason; the near miss is gpufleet's own drain/down (``own``)."""
    assert own.startswith("gpufleet:")
    states = tuple(states)
    return state_case(
        slurm(UP), slurm(states, reason), slurm(states, own), NODE, fire_also=fire_also
    )


def clock_events(bit: int) -> Case:
    return windowed_case(
        "gpu",
        {"clocks_event_reasons": bit | SW_POWER_CAP},
        {"clocks_event_reasons": BENIGN_CLOCK_EVENTS},
        window_s=600,
        min_count=6,
    )


# -- the cases ---------------------------------------------------------------------------

CASES: dict[str, Case] = {
    # NVML clock-event reasons: 6 of 10 one-minute buckets.
    "hw-slowdown": clock_events(0x8),
    "thermal-slowdown": clock_events(0x40),
    "power-brake": clock_events(0x80),
    "sw-thermal-slowdown": clock_events(0x20),
    # ECC, row remapping, retired pages.
    "ecc-dbe": delta_case("gpu", "ecc_dbe_volatile", base=4, need=1, window_s=60),
    "ecc-sbe-rate": delta_case("gpu", "ecc_sbe_volatile", base=300, need=10, window_s=3600),
    "row-remap-pending": value_case("remapped_rows_pending", 1, 0),
    "row-remap-failure": value_case("remapped_rows_failure", 1, 0),
    "row-remap-uncorrectable-limit": value_case("remapped_rows_uncorrectable", 512, 511),
    "retired-pages-pending": value_case("retired_pages_pending", 1, 0),
    # PCIe.
    "pcie-replay-rate": delta_case("gpu", "pcie_replay_count", base=900, need=31, window_s=60),
    "pcie-link-downgrade": windowed_case(
        "gpu", {"pcie_link_width": 8}, {}, window_s=300, min_count=3
    ),
    # NVLink counters.
    "nvlink-error-counters": delta_case(
        "gpu", "nvlink_recovery_errors", base=2, need=1, window_s=60
    ),
    "nvlink-crc-rate": delta_case("gpu", "nvlink_crc_errors", base=120, need=6000, window_s=60),
    # NVML field 230 (GPU recovery action): each value is its own entry, so a neighbour's
    # value is the near miss (it opens the neighbour, not this one).
    "recovery-action-reset": value_case(
        "gpu_recovery_action", 1, 4, miss_also=["recovery-action-drain-reset"]
    ),
    "recovery-action-drain-reset": value_case(
        "gpu_recovery_action", 4, 1, miss_also=["recovery-action-reset"]
    ),
    "recovery-action-reboot": value_case("gpu_recovery_action", 2, 0),
    # NVML states.
    "gpu-missing": state_case(nvml(), nvml(present=1), nvml(present=2), NODE),
    "gpu-lost": state_case(nvml(), nvml(lost=[0]), nvml(), PCI[0]),
    "nvml-reset-required": state_case(nvml(), nvml(reset_required=[0]), nvml(), PCI[0]),
    # 9 = NVML_ERROR_DRIVER_NOT_LOADED; 18 = LIB_RM_VERSION_MISMATCH. A mismatch is an
    # init failure too (the collector reports both), so both open.
    "nvml-init-failed": state_case(nvml(), nvml(init_error=9), nvml(), NODE),
    "nvml-driver-mismatch": state_case(
        nvml(),
        nvml(init_error=18),
        nvml(init_error=9),
        NODE,
        fire_also=["nvml-init-failed"],
        miss_also=["nvml-init-failed"],
    ),
    "nvlink-down": state_case(nvml(), nvml(nvlink_down={0: [3]}), nvml(), PCI[0]),
    "fabric-not-ready": fabric_case(),
    # InfiniBand ports.
    "ib-link-down": windowed_case(
        "port", {"ib_port_state": 1, "ib_phys_state": 2}, {}, window_s=60, min_count=2
    ),
    "ib-port-init": windowed_case(
        "port", {"ib_port_state": 2, "ib_phys_state": 5}, {}, window_s=120, min_count=3
    ),
    "ib-link-flap": delta_case("port", "ib_link_downed", base=1, need=1, window_s=600),
    "ib-rate-downgrade": windowed_case(
        "port", {"ib_rate_gbps": 200, "ib_rate_expected_gbps": 400}, {}, window_s=120, min_count=2
    ),
    "ib-symbol-error-rate": delta_case(
        "port", "ib_symbol_error", base=5000, need=10, window_s=3600
    ),
    "ib-rcv-error-rate": delta_case("port", "ib_port_rcv_errors", base=7, need=10, window_s=3600),
    "ib-link-error-recovery": delta_case(
        "port", "ib_link_error_recovery", base=0, need=5, window_s=3600
    ),
    # Slurm reasons. A specific reason on a drained/down node also opens the generic
    # foreign drain/down entry (both rules hold; the catalog has no precedence).
    "slurm-gres-gpu-count-low": slurm_case(
        DRAIN,
        "gres/gpu count reported lower than configured (7 < 8)",
        "gpufleet: repair r-12: gres/gpu count reported lower than configured (7 < 8)",
        fire_also=["slurm-foreign-drain"],
    ),
    "slurm-kill-task-failed": slurm_case(
        ("MIXED", "DRAIN"),
        "Kill task failed",
        "gpufleet: reboot r-7 after Kill task failed",
        fire_also=["slurm-foreign-drain"],
    ),
    "slurm-not-responding": slurm_case(
        ("DOWN", "NOT_RESPONDING"),
        "Not responding",
        "gpufleet: reboot r-3, not responding until it is back",
        fire_also=["slurm-foreign-down"],
    ),
    "slurm-unexpected-reboot": slurm_case(
        DOWN,
        "Node unexpectedly rebooted boot=1767225000 last response=1767224000",
        "gpufleet: reboot r-4: Node unexpectedly rebooted",
        fire_also=["slurm-foreign-down"],
    ),
    "slurm-foreign-drain": slurm_case(
        DRAIN, "NHC: check_gpu: GPU 3 has uncorrectable ECC errors", "gpufleet: repair r-1"
    ),
    "slurm-foreign-down": slurm_case(DOWN, "admin: PSU swap", "gpufleet: reboot r-2"),
    # The agent's daemon supervisor and its Slurm-vs-hardware GPU check.
    "slurmd-keeps-dying": state_case(
        flapping("slurmd", False), flapping("slurmd", True), flapping("slurmd", False), "slurmd"
    ),
    "munge-keeps-dying": state_case(
        flapping("munge", False), flapping("munge", True), flapping("munge", False), "munge"
    ),
    "slurm-gres-more-than-hardware": gres_case("count_high"),
    "slurm-gres-fewer-than-hardware": gres_case("count_low"),
    "slurm-gres-type-mismatch": gres_case("type"),
}


def _params() -> list[object]:
    return [
        pytest.param(
            sid,
            id=sid,
            marks=[pytest.mark.xfail(strict=True, reason=NO_DETECTOR_PATH[sid])]
            if sid in NO_DETECTOR_PATH
            else [],
        )
        for sid in RULE_IDS
    ]


def _case(sig_id: str) -> Case:
    case = CASES.get(sig_id)
    if case is None:
        pytest.fail(f"catalog rule entry {sig_id!r} has no fire/near-miss case in CASES")
    return case


def _opened(run: Run) -> list[tuple[int, FindingChange]]:
    return [(step, c) for step, c in run.changes if c.state is FindingState.OPEN]


# -- tests -------------------------------------------------------------------------------


def test_every_metric_and_state_entry_has_a_case() -> None:
    assert len(RULE_IDS) == len(set(RULE_IDS))
    assert not set(CASES) & set(NO_DETECTOR_PATH)
    assert set(CASES) | set(NO_DETECTOR_PATH) == set(RULE_IDS)


@pytest.mark.parametrize("sig_id", _params())
def test_rule_fires(sig_id: str) -> None:
    sig = CATALOG.get(sig_id)
    assert sig is not None
    case = _case(sig_id)
    run = Run()
    case.fire(run)
    opened = _opened(run)
    assert {c.signature_id for _, c in opened} == {sig_id} | case.fire_also
    mine = [(step, c) for step, c in opened if c.signature_id == sig_id]
    assert len(mine) == 1, mine
    step, finding = mine[0]
    assert run.fire_step is not None and step == run.fire_step, "opened at the wrong sample"
    assert finding.key == f"{sig_id}@{case.at}"
    assert finding.severity is sig.severity
    assert finding.source is sig.source
    assert finding.count == 1 and finding.evidence
    if case.at in PCI:
        i = PCI.index(case.at)
        assert (finding.gpu_index, finding.gpu_uuid, finding.pci_bus_id) == (i, UUID[i], PCI[i])
    elif case.at in PORT or case.at != NODE:  # an IB port, a daemon, a GRES check
        assert finding.component == case.at and finding.pci_bus_id is None
    else:
        assert (finding.gpu_uuid, finding.pci_bus_id, finding.component) == (None, None, None)
    assert not [c for _, c in run.changes if c.state is not FindingState.OPEN]
    assert [f.key for f in run.det.open_findings() if f.signature_id == sig_id] == [finding.key]


@pytest.mark.parametrize("sig_id", _params())
def test_rule_near_miss_does_not_fire(sig_id: str) -> None:
    case = _case(sig_id)
    run = Run()
    case.near_miss(run)
    assert {c.signature_id for _, c in _opened(run)} == set(case.miss_also)
    assert sig_id not in {c.signature_id for _, c in run.changes}
    assert sig_id not in {f.signature_id for f in run.det.open_findings()}
