"""The simulated workload manager: node flags, a job queue, running jobs, accounting.

Not thread-safe on its own: ``SimWorld`` holds its lock around every call. Jobs take whole
nodes (like an exclusive Slurm partition), so a node is either idle or busy.

Work comes from three places: synthetic users who keep a share of each cluster's nodes
busy (``WorkloadConfig.busy_share``; off per cluster with ``set_synthetic``), jobs
submitted by hand (``queue``), and demand traces fed in (``add_feed``), whose jobs are
queued as the clock passes their arrival.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.core.autoscale import PendingWork
from gpufleet.sim.records import DemandFeed, JobRecord, NodeFlags

NodeKey = tuple[str, str]  # (cluster_id, node_name)

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
ACCOUNTS = ("llm-pretrain", "llm-finetune", "vision", "speech", "rl-research")
JOB_NAMES = ("pretrain", "sft", "eval", "dpo", "vit-train", "asr-train", "sweep")
NODE_FAIL = "NODE_FAIL"  # killed by its node going away (down, reboot, reset, terminate)
REQUEUED = "REQUEUED"  # stopped by a requeue; the job itself went back to the queue


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """How busy the simulated users keep a cluster."""

    busy_share: tuple[float, float] = (0.6, 0.8)  # share of schedulable nodes kept busy
    job_minutes: tuple[float, float] = (5.0, 60.0)
    max_job_nodes: int = 4
    failed_job_share: float = 0.05  # jobs that end with a non-zero exit code
    time_scale: float = 1.0  # multiplies job durations; <1 makes the demo churn faster
    accounting_limit: int = 10_000


class Workload:
    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self.flags: dict[NodeKey, NodeFlags] = {}
        self.running: dict[str, JobRecord] = {}
        self.queued: list[JobRecord] = []
        self.accounting: deque[JobRecord] = deque(maxlen=config.accounting_limit)
        self.busy: dict[NodeKey, str] = {}
        self.targets: dict[str, float] = {}
        self.synthetic_off: set[str] = set()  # clusters that get no synthetic jobs
        self.feeds: dict[int, DemandFeed] = {}  # traces with jobs yet to arrive
        self.next_job_id = 1000
        # Records changed since the owner last saved, as journal entries (see store.py).
        self.changes: list[dict[str, Any]] = []

    # -- jobs -------------------------------------------------------------------------

    def new_job(
        self,
        *,
        cluster_id: str,
        node_count: int,
        gpus_per_node: int,
        duration_s: float,
        now: dt.datetime,
        rng: random.Random,
        name: str | None = None,
        gpus: int | None = None,
    ) -> JobRecord:
        self.next_job_id += 1
        return JobRecord(
            job_id=str(self.next_job_id),
            name=rng.choice(JOB_NAMES) if name is None else name,
            user=rng.choice(USERS),
            account=rng.choice(ACCOUNTS),
            cluster_id=cluster_id,
            node_count=node_count,
            gpus_per_node=gpus_per_node,
            submitted_at=now,
            duration_s=duration_s,
            gpus=_partial(gpus, node_count * gpus_per_node),
        )

    def start(self, job: JobRecord, nodes: list[str], now: dt.datetime) -> None:
        job.state = "RUNNING"
        job.nodes = nodes
        job.started_at = now
        job.end_at = now + dt.timedelta(seconds=job.duration_s)
        self.running[job.job_id] = job
        for name in nodes:
            self.busy[(job.cluster_id, name)] = job.job_id
        self.changes.append({"r": job.to_json()})

    def end(self, job: JobRecord, *, state: str, exit_code: int, at: dt.datetime) -> None:
        self.running.pop(job.job_id, None)
        for name in job.nodes:
            if self.busy.get((job.cluster_id, name)) == job.job_id:
                del self.busy[(job.cluster_id, name)]
        job.state = state
        job.exit_code = exit_code
        job.ended_at = at
        self.accounting.append(job)
        self.changes.append({"e": job.to_json()})

    def kill_on(self, key: NodeKey, now: dt.datetime) -> bool:
        """End the job on ``key`` (all of its nodes) as NODE_FAIL; True if there was one."""
        job_id = self.busy.get(key)
        if job_id is None:
            return False
        job = self.running.get(job_id)
        if job is None:
            del self.busy[key]
            return True
        self.end(job, state=NODE_FAIL, exit_code=1, at=now)
        return True

    def requeue(self, job: JobRecord, now: dt.datetime) -> None:
        """Stop a running job on all its nodes and put it back at the head of the queue
        under the same id (Slurm ``scontrol requeue``; it keeps its priority). Accounting
        keeps the interrupted run as REQUEUED; the job runs again from the start."""
        self.end(replace(job, nodes=list(job.nodes)), state=REQUEUED, exit_code=0, at=now)
        job.state = "PENDING"
        job.nodes = []
        job.started_at = job.end_at = job.ended_at = None
        job.exit_code = None
        job.requeues += 1
        job.queued_at = now
        self.queued.insert(0, job)
        self.changes.append(self.queue_change())

    def step(
        self,
        *,
        now: dt.datetime,
        rng: random.Random,
        schedulable: Mapping[str, list[tuple[str, int]]],
        alive: set[NodeKey],
    ) -> bool:
        """Move the workload to ``now``; True when anything changed.

        ``schedulable``: per cluster, the (node name, gpus) that run and are neither
        drained nor down. ``alive``: every node whose machine runs. Jobs on a node that
        stopped running die with it.
        """
        changed = self._arrive(now)
        finished = sorted(
            (j for j in self.running.values() if j.end_at is not None and j.end_at <= now),
            key=lambda j: (j.end_at, j.job_id),
        )
        for job in finished:
            failed = rng.random() < self.config.failed_job_share
            assert job.end_at is not None
            self.end(
                job,
                state="FAILED" if failed else "COMPLETED",
                exit_code=1 if failed else 0,
                at=job.end_at,
            )
            changed = True
        for key in [k for k in self.busy if k not in alive]:
            changed = self.kill_on(key, now) or changed
        for cluster_id, nodes in schedulable.items():
            # Idle only after the jobs above ended, so freed nodes get work at once.
            free = [n for n in nodes if (cluster_id, n[0]) not in self.busy]
            changed = self._start_queued(cluster_id, free, now) or changed
            if cluster_id in self.synthetic_off:
                continue
            changed = (
                self._generate(cluster_id, free, now=now, rng=rng, schedulable=len(nodes))
                or changed
            )
        return changed

    def _start_queued(self, cluster_id: str, free: list[tuple[str, int]], now: dt.datetime) -> bool:
        started = False
        for job in [j for j in self.queued if j.cluster_id == cluster_id]:
            if len(free) < job.node_count:
                continue  # backfill: a smaller job further back may still fit
            taken, free[:] = free[: job.node_count], free[job.node_count :]
            job.gpus_per_node = min(g for _, g in taken)
            self.queued.remove(job)
            self.start(job, [n for n, _ in taken], now)
            started = True
        if started:
            # One queue entry for the lot: the queue is written whole, so one per job
            # would cost O(queue²) when a long queue drains.
            self.changes.append(self.queue_change())
        return started

    def _arrive(self, now: dt.datetime) -> bool:
        """Queue every fed job whose arrival ``now`` has passed, oldest arrival first,
        each submitted at its arrival time; drop the feeds that have no job left."""
        arrived: list[tuple[dt.datetime, JobRecord]] = []
        for feed in list(self.feeds.values()):
            start = feed.next
            while feed.next < len(feed.jobs) and feed.arrival(feed.next) <= now:
                trace_job = feed.jobs[feed.next]
                at = feed.arrival(feed.next)
                nodes = nodes_for_gpus(trace_job.gpus, feed.gpus_per_node)
                self.next_job_id += 1
                job = JobRecord(
                    job_id=str(self.next_job_id),
                    name=trace_job.id,
                    user="trace",
                    account="demand",
                    cluster_id=feed.cluster_id,
                    node_count=nodes,
                    gpus_per_node=feed.gpus_per_node,
                    submitted_at=at,
                    duration_s=trace_job.duration_s,
                    gpus=_partial(trace_job.gpus, nodes * feed.gpus_per_node),
                )
                arrived.append((at, job))
                feed.next += 1
            if feed.next == start:
                continue
            self.changes.append({"dn": [feed.feed_id, feed.next]})
            if feed.next >= len(feed.jobs):
                del self.feeds[feed.feed_id]
        if not arrived:
            return False
        arrived.sort(key=lambda item: item[0])  # stable: a feed's own order is kept
        self.queued.extend(job for _, job in arrived)
        self.changes.append(self.queue_change())
        return True

    def add_feed(self, feed: DemandFeed) -> None:
        self.feeds[feed.feed_id] = feed
        self.changes.append({"d": feed.to_json()})

    def next_feed_id(self) -> int:
        # A finished feed's id may be used again: every journal line about it comes
        # before the line that starts the new one.
        return max(self.feeds, default=0) + 1

    def set_synthetic(self, cluster_id: str, *, on: bool) -> None:
        if on:
            self.synthetic_off.discard(cluster_id)
        else:
            self.synthetic_off.add(cluster_id)
        self.changes.append({"s": [cluster_id, on]})

    def pending(self, cluster_id: str | None) -> list[PendingWork]:
        """Queued jobs (of one cluster, or all), in queue order, as pending work."""
        return [
            PendingWork(
                id=j.job_id,
                gpus=j.node_count * j.gpus_per_node,
                since=j.queued_at or j.submitted_at,
            )
            for j in self.queued
            if cluster_id is None or j.cluster_id == cluster_id
        ]

    def _generate(
        self,
        cluster_id: str,
        free: list[tuple[str, int]],
        *,
        now: dt.datetime,
        rng: random.Random,
        schedulable: int,
    ) -> bool:
        if cluster_id not in self.targets:
            self.targets[cluster_id] = rng.uniform(*self.config.busy_share)
        busy = schedulable - len(free)
        want = round(self.targets[cluster_id] * schedulable) - busy
        changed = False
        while want > 0 and free:
            size = min(rng.randint(1, self.config.max_job_nodes), want, len(free))
            taken, free[:] = free[:size], free[size:]
            minutes = rng.uniform(*self.config.job_minutes)
            job = self.new_job(
                cluster_id=cluster_id,
                node_count=size,
                gpus_per_node=min(g for _, g in taken),
                duration_s=minutes * 60.0 * self.config.time_scale,
                now=now,
                rng=rng,
            )
            self.start(job, [n for n, _ in taken], now)
            want -= size
            changed = True
        return changed

    def jobs_on(self, key: NodeKey) -> list[JobRecord]:
        job_id = self.busy.get(key)
        job = self.running.get(job_id) if job_id is not None else None
        return [] if job is None else [job]

    def ended_since(self, since: dt.datetime, cluster_ids: Iterable[str] | None) -> list[JobRecord]:
        wanted = None if cluster_ids is None else set(cluster_ids)
        jobs = [
            j
            for j in self.accounting
            if j.ended_at is not None
            and j.ended_at >= since
            and (wanted is None or j.cluster_id in wanted)
        ]
        return sorted(jobs, key=lambda j: (j.ended_at, j.job_id))

    def set_flags(self, key: NodeKey, flags: NodeFlags | None) -> None:
        if flags is None:
            self.flags.pop(key, None)
        else:
            self.flags[key] = flags
        self.changes.append({"f": self._flags_json(key, flags)})

    def queue(self, job: JobRecord) -> None:
        self.queued.append(job)
        self.changes.append(self.queue_change())

    # -- persistence ------------------------------------------------------------------

    def queue_change(self) -> dict[str, Any]:
        return {"q": [j.to_json() for j in self.queued]}

    @staticmethod
    def _flags_json(key: NodeKey, flags: NodeFlags | None) -> list[Any]:
        if flags is None:
            return [key[0], key[1]]
        return [key[0], key[1], flags.drained, flags.down, flags.reason]

    def apply_change(self, change: dict[str, Any]) -> None:
        """Replay one journal entry written by this class (see ``changes``)."""
        if "r" in change:
            job = JobRecord.from_json(change["r"])
            self.running[job.job_id] = job
        elif "e" in change:
            job = JobRecord.from_json(change["e"])
            self.running.pop(job.job_id, None)
            self.queued = [j for j in self.queued if j.job_id != job.job_id]
            self.accounting.append(job)
        elif "q" in change:
            self.queued = [JobRecord.from_json(item) for item in change["q"]]
        elif "f" in change:
            cid, name, *rest = change["f"]
            if rest:
                drained, down, reason = rest
                self.flags[(str(cid), str(name))] = NodeFlags(bool(drained), bool(down), reason)
            else:
                self.flags.pop((str(cid), str(name)), None)
        elif "s" in change:
            cid, on = change["s"]
            if on:
                self.synthetic_off.discard(str(cid))
            else:
                self.synthetic_off.add(str(cid))
        elif "d" in change:
            feed = DemandFeed.from_json(change["d"])
            self.feeds[feed.feed_id] = feed
        elif "dn" in change:
            feed_id, position = change["dn"]
            fed = self.feeds.get(int(feed_id))
            if fed is not None:
                fed.next = int(position)
                if fed.next >= len(fed.jobs):
                    del self.feeds[fed.feed_id]

    def rebuild_busy(self) -> None:
        self.busy = {(j.cluster_id, n): j.job_id for j in self.running.values() for n in j.nodes}

    def to_json(self) -> dict[str, Any]:
        return {
            "flags": [self._flags_json(key, f) for key, f in self.flags.items()],
            "running": [j.to_json() for j in self.running.values()],
            "queued": [j.to_json() for j in self.queued],
            "accounting": [j.to_json() for j in self.accounting],
            "synthetic_off": sorted(self.synthetic_off),
            "feeds": [f.to_json() for f in self.feeds.values()],
        }

    def load_json(self, raw: dict[str, Any]) -> None:
        self.flags = {
            (str(cid), str(name)): NodeFlags(bool(d), bool(dn), None if r is None else str(r))
            for cid, name, d, dn, r in raw["flags"]
        }
        self.running = {}
        for item in raw["running"]:
            job = JobRecord.from_json(item)
            self.running[job.job_id] = job
        self.rebuild_busy()
        self.queued = [JobRecord.from_json(item) for item in raw["queued"]]
        self.accounting = deque(
            (JobRecord.from_json(item) for item in raw["accounting"]),
            maxlen=self.config.accounting_limit,
        )
        # Files written before these existed: synthetic load everywhere, no traces.
        self.synthetic_off = {str(c) for c in raw.get("synthetic_off", [])}
        feeds = (DemandFeed.from_json(item) for item in raw.get("feeds", []))
        self.feeds = {f.feed_id: f for f in feeds}


def _partial(gpus: int | None, whole: int) -> int | None:
    """The GPUs a job asked for, kept only when fewer than its whole nodes hold."""
    return gpus if gpus is not None and gpus < whole else None


def nodes_for_gpus(gpus: int, gpus_per_node: int) -> int:
    """Whole nodes a job of ``gpus`` GPUs takes (jobs take whole nodes here)."""
    return max(1, math.ceil(gpus / gpus_per_node))
