"""Autoscaling: GPU-hours paid and time pending, gpufleet's policy against static-max and
static-min, on demand traces replayed in simulated time.

    .venv/bin/python bench/autoscale.py                      # two traces, 3 days each
    .venv/bin/python bench/autoscale.py --trace nightly-batch --days 5 --max-nodes 48

The policy is ``gpufleet.core.autoscale.decide``, the code the product runs; the rest is
a model, stated here so the figures can be judged:

- nodes of ``--gpus-per-node`` GPUs; a node asked for is paid from the ask, boots for
  ``--provision-min`` and runs acceptance for ``--acceptance-min`` before it takes work;
- the scheduler, each simulated minute, places pending jobs in arrival order with
  backfill (Slurm's default): a job of more than one node's GPUs takes whole free nodes,
  a smaller one any node with room; one that does not fit does not block those behind it;
- the autoscaler looks every ``--interval-s``; a node it removes is idle, so it goes at
  once; the simulation runs a day past the trace so queued work can finish.

Baselines in the same run: **static-max** (``--max-nodes`` nodes from the start) and
**static-min** (``--min-nodes``). Printed per trace and policy: GPU-hours paid and used,
utilization, jobs finished, pending time p50/p95 (minutes; a job never started counts
from its arrival to the end), peak nodes, steps up and down. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import time
from dataclasses import dataclass, field

from gpufleet.core.autoscale import (
    AutoscalePolicy,
    Decision,
    NodePhase,
    NodeView,
    PendingWork,
    ScaleState,
    decide,
)
from gpufleet.sim.demand import DAY, TRACES, TraceJob

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
STEP_S = 60.0


@dataclass
class Node:
    name: str
    asked_s: float
    ready_s: float
    free: int
    idle_since_s: float
    jobs: set[str] = field(default_factory=set)


@dataclass
class Outcome:
    policy: str
    paid_gpu_h: float = 0.0
    used_gpu_h: float = 0.0
    finished: int = 0
    total: int = 0
    waits_min: list[float] = field(default_factory=list)
    peak_nodes: int = 0
    ups: int = 0
    downs: int = 0


class Cluster:
    def __init__(self, *, gpus_per_node: int, boot_s: float) -> None:
        self.gpus_per_node = gpus_per_node
        self.boot_s = boot_s
        self.nodes: dict[str, Node] = {}
        self.counter = 0

    def add(self, now: float, *, ready: bool = False) -> None:
        self.counter += 1
        name = f"gpu-{self.counter:04d}"
        ready_s = now if ready else now + self.boot_s
        self.nodes[name] = Node(name, now, ready_s, self.gpus_per_node, ready_s)

    def ready(self, now: float) -> list[Node]:
        return [n for n in self.nodes.values() if n.ready_s <= now]

    def place(self, job: TraceJob, now: float) -> list[tuple[Node, int]] | None:
        """Where the job starts now, or None."""
        ready = self.ready(now)
        if job.gpus > self.gpus_per_node:
            want = math.ceil(job.gpus / self.gpus_per_node)
            empty = [n for n in ready if n.free == self.gpus_per_node]
            if len(empty) < want:
                return None
            return [(n, self.gpus_per_node) for n in empty[:want]]
        # Best fit: the fullest node with room keeps whole nodes free for big jobs.
        room = sorted((n for n in ready if n.free >= job.gpus), key=lambda n: (n.free, n.name))
        return [(room[0], job.gpus)] if room else None


def replay(
    trace: list[TraceJob],
    *,
    label: str,
    policy: AutoscalePolicy | None,
    static: int,
    args: argparse.Namespace,
) -> Outcome:
    gpn = args.gpus_per_node
    cluster = Cluster(gpus_per_node=gpn, boot_s=(args.provision_min + args.acceptance_min) * 60)
    for _ in range(static):
        cluster.add(0.0, ready=True)
    out = Outcome(policy=label, total=len(trace))
    end_s = max(j.arrive_s for j in trace) + DAY
    queue: list[TraceJob] = []
    running: dict[str, tuple[TraceJob, float, list[tuple[Node, int]]]] = {}
    arrivals = iter(trace)
    upcoming = next(arrivals, None)
    last_up: dt.datetime | None = None
    last_down: dt.datetime | None = None
    next_look = 0.0
    now = 0.0
    while now <= end_s:
        while upcoming is not None and upcoming.arrive_s <= now:
            queue.append(upcoming)
            upcoming = next(arrivals, None)
        for job_id, (job, started, where) in list(running.items()):
            if started + job.duration_s <= now:
                for node, gpus in where:
                    node.free += gpus
                    node.jobs.discard(job_id)
                    if not node.jobs:
                        node.idle_since_s = now
                del running[job_id]
                out.finished += 1
        waiting: list[TraceJob] = []
        for job in queue:
            where = cluster.place(job, now)
            if where is None:
                waiting.append(job)
                continue
            for node, gpus in where:
                node.free -= gpus
                node.jobs.add(job.id)
            running[job.id] = (job, now, where)
            out.waits_min.append((now - job.arrive_s) / 60)
        queue = waiting
        if policy is not None and now >= next_look:
            next_look = now + args.interval_s
            clock = EPOCH + dt.timedelta(seconds=now)
            state = ScaleState(
                nodes=[
                    NodeView(
                        name=n.name,
                        phase=NodePhase.IN_SERVICE if n.ready_s <= now else NodePhase.COMING,
                        busy=bool(n.jobs),
                        idle_since=EPOCH + dt.timedelta(seconds=n.idle_since_s),
                    )
                    for n in cluster.nodes.values()
                ],
                pending=[
                    PendingWork(j.id, j.gpus, EPOCH + dt.timedelta(seconds=j.arrive_s))
                    for j in queue
                ],
                gpus_per_node=gpn,
                now=clock,
                last_up_at=last_up,
                last_down_at=last_down,
            )
            decision: Decision = decide(policy, state)
            for _ in range(decision.add):
                cluster.add(now)
            if decision.add:
                out.ups += 1
                last_up = clock
            for name in decision.remove:
                del cluster.nodes[name]
            if decision.remove:
                out.downs += 1
                last_down = clock
        out.peak_nodes = max(out.peak_nodes, len(cluster.nodes))
        out.paid_gpu_h += len(cluster.nodes) * gpn * STEP_S / 3600
        out.used_gpu_h += sum(gpn - n.free for n in cluster.nodes.values()) * STEP_S / 3600
        now += STEP_S
    out.waits_min += [(end_s - j.arrive_s) / 60 for j in queue]  # never started
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="append", choices=sorted(TRACES))
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--min-nodes", type=int, default=2)
    parser.add_argument("--max-nodes", type=int, default=32)
    parser.add_argument("--provision-min", type=float, default=5.0)
    parser.add_argument("--acceptance-min", type=float, default=10.0)
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--scale-up-after-s", type=float, default=120.0)
    parser.add_argument("--scale-down-after-s", type=float, default=1800.0)
    parser.add_argument("--max-step", type=int, default=8)
    args = parser.parse_args()
    policy = AutoscalePolicy(
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        scale_up_after_s=args.scale_up_after_s,
        scale_down_after_s=args.scale_down_after_s,
        max_step=args.max_step,
    )
    print(
        f"{args.gpus_per_node} GPUs a node; nodes {args.min_nodes}..{args.max_nodes}; a new node "
        f"takes {args.provision_min:.0f} min to boot + {args.acceptance_min:.0f} min of "
        f"acceptance; policy: up after {args.scale_up_after_s:.0f} s pending, down after "
        f"{args.scale_down_after_s:.0f} s idle, at most {args.max_step} a step"
    )
    header = (
        f"{'trace':<17} {'policy':<11} {'GPU-h paid':>10} {'GPU-h used':>10} {'util':>5} "
        f"{'done':>9} {'p50 wait':>9} {'p95 wait':>9} {'peak':>5} {'up/down':>8} {'wall':>6}"
    )
    print(header)
    print("-" * len(header))
    for name in args.trace or ["bursty-inference", "training-queue"]:
        trace = TRACES[name](days=args.days)
        runs = (
            ("gpufleet", policy, args.min_nodes),
            ("static-max", None, args.max_nodes),
            ("static-min", None, args.min_nodes),
        )
        for label, chosen, static in runs:
            started = time.perf_counter()
            out = replay(trace, label=label, policy=chosen, static=static, args=args)
            wall = time.perf_counter() - started
            util = out.used_gpu_h / out.paid_gpu_h if out.paid_gpu_h else 0.0
            print(
                f"{name:<17} {label:<11} {out.paid_gpu_h:>10,.0f} {out.used_gpu_h:>10,.0f} "
                f"{util:>5.0%} {out.finished:>4}/{out.total:<4} "
                f"{statistics.median(out.waits_min) if out.waits_min else 0:>7.1f} m "
                f"{_pct(out.waits_min, 0.95):>7.1f} m {out.peak_nodes:>5} "
                f"{out.ups:>3}/{out.downs:<4} {wall:>5.1f}s"
            )


if __name__ == "__main__":
    main()
