"""Effective training time of a 16,384-GPU synchronous job over 54 days, per repair policy.

    python bench/fleet_sim.py [--gpus 16384] [--days 54] [--seed 1]
                              [--job both|megascale-class|every-step-ckpt]
                              [--approval-min 60] [--spare-share 0.02]

A discrete-event simulation (``gpufleet.fleetsim``): failures arrive at the Llama 3 rate
(419 unexpected interruptions per 16,384 GPUs × 54 days) with its Table 5 mix by cause,
plus its 47 planned interruptions; the same failures (one seed) go through every policy:

- manual: people notice, find the bad node (1 h), restart the job and fix the node;
- job-auto: the training framework excludes the host its error names and restarts on a
  hot spare (what Llama 3 had); people fix the nodes;
- gpufleet: job-auto plus gpufleet's findings and the real repair policy
  (``core.repair.plan``, the breaker) with a person approving every repair, or with the
  GPU Xids' first actions auto-approved; with and without topology incidents.

Printed per job profile: the table, GPU-hours lost by cause, and the wall time. Every
parameter and its source: docs/reliability.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_lines
from gpufleet.fleetsim.faults import draw_schedule
from gpufleet.fleetsim.model import (
    DEFAULT_POLICIES,
    MEGASCALE_JOB,
    STATE_OF_ART_JOB,
    FleetConfig,
    JobProfile,
    Pipeline,
)
from gpufleet.fleetsim.report import compare, format_losses, format_table

JOBS: dict[str, JobProfile] = {j.name: j for j in (MEGASCALE_JOB, STATE_OF_ART_JOB)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--job", choices=["both", *JOBS], default="both")
    parser.add_argument("--approval-min", type=float, default=60.0)
    parser.add_argument("--spare-share", type=float, default=0.02)
    args = parser.parse_args()
    started = time.perf_counter()
    for line in machine_lines():
        print(line)
    jobs = list(JOBS.values()) if args.job == "both" else [JOBS[args.job]]
    for job in jobs:
        config = FleetConfig(
            gpus=args.gpus,
            days=args.days,
            spare_share=args.spare_share,
            job=job,
            pipeline=Pipeline(approval_s=args.approval_min * 60.0),
        )
        print()
        print(
            f"== job {job.name}: checkpoint every {job.checkpoint_s / 60:g} min, restart "
            f"{job.restart_s / 60:g} min; {config.gpus:,} GPUs ({config.job_nodes:,} nodes + "
            f"{config.spares} hot spares), {config.days:g} days, seed {args.seed}; "
            f"approval mean {args.approval_min:g} min"
        )
        t0 = time.perf_counter()
        schedule = draw_schedule(config, seed=args.seed)
        switch = sum(1 for f in schedule.faults if f.switch)
        print(
            f"failures drawn: {len(schedule.faults)} unexpected ({switch} of a whole leaf "
            f"switch), {len(schedule.planned)} planned"
        )
        results = compare(config, DEFAULT_POLICIES, seed=args.seed)
        print(format_table(results))
        print()
        print("GPU-hours lost by cause (columns: the rows above, in order)")
        print(format_losses(results))
        print(f"({time.perf_counter() - t0:.1f} s)")
    print()
    print(f"wall time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
