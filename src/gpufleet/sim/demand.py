"""Demand traces: GPU jobs arriving over days, for the autoscaling benchmark (and the
demo's workload, later). Seeded, so a trace is the same on every run.

- ``bursty_inference``: daytime bursts of small jobs (1-2 GPUs, 10-40 min), a few an
  hour at night;
- ``training_queue``: a queue of large training jobs (2-8 nodes, 4-16 h) submitted over
  the first day, then fine-tuning runs now and then;
- ``nightly_batch``: every night at 01:00, a batch of whole-node jobs (1-2 h each).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    arrive_s: float  # seconds from the trace's start
    gpus: int
    duration_s: float


def bursty_inference(*, days: int = 3, seed: int = 1) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    for day in range(days):
        for hour in range(24):
            daytime = 8 <= hour < 20
            bursts = rng.randint(1, 3) if daytime else 0
            starts = [day * DAY + hour * HOUR + rng.uniform(0, HOUR) for _ in range(bursts)]
            for start in starts:
                for _ in range(rng.randint(10, 40)):
                    jobs.append(
                        TraceJob(
                            id=f"inf-{len(jobs)}",
                            arrive_s=start + rng.uniform(0, 300),
                            gpus=rng.choice((1, 1, 2)),
                            duration_s=rng.uniform(10, 40) * 60,
                        )
                    )
            for _ in range(rng.randint(0, 3)):
                jobs.append(
                    TraceJob(
                        id=f"inf-{len(jobs)}",
                        arrive_s=day * DAY + hour * HOUR + rng.uniform(0, HOUR),
                        gpus=1,
                        duration_s=rng.uniform(10, 30) * 60,
                    )
                )
    return sorted(jobs, key=lambda j: j.arrive_s)


def training_queue(*, days: int = 3, seed: int = 2, gpus_per_node: int = 8) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    for _ in range(12):
        jobs.append(
            TraceJob(
                id=f"train-{len(jobs)}",
                arrive_s=rng.uniform(0, DAY),
                gpus=gpus_per_node * rng.choice((2, 4, 4, 8)),
                duration_s=rng.uniform(4, 16) * HOUR,
            )
        )
    for _ in range(days * 6):
        jobs.append(
            TraceJob(
                id=f"tune-{len(jobs)}",
                arrive_s=rng.uniform(0, days * DAY),
                gpus=gpus_per_node * rng.choice((1, 1, 2)),
                duration_s=rng.uniform(1, 4) * HOUR,
            )
        )
    return sorted(jobs, key=lambda j: j.arrive_s)


def nightly_batch(*, days: int = 3, seed: int = 3, gpus_per_node: int = 8) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    for day in range(days):
        start = day * DAY + HOUR  # 01:00
        for _ in range(rng.randint(30, 50)):
            jobs.append(
                TraceJob(
                    id=f"batch-{len(jobs)}",
                    arrive_s=start + rng.uniform(0, 600),
                    gpus=gpus_per_node,
                    duration_s=rng.uniform(1, 2) * HOUR,
                )
            )
    return sorted(jobs, key=lambda j: j.arrive_s)


TRACES = {
    "bursty-inference": bursty_inference,
    "training-queue": training_queue,
    "nightly-batch": nightly_batch,
}
