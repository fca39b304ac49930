"""What a running job asks of its GPUs and of its node's fabric. Pure.

A job's name says what kind of work it is (``pretrain`` and ``train-3`` train, ``inf-12``
serves, ``eval`` evaluates...), and each kind has a load profile: where utilisation sits,
whether it comes in bursts, how much GPU memory the job holds and how much InfiniBand
traffic it moves when it spans nodes. The job's own level inside its profile is drawn
from its id, so every GPU of one job sits at the same level (data-parallel ranks run in
lockstep), the same on every run, and no random stream is spent on it.

The telemetry model (``telemetry.py``) turns a ``GpuLoad`` into readings, the fabric
model (``fabric.py``) turns a node's ``ib_gbps`` into port counters. ``node_load`` is
the one place that decides which GPUs of a node a job uses: jobs take whole nodes, and a
job that asked for fewer GPUs than its nodes have uses the first ones of each node (as
``CUDA_VISIBLE_DEVICES=0,1`` would), the rest of the node idles.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class LoadProfile:
    """One kind of work. Utilisation in %, memory as a share of the GPU's, traffic in
    Gb/s per InfiniBand port and direction."""

    kind: str
    util_band: tuple[float, float]  # where readings stay, noise included
    util_level: tuple[float, float]  # where one job's level is drawn
    burst_s: float | None  # None: steady; else the mean time between load changes
    memory_share: tuple[float, float]
    multi_node_gbps: tuple[float, float]  # gradients / activations between nodes
    single_node_gbps: tuple[float, float]  # a job on one node: data and checkpoints only


TRAINING = LoadProfile(
    kind="training",
    util_band=(85.0, 100.0),
    util_level=(89.0, 97.0),
    burst_s=None,
    memory_share=(0.80, 0.95),
    # NCCL all-reduce on NDR (400 Gb/s) rails averages well under line rate over a step.
    multi_node_gbps=(120.0, 260.0),
    single_node_gbps=(0.2, 1.0),
)
FINE_TUNING = LoadProfile(
    kind="fine-tuning",
    util_band=(75.0, 99.0),
    util_level=(80.0, 95.0),
    burst_s=None,
    memory_share=(0.60, 0.90),
    multi_node_gbps=(60.0, 160.0),
    single_node_gbps=(0.2, 1.0),
)
INFERENCE = LoadProfile(
    kind="inference",
    util_band=(30.0, 90.0),
    util_level=(40.0, 80.0),
    burst_s=20.0,  # request bursts: the level jumps within the band every ~20 s
    memory_share=(0.40, 0.75),  # weights plus a KV cache
    multi_node_gbps=(2.0, 20.0),
    single_node_gbps=(0.05, 0.3),
)
EVALUATION = LoadProfile(
    kind="evaluation",
    util_band=(50.0, 90.0),
    util_level=(55.0, 85.0),
    burst_s=60.0,
    memory_share=(0.35, 0.70),
    multi_node_gbps=(5.0, 30.0),
    single_node_gbps=(0.05, 0.3),
)
BATCH = LoadProfile(
    kind="batch",
    util_band=(65.0, 99.0),
    util_level=(70.0, 95.0),
    burst_s=None,
    memory_share=(0.30, 0.70),
    multi_node_gbps=(10.0, 60.0),
    single_node_gbps=(0.1, 0.5),
)

# Words of a job name, first match wins; a name with none of them trains (the synthetic
# users' pretrain, vit-train, asr-train; the training trace's train-N).
_KIND_WORDS: tuple[tuple[frozenset[str], LoadProfile], ...] = (
    (frozenset({"inf", "infer", "inference", "serve", "serving", "vllm", "triton"}), INFERENCE),
    (frozenset({"eval", "evaluation", "bench", "benchmark"}), EVALUATION),
    (frozenset({"sft", "dpo", "tune", "finetune", "lora", "rlhf"}), FINE_TUNING),
    (frozenset({"sweep", "batch", "hpo", "preprocess"}), BATCH),
)
_WORD = re.compile(r"[a-z]+")


def profile_for(name: str) -> LoadProfile:
    """The load profile of a job called ``name``."""
    words = set(_WORD.findall(name.lower()))
    for keys, profile in _KIND_WORDS:
        if words & keys:
            return profile
    return TRAINING


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """The job on one GPU: its profile, its own level in that profile, the memory it
    holds. The same for every GPU of the job."""

    job_id: str
    profile: LoadProfile
    level_pct: float
    memory_share: float


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """What runs on one node now: the load of each busy GPU (by index; a GPU not listed
    idles) and the InfiniBand traffic its jobs move, Gb/s per port and direction."""

    gpus: Mapping[int, GpuLoad] = field(default_factory=lambda: MappingProxyType({}))
    ib_gbps: float = 0.0

    @property
    def busy(self) -> bool:
        return bool(self.gpus)


IDLE = NodeLoad()


@dataclass(frozen=True, slots=True)
class JobShape:
    """The facts about one running job that its load follows."""

    job_id: str
    name: str
    node_count: int
    gpus: int | None  # GPUs it asked for; None: every GPU of its nodes


# Cached: the world asks for every running job's load at each pass of its agents.
@functools.lru_cache(maxsize=4096)
def job_load(job_id: str, profile: LoadProfile) -> GpuLoad:
    """The job's level and memory, drawn from its id: stable for the job's whole run."""
    rng = random.Random(f"gpufleet-sim-load:{job_id}")
    return GpuLoad(
        job_id=job_id,
        profile=profile,
        level_pct=rng.uniform(*profile.util_level),
        memory_share=rng.uniform(*profile.memory_share),
    )


@functools.lru_cache(maxsize=4096)
def job_gbps(job_id: str, profile: LoadProfile, *, multi_node: bool) -> float:
    """The job's traffic per port and direction on a node it uses every GPU of."""
    rng = random.Random(f"gpufleet-sim-fabric:{job_id}")
    return rng.uniform(*(profile.multi_node_gbps if multi_node else profile.single_node_gbps))


def gpus_used(job: JobShape, *, position: int, gpu_count: int) -> int:
    """How many GPUs of its ``position``-th node (0-based) the job uses: all of them,
    unless it asked for fewer than its nodes have; then it fills its nodes in order."""
    if job.gpus is None:
        return gpu_count
    return max(0, min(gpu_count, job.gpus - position * gpu_count))


def node_load(job: JobShape, *, position: int, gpu_count: int) -> NodeLoad:
    """The load ``job`` puts on its ``position``-th node, a node of ``gpu_count`` GPUs."""
    used = gpus_used(job, position=position, gpu_count=gpu_count)
    if used == 0:
        return IDLE
    profile = profile_for(job.name)
    load = job_load(job.job_id, profile)
    # One rail per GPU: a node whose GPUs are half used moves half the traffic.
    share = used / gpu_count
    gbps = job_gbps(job.job_id, profile, multi_node=job.node_count > 1) * share
    return NodeLoad(gpus=MappingProxyType(dict.fromkeys(range(used), load)), ib_gbps=gbps)
