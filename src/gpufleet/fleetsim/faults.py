"""The fault schedule: when, on which job slot, which cause, and the ground truth behind
it. Drawn once per seed and shared by every policy of a run (common random numbers), so
the policies are compared on the very same failures."""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpufleet.fleetsim.model import DAY, Cause, Fix, FleetConfig


@dataclass(frozen=True, slots=True)
class FaultDraw:
    at: float  # seconds from the start
    slot: int  # the job slot whose node fails (the node there at that moment)
    cause: Cause
    fix: Fix
    switch: bool  # the whole leaf switch behind the node, not the node
    gpu_index: int
    recur_s: float  # an unfixed fault shows again this long after the node is back
    verify_catches: bool  # re-acceptance would see it, were it still there


@dataclass(frozen=True, slots=True)
class Schedule:
    faults: tuple[FaultDraw, ...]
    planned: tuple[float, ...]  # planned interruptions (maintenance): restart cost only


def draw_schedule(config: FleetConfig, *, seed: int) -> Schedule:
    """The expected number of failures (``rate_per_gpu_day`` × the job's GPU-days,
    rounded: 419 for Llama 3's 16,384 GPUs × 54 days) at uniform random times, causes by
    count. A Poisson process given its count has uniform arrival times; fixing the count
    at the published one keeps the comparison with Llama 3 about the model, not about a
    lucky draw. Planned interruptions the same way."""
    rng = random.Random(seed)  # noqa: S311 - a model, not security
    horizon = config.days * DAY
    count = round(config.rate_per_gpu_day * config.gpus * config.days)
    weights = [c.count for c in config.causes]
    faults: list[FaultDraw] = []
    for t in sorted(rng.uniform(0.0, horizon) for _ in range(count)):
        cause = rng.choices(config.causes, weights=weights)[0]
        fixes, fix_weights = zip(*cause.fixes, strict=True)
        fix = rng.choices(fixes, weights=fix_weights)[0]
        switch = rng.random() < cause.topology_share
        faults.append(
            FaultDraw(
                at=t,
                slot=rng.randrange(config.job_nodes),
                cause=cause,
                fix=Fix.SWITCH if switch else fix,
                switch=switch,
                gpu_index=rng.randrange(8),
                recur_s=rng.expovariate(1.0 / config.pipeline.recur_mean_s),
                verify_catches=rng.random() < config.pipeline.verify_catch,
            )
        )
    planned = round(config.planned_per_day * config.days)
    times = tuple(sorted(rng.uniform(0.0, horizon) for _ in range(planned)))
    return Schedule(faults=tuple(faults), planned=times)
