"""The fleet simulator's inputs: the failure mix by cause, the pipeline's delays and the
training job. Pure data; every default names its source or says it is an assumption
(docs/reliability.md has the full table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.core.enums import RepairAction
from gpufleet.core.repair.models import AutoApproveRule

HOUR = 3600.0
DAY = 86400.0
GPUS_PER_NODE = 8


class JobEffect(StrEnum):
    CRASH = "crash"  # the job's processes exit: the job notices at once
    HANG = "hang"  # a collective stalls: the job notices at its watchdog timeout


class Fix(StrEnum):
    """What really makes the node good again (the simulator's ground truth)."""

    NONE = "none"  # not a node fault (a software bug): restarting the job is enough
    SELF = "self"  # goes away by itself (host maintenance ends)
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REPROVISION = "reprovision"
    HARDWARE = "hardware"  # a part or the host must change: failover or remove
    CABLE = "cable"  # a person reseats or swaps an optic or cable
    SWITCH = "switch"  # the leaf switch all nodes behind it share


# The node actions that cure each Fix (anything at least this drastic, short of hardware).
FIX_RANK: dict[Fix, RepairAction] = {
    Fix.RESET_GPU: RepairAction.RESET_GPU,
    Fix.REBOOT: RepairAction.REBOOT,
    Fix.REPROVISION: RepairAction.REPROVISION,
    Fix.HARDWARE: RepairAction.FAILOVER,
}


@dataclass(frozen=True, slots=True)
class Cause:
    """One row (or part of a row) of the Llama 3 Table 5 mix.

    ``signature_id``: what gpufleet's agent raises for it (None: no passive check sees
    it). ``fixes``: (ground-truth fix, weight) pairs. ``identifiable``: whether the job's
    own error names the host (an Xid in the log, the NCCL flight recorder), so a job
    framework can exclude it without a person."""

    name: str
    count: float
    signature_id: str | None
    effect: JobEffect
    fixes: tuple[tuple[Fix, float], ...]
    identifiable: bool = True
    source: str = "kernel-log"  # how gpufleet would see it: picks the detection delay
    topology_share: float = 0.0  # share of these that take out a whole leaf switch


# Llama 3 405B, 54 days, 16,384 H100: Table 5 counts (arXiv:2407.21783 §3.3.4), sampled by
# count (they sum to 419; the printed percentages do not). Signature ids follow
# gpufleet.sim.faults.LLAMA3_MIX where that maps a row; the fixes are assumptions
# (docs/reliability.md "Ground truth").
_GPU_SOFT = ((Fix.RESET_GPU, 0.6), (Fix.REBOOT, 0.2), (Fix.HARDWARE, 0.2))
LLAMA3_CAUSES: tuple[Cause, ...] = (
    Cause("Faulty GPU (off the bus)", 88, "xid-79", JobEffect.HANG,
          ((Fix.REBOOT, 0.5), (Fix.HARDWARE, 0.5))),
    Cause("Faulty GPU (GSP timeout)", 60, "xid-119", JobEffect.CRASH, _GPU_SOFT),
    Cause("GPU HBM3 Memory (DBE)", 36, "xid-48", JobEffect.CRASH,
          ((Fix.RESET_GPU, 0.8), (Fix.HARDWARE, 0.2))),
    Cause("GPU HBM3 Memory (contained)", 18, "xid-94", JobEffect.CRASH, ((Fix.NONE, 1.0),)),
    Cause("GPU HBM3 Memory (remap failed)", 18, "row-remap-failure", JobEffect.CRASH,
          ((Fix.HARDWARE, 1.0),), source="nvml"),
    Cause("Software Bug", 54, "xid-31", JobEffect.CRASH, ((Fix.NONE, 1.0),)),
    Cause("Network Switch/Cable", 35, "ib-link-down", JobEffect.HANG, ((Fix.CABLE, 1.0),),
          source="infiniband", topology_share=0.03),
    Cause("Host Maintenance", 32, "slurm-not-responding", JobEffect.CRASH, ((Fix.SELF, 1.0),),
          source="scheduler"),
    Cause("GPU SRAM Memory", 19, "xid-95", JobEffect.CRASH,
          ((Fix.RESET_GPU, 0.7), (Fix.HARDWARE, 0.3))),
    Cause("GPU System Processor", 17, "xid-120", JobEffect.CRASH, _GPU_SOFT),
    Cause("NIC", 7, "ib-link-down", JobEffect.HANG, ((Fix.HARDWARE, 1.0),),
          source="infiniband"),
    Cause("NCCL Watchdog Timeouts", 7, None, JobEffect.HANG, ((Fix.NONE, 1.0),),
          identifiable=False),
    Cause("Silent Data Corruption", 6, None, JobEffect.CRASH, ((Fix.HARDWARE, 1.0),),
          identifiable=False),
    Cause("GPU Thermal Interface + Sensor", 6, "thermal-slowdown", JobEffect.CRASH,
          ((Fix.HARDWARE, 1.0),), source="nvml"),
    Cause("SSD", 3, None, JobEffect.CRASH, ((Fix.HARDWARE, 1.0),)),
    Cause("Power Supply", 3, "slurm-not-responding", JobEffect.HANG, ((Fix.HARDWARE, 1.0),),
          source="scheduler"),
    Cause("Server Chassis", 2, "slurm-not-responding", JobEffect.HANG, ((Fix.HARDWARE, 1.0),),
          source="scheduler"),
    Cause("IO Expansion Board", 2, "pcie-aer-uncorrected", JobEffect.CRASH,
          ((Fix.HARDWARE, 1.0),)),
    Cause("Dependency", 2, None, JobEffect.CRASH, ((Fix.NONE, 1.0),)),
    Cause("CPU", 2, None, JobEffect.CRASH, ((Fix.HARDWARE, 1.0),)),
    Cause("System Memory", 2, None, JobEffect.CRASH, ((Fix.HARDWARE, 1.0),)),
)  # fmt: skip
LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPU_DAYS = 16_384 * 54
# Planned interruptions: 47 in the same 54 days (firmware, kernel, config updates).
LLAMA3_PLANNED_PER_DAY = 47 / 54


@dataclass(frozen=True, slots=True)
class JobProfile:
    """The synchronous training job: how much a restart costs it."""

    name: str
    checkpoint_s: float  # a checkpoint every this much training time; a crash loses the rest
    restart_s: float  # from "may restart" to training again (reload, NCCL init, warm-up)
    crash_notice_s: float = 60.0  # a crashed rank → the launcher tears the job down
    watchdog_s: float = 600.0  # NCCL watchdog: PyTorch's default 10 min collective timeout


# MegaScale (NSDI'24 §6.3): "catch up to the training progress prior to the crash within
# 15 minutes from the latest checkpoints": restart 5 min (RSC's u0 ≈ 5–20 min, low end)
# + half of a 20 min checkpoint interval = 15 min.
MEGASCALE_JOB = JobProfile("megascale-class", checkpoint_s=20 * 60.0, restart_s=5 * 60.0)
# ByteRobust (SOSP'25): every-step checkpoints (<0.9% overhead), warm standbys; HyperPod
# checkpointless / Google elastic training: recovery "under 2 minutes".
STATE_OF_ART_JOB = JobProfile("every-step-ckpt", checkpoint_s=60.0, restart_s=120.0)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Delays and durations of detection, people and repair actions, seconds."""

    # gpufleet detection, fault → finding, by the finding's source.
    detect_s: dict[str, float] = field(
        default_factory=lambda: {
            "kernel-log": 5.0,  # the agent follows kmsg and sends a finding at once
            "nvml": 30.0,  # NVML sampled every 10–30 s (dcgm-exporter default 30 s)
            "infiniband": 30.0,  # port counters on the same cadence
            "scheduler": 120.0,  # SlurmdTimeout ≥ 120 s on large clusters (SchedMD)
            "active-check": 600.0,  # MegaScale: detection + diagnostic tests < 10 min
        }
    )
    approval_s: float = HOUR  # a person approves a proposal (assumption; exponential mean)
    triage_s: float = HOUR  # a person finds the bad node by hand (HyperPod blog: "up to an hour")
    human_fix_s: dict[Fix, float] = field(
        default_factory=lambda: {
            Fix.RESET_GPU: 4 * HOUR,  # a person's turnaround for a soft fix (assumption)
            Fix.REBOOT: 4 * HOUR,
            Fix.REPROVISION: 4 * HOUR,
            Fix.HARDWARE: 3 * DAY,  # part swap / RMA (assumption)
            Fix.CABLE: 4 * HOUR,
            Fix.SWITCH: 8 * HOUR,
            Fix.SELF: 0.5 * HOUR,  # how long unplanned host maintenance lasts (assumption)
            Fix.NONE: 0.0,
        }
    )
    action_s: dict[RepairAction, float] = field(
        default_factory=lambda: {
            RepairAction.RESET_GPU: 5 * 60.0,
            RepairAction.REBOOT: 15 * 60.0,  # bare-metal HGX boot incl. POST (assumption)
            RepairAction.REPROVISION: 45 * 60.0,
            RepairAction.FAILOVER: HOUR,  # a healthy host from the provider (assumption)
            RepairAction.REMOVE: 60.0,  # out of the cluster; back after hardware service
        }
    )
    drain_s: float = 60.0  # the node's job is already gone (it failed); cordon + drain
    verify_s: float = 15 * 60.0  # re-acceptance: DCGM diag level 3 (bench/acceptance.py)
    recur_mean_s: float = 2 * HOUR  # an unfixed fault shows again (exponential mean)
    verify_catch: float = 0.5  # re-acceptance sees a fault the action did not fix
    switch_swap_s: float = 2 * HOUR  # a named switch swapped, once people know which

    def detect(self, source: str) -> float:
        return self.detect_s.get(source, self.detect_s["kernel-log"])


class Mode(StrEnum):
    MANUAL = "manual"  # people find the bad node, restart the job, fix the node
    JOB_AUTO = "job-auto"  # the job framework excludes the host its error names
    GPUFLEET = "gpufleet"  # job framework + gpufleet's findings and repairs


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    mode: Mode
    auto_approve: tuple[AutoApproveRule, ...] = ()
    incidents: bool = True


# Auto-approved by the "auto" rows: the catalog's first, least drastic action for the
# GPU Xids above. Anything escalated (remove, failover) still waits for a person.
AUTO_RULES: tuple[AutoApproveRule, ...] = (
    AutoApproveRule("xid-79", RepairAction.REBOOT),
    AutoApproveRule("xid-119", RepairAction.RESET_GPU),
    AutoApproveRule("xid-119", RepairAction.REBOOT),
    AutoApproveRule("xid-120", RepairAction.RESET_GPU),
    AutoApproveRule("xid-120", RepairAction.REBOOT),
    AutoApproveRule("xid-48", RepairAction.RESET_GPU),
    AutoApproveRule("xid-95", RepairAction.RESET_GPU),
    AutoApproveRule("xid-95", RepairAction.REBOOT),
    AutoApproveRule("pcie-aer-uncorrected", RepairAction.REBOOT),
)

DEFAULT_POLICIES: tuple[PolicySpec, ...] = (
    PolicySpec("manual", Mode.MANUAL),
    PolicySpec("job-auto (Llama 3-like)", Mode.JOB_AUTO),
    PolicySpec("gpufleet approve", Mode.GPUFLEET),
    PolicySpec("gpufleet approve, no incidents", Mode.GPUFLEET, incidents=False),
    PolicySpec("gpufleet auto", Mode.GPUFLEET, auto_approve=AUTO_RULES),
    PolicySpec("gpufleet auto, no incidents", Mode.GPUFLEET, AUTO_RULES, incidents=False),
)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    gpus: int = 16_384
    days: float = 54.0
    spare_share: float = 0.02  # hot spares, share of the job's nodes (assumption)
    leaf_nodes: int = 16  # nodes behind one leaf switch (assumption)
    rate_per_gpu_day: float = LLAMA3_INTERRUPTIONS / LLAMA3_GPU_DAYS
    planned_per_day: float = LLAMA3_PLANNED_PER_DAY
    causes: tuple[Cause, ...] = LLAMA3_CAUSES
    job: JobProfile = MEGASCALE_JOB
    pipeline: Pipeline = field(default_factory=Pipeline)

    @property
    def job_nodes(self) -> int:
        return math.ceil(self.gpus / GPUS_PER_NODE)

    @property
    def spares(self) -> int:
        return math.ceil(self.job_nodes * self.spare_share)
