"""``SimWorld``: the simulated cloud, its machines and their workload manager, in one file.

The sim provider and sim scheduler drivers are two views of one world, so a reboot through
the provider kills the jobs the scheduler shows, as on real hardware. Every mutation is
saved atomically before the call returns, so a control plane killed with SIGKILL finds the
world as it left it. Methods are synchronous and short, safe from threads and asyncio.

Jobs end in accounting (``accounting_since``) with Slurm's words, so a test can tell a
job that finished from one a repair killed:

- ``COMPLETED`` / ``FAILED``: ended by itself (exit code 0 / non-zero);
- ``NODE_FAIL``: killed because a node under it went away: ``down_node``, ``terminate``,
  ``replace``, ``reboot`` (and power cycle), ``reprovision``, ``reset_gpu``, or a machine
  that stopped running;
- ``REQUEUED``: stopped by ``requeue_jobs_on_node``; the record is the interrupted run,
  and the job itself is back in the queue as ``PENDING`` under the same id (as in
  Slurm), to run again from the start on a node that is not drained.

Demand, for the autoscaler: ``submit_job`` queues a job of so many GPUs (whole nodes),
``feed_trace`` queues a demand trace's jobs as the clock passes their arrival (at each
``advance``), ``set_synthetic_load`` turns a cluster's synthetic background jobs off so
that only that demand runs there, and ``pending_work`` lists what waits. All of it is
saved with the world.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.core.agent_protocol import MAX_GPUS_PER_NODE
from gpufleet.core.autoscale import PendingWork
from gpufleet.core.clock import Clock, SystemClock
from gpufleet.core.errors import DriverError, OutOfCapacity
from gpufleet.core.gpu_models import GPU_MODELS
from gpufleet.sim import faults as fm
from gpufleet.sim.demand import TraceJob
from gpufleet.sim.faults import FaultConfig, FaultModel
from gpufleet.sim.load import JobShape, NodeLoad, node_load
from gpufleet.sim.models import (
    BootPlan,
    SimGpu,
    SimInstance,
    SimInstanceSpec,
    SimInstanceState,
    SimJob,
    SimNodeStatus,
)
from gpufleet.sim.records import DemandFeed, InstanceRecord, NodeFlags
from gpufleet.sim.store import WorldStore
from gpufleet.sim.workload import NodeKey, Workload, WorkloadConfig, nodes_for_gpus
from gpufleet.sim.world_faults import WorldFaults

RUNNING = SimInstanceState.RUNNING


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class SimWorld(WorldFaults):
    """The simulator's whole state. ``path=None`` keeps it in memory only (benchmarks)."""

    def __init__(
        self,
        path: Path | None,
        *,
        clock: Clock | None = None,
        seed: int | None = None,
        workload: WorkloadConfig | None = None,
        faults: FaultConfig | None = None,
    ) -> None:
        self._store = WorldStore(path) if path is not None else None
        self._clock = clock or SystemClock()
        self._seed = seed
        self._restarts = 0
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._instances: dict[str, InstanceRecord] = {}
        self._by_token: dict[str, str] = {}
        self._live: dict[str, dict[str, str]] = {}  # node name -> cluster id -> instance id
        self._next_slot = 0
        self._scheduler_available = True
        self._workload = Workload(workload or WorkloadConfig())
        self._changes: list[dict[str, Any]] = []
        self._fault_model = FaultModel(faults)
        self._fault_listeners: list[Callable[[str], None]] = []
        if self._store is not None:
            self._open(self._store)

    @property
    def clock(self) -> Clock:
        return self._clock

    # -- instances --------------------------------------------------------------------

    def provision(
        self, spec: SimInstanceSpec, *, plan: BootPlan, max_instances: int | None = None
    ) -> SimInstance:
        """Boot a machine, or return the one this ``client_token`` already made.

        A repeated token refreshes user_data (e.g. a rotated node token). Raises
        ``DriverError`` for an unknown GPU model, a bad GPU count or no capacity left.
        """
        with self._lock:
            now = self._clock.now()
            existing = self._by_token.get(spec.client_token)
            if existing is not None:
                record = self._instances[existing]
                record.user_data = dict(spec.user_data)
                self._touch(record)
                self._save()
                return record.snapshot(now)
            self._check_spec(spec)
            if max_instances is not None:
                live = sum(1 for r in self._instances.values() if r.terminated_at is None)
                if live >= max_instances:
                    raise OutOfCapacity(
                        f"sim: no capacity for node {spec.node_name} "
                        f"({live} of {max_instances} instances in use)"
                    )
            record = self._create(spec, plan=plan, now=now)
            self._save()
            return record.snapshot(now)

    def get_instance(self, instance_id: str) -> SimInstance | None:
        """The instance (terminated ones included), or None if it never existed."""
        with self._lock:
            record = self._instances.get(instance_id)
            return None if record is None else record.snapshot(self._clock.now())

    def list_instances(
        self, *, cluster_id: str | None = None, include_terminated: bool = False
    ) -> list[SimInstance]:
        """Instances in creation order, optionally of one cluster."""
        with self._lock:
            now = self._clock.now()
            return [
                r.snapshot(now)
                for r in self._instances.values()
                if (cluster_id is None or r.cluster_id == cluster_id)
                and (include_terminated or r.terminated_at is None)
            ]

    def terminate(self, instance_id: str) -> None:
        """Give a machine back; its jobs die. Missing or terminated: nothing to do."""
        with self._lock:
            record = self._instances.get(instance_id)
            if record is None or record.terminated_at is not None:
                return
            now = self._clock.now()
            self._workload.kill_on((record.cluster_id, record.node_name), now)
            record.terminated_at = now
            self._unindex_live(record)
            self._touch(record)
            self._save()

    def reboot(self, instance_id: str, *, plan: BootPlan, hard: bool = False) -> SimInstance:
        """Restart the machine: pending for a boot delay, then running (or, at
        ``plan.failure_rate``, FAILED: it never comes back). Jobs die (NODE_FAIL).
        ``hard``: a power cycle, counted apart in ``action_counts``."""
        with self._lock:
            action = "power_cycle" if hard else "reboot"
            record = self._require_live(instance_id, action=action.replace("_", " "))
            self._restart(record, plan=plan, action=action)
            self._save()
            return record.snapshot(self._clock.now())

    def reprovision(
        self, instance_id: str, *, user_data: dict[str, str], plan: BootPlan
    ) -> SimInstance:
        """Reinstall the same machine and boot it with new user_data. Jobs die."""
        with self._lock:
            record = self._require_live(instance_id, action="reprovision")
            record.user_data = dict(user_data)
            self._restart(record, plan=plan, action="reprovision")
            self._save()
            return record.snapshot(self._clock.now())

    def replace(self, instance_id: str, *, spec: SimInstanceSpec, plan: BootPlan) -> SimInstance:
        """Terminate ``instance_id`` and boot a new host (new serial, GPUs and slot).

        Idempotent by ``spec.client_token``: a second call returns the first replacement.
        """
        with self._lock:
            if instance_id not in self._instances:
                raise DriverError(f"sim: cannot replace {instance_id}: no such instance")
            self.terminate(instance_id)
            return self.provision(spec, plan=plan)

    def reboot_count(self, instance_id: str) -> int:
        """Times the machine was rebooted or power cycled (0 for an unknown one)."""
        counts = self.action_counts(instance_id)
        return counts.get("reboot", 0) + counts.get("power_cycle", 0)

    def action_counts(self, instance_id: str) -> dict[str, int]:
        """Provider actions done to the machine, by name: ``reboot``, ``power_cycle``,
        ``reprovision``, ``reset_gpu`` and ``reset_gpu_failed``. Saved with the world."""
        with self._lock:
            record = self._instances.get(instance_id)
            return {} if record is None else dict(record.actions)

    # -- the workload manager ---------------------------------------------------------

    def advance(self, now: dt.datetime | None = None) -> None:
        """Move the workload to ``now``: end finished jobs, start new ones on idle nodes."""
        with self._lock:
            now = now or self._clock.now()
            schedulable: dict[str, list[tuple[str, int]]] = {}
            alive: set[NodeKey] = set()
            for record in self._instances.values():
                if record.terminated_at is not None or record.state_at(now) is not RUNNING:
                    continue
                key = (record.cluster_id, record.node_name)
                alive.add(key)
                if record.user_data.get("gpufleet_scheduler", "sim") != "sim":
                    continue  # a real scheduler (Slurm) runs this machine's jobs, not ours
                flags = self._workload.flags.get(key)
                if flags is not None and (flags.drained or flags.down):
                    continue
                if record.gpu_resets and record.resetting_at(now):
                    continue  # a GPU is off the bus: no job starts until it is back
                schedulable.setdefault(record.cluster_id, []).append(
                    (record.node_name, record.gpu_count)
                )
            changed = self._step_faults(now)
            if self._workload.step(now=now, rng=self._rng, schedulable=schedulable, alive=alive):
                changed.add("")
            if changed:
                self._save()
                self._notify(changed - {""})

    def node_statuses(self, *, cluster_id: str | None = None) -> list[SimNodeStatus]:
        """Every node with a machine that is not terminated, optionally of one cluster."""
        with self._lock:
            now = self._clock.now()
            return [
                self._status(r, now)
                for r in self._instances.values()
                if r.terminated_at is None and (cluster_id is None or r.cluster_id == cluster_id)
            ]

    def node_status(self, node_name: str, *, cluster_id: str | None = None) -> SimNodeStatus:
        """One node by name; raises ``DriverError`` if unknown or ambiguous."""
        with self._lock:
            return self._status(self._resolve(node_name, cluster_id), self._clock.now())

    def drain_node(self, node_name: str, *, reason: str, cluster_id: str | None = None) -> None:
        """Stop new jobs on the node; running ones finish. Idempotent."""
        with self._lock:
            key = self._key(self._resolve(node_name, cluster_id))
            old = self._workload.flags.get(key) or NodeFlags()
            # Keep a reason already set: overwriting an operator's drain reason with ours
            # would make their drain look like ours, and we would later undo it.
            kept = old.reason if (old.drained or old.down) and old.reason else reason
            self._workload.set_flags(key, NodeFlags(drained=True, down=old.down, reason=kept))
            self._save()

    def down_node(self, node_name: str, *, reason: str, cluster_id: str | None = None) -> None:
        """Mark the node down at once; its job dies as NODE_FAIL."""
        with self._lock:
            key = self._key(self._resolve(node_name, cluster_id))
            old = self._workload.flags.get(key) or NodeFlags()
            kept = old.reason if (old.drained or old.down) and old.reason else reason  # as drain
            self._workload.set_flags(key, NodeFlags(drained=old.drained, down=True, reason=kept))
            self._workload.kill_on(key, self._clock.now())
            self._save()

    def resume_node(
        self, node_name: str, *, cluster_id: str | None = None, only_reason_prefix: str | None
    ) -> None:
        """Clear drain and down. With ``only_reason_prefix``, refuse (``DriverError``) a
        node whose reason does not start with it; a node with no flags resumes trivially."""
        with self._lock:
            record = self._resolve(node_name, cluster_id)
            key = (record.cluster_id, record.node_name)
            flags = self._workload.flags.get(key)
            if flags is None or not (flags.drained or flags.down):
                return
            reason = flags.reason or ""
            if only_reason_prefix is not None and not reason.startswith(only_reason_prefix):
                raise DriverError(
                    f"sim: refusing to resume node {record.node_name}: its reason {reason!r} "
                    f"was not set by gpufleet (no {only_reason_prefix!r} prefix)"
                )
            self._workload.set_flags(key, None)
            self._save()

    def requeue_jobs_on_node(self, node_name: str, *, cluster_id: str | None = None) -> list[str]:
        """Requeue the node's running jobs (Slurm ``scontrol requeue``); their ids.

        Each job stops on all its nodes (accounting: REQUEUED) and goes back to the head
        of the queue as PENDING under the same id; it starts again from the beginning at
        a later ``advance``, only on nodes neither drained nor down. A job submitted with
        ``requeueable=False`` makes the call raise ``DriverError`` and requeue nothing.
        """
        with self._lock:
            record = self._resolve(node_name, cluster_id)
            jobs = self._workload.jobs_on(self._key(record))
            for job in jobs:
                if not job.requeueable:
                    raise DriverError(
                        f"sim: node {record.node_name}: scontrol requeue {job.job_id}: "
                        f"job {job.job_id} is not requeueable (submitted with --no-requeue)"
                    )
            now = self._clock.now()
            for job in jobs:
                self._workload.requeue(job, now)
            if jobs:
                self._save()
            return [j.job_id for j in jobs]

    def jobs_on_node(self, node_name: str, *, cluster_id: str | None = None) -> list[SimJob]:
        """Jobs running on the node now."""
        with self._lock:
            record = self._resolve(node_name, cluster_id)
            jobs = self._workload.jobs_on((record.cluster_id, record.node_name))
            return [j.snapshot() for j in jobs]

    def running_jobs(self, *, cluster_id: str | None = None) -> list[SimJob]:
        with self._lock:
            return [
                j.snapshot()
                for j in self._workload.running.values()
                if cluster_id is None or j.cluster_id == cluster_id
            ]

    def submit_job(
        self,
        cluster_id: str,
        *,
        duration_s: float,
        gpus: int | None = None,
        node_count: int | None = None,
        gpus_per_node: int | None = None,
        name: str | None = None,
        user: str = "alice",
        account: str = "llm-pretrain",
        requeueable: bool = True,
        now: dt.datetime | None = None,
    ) -> SimJob:
        """Queue a job (it starts at the first ``advance`` with enough free nodes: queued
        jobs first, in order, a smaller one passing a bigger one that does not fit).

        Args:
            cluster_id: the cluster whose nodes run it.
            duration_s: how long it runs once started.
            gpus: GPUs it asks for; jobs take whole nodes, so it takes
                ``ceil(gpus / gpus_per_node)`` of them, but it loads only the GPUs it
                asked for (the first of each node; the rest idle). Give ``gpus`` or
                ``node_count``.
            node_count: whole nodes it asks for.
            gpus_per_node: the size of a node, for ``gpus`` and for the GPUs it shows while
                queued; default the GPU count most of the cluster's nodes have.
            name: the job's name (default: a random one of the synthetic users').
            requeueable: False: like ``sbatch --no-requeue``, a requeue of it is refused.
            now: its submit time (default the clock's now).

        Returns the queued job (``job_id`` is its id).

        Raises:
            ValueError: neither or both of ``gpus`` and ``node_count``, or a count under 1.
            DriverError: no ``gpus_per_node`` given and the cluster has no node to read it
                from.
        """
        if (gpus is None) == (node_count is None):
            raise ValueError("submit_job: give gpus or node_count (one of them)")
        for what, value in (
            ("gpus", gpus),
            ("node_count", node_count),
            ("gpus_per_node", gpus_per_node),
        ):
            if value is not None and value < 1:
                raise ValueError(f"submit_job: {what} must be at least 1, got {value}")
        if duration_s < 0:
            raise ValueError(f"submit_job: duration_s must not be negative, got {duration_s}")
        with self._lock:
            per_node = gpus_per_node or self._gpus_per_node(cluster_id, asked=gpus or node_count)
            nodes = nodes_for_gpus(gpus, per_node) if gpus is not None else node_count or 1
            job = self._workload.new_job(
                cluster_id=cluster_id,
                node_count=nodes,
                gpus_per_node=per_node,
                duration_s=duration_s,
                now=now or self._clock.now(),
                rng=self._rng,
                name=name,
                gpus=gpus,
            )
            job.user, job.account = user, account
            job.requeueable = requeueable
            self._workload.queue(job)
            self._save()
            return job.snapshot()

    def pending_work(self, *, cluster_id: str | None = None) -> list[PendingWork]:
        """Queued jobs, in queue order: id, GPUs (its nodes × GPUs per node: jobs take
        whole nodes) and since when it waits (its submit time, or its last requeue)."""
        with self._lock:
            return self._workload.pending(cluster_id)

    def pending_gpu_demand(self, *, cluster_id: str | None = None) -> int:
        """GPUs asked for by queued jobs."""
        return sum(w.gpus for w in self.pending_work(cluster_id=cluster_id))

    def set_synthetic_load(self, cluster_id: str, *, on: bool) -> None:
        """Turn the synthetic users' background jobs on a cluster on or off (default on,
        at ``WorkloadConfig.busy_share``). Off: no new synthetic job starts there, so its
        nodes run only submitted and fed jobs; those already running end in their time.
        Saved with the world."""
        with self._lock:
            if self.synthetic_load(cluster_id) == on:
                return
            self._workload.set_synthetic(cluster_id, on=on)
            self._save()

    def synthetic_load(self, cluster_id: str) -> bool:
        """Whether synthetic background jobs start on the cluster's nodes."""
        with self._lock:
            return cluster_id not in self._workload.synthetic_off

    def feed_trace(
        self,
        cluster_id: str,
        trace: Sequence[TraceJob],
        *,
        start: dt.datetime | None = None,
        gpus_per_node: int | None = None,
    ) -> None:
        """Feed a demand trace into a cluster over simulated time: each job is queued (as
        ``submit_job`` would, submitted at its arrival) by the first ``advance`` at or
        after ``start + arrive_s``; one whose arrival has passed already comes at the
        next ``advance``. The jobs not yet arrived are saved with the world.

        Args:
            start: the trace's time zero (default the clock's now).
            gpus_per_node: node size for the jobs' whole nodes; default as ``submit_job``.

        Raises:
            ValueError: a job asks for fewer than 1 GPU or lasts a negative time.
            DriverError: no ``gpus_per_node`` and the cluster has no node to read it from.
        """
        for job in trace:
            if job.gpus < 1 or job.duration_s < 0 or job.arrive_s < 0:
                raise ValueError(
                    f"feed_trace: job {job.id}: needs gpus >= 1, duration_s >= 0 and "
                    f"arrive_s >= 0, got {job.gpus}, {job.duration_s}, {job.arrive_s}"
                )
        if not trace:
            return
        with self._lock:
            per_node = gpus_per_node or self._gpus_per_node(
                cluster_id, asked=max(j.gpus for j in trace)
            )
            feed = DemandFeed(
                feed_id=self._workload.next_feed_id(),
                cluster_id=cluster_id,
                start=start or self._clock.now(),
                gpus_per_node=per_node,
                jobs=sorted(trace, key=lambda j: j.arrive_s),
            )
            self._workload.add_feed(feed)
            self._save()

    def trace_jobs_left(self, *, cluster_id: str | None = None) -> int:
        """Fed jobs that have not arrived yet (of one cluster, or all)."""
        with self._lock:
            return sum(
                len(f.jobs) - f.next
                for f in self._workload.feeds.values()
                if cluster_id is None or f.cluster_id == cluster_id
            )

    def accounting_since(
        self, since: dt.datetime, *, cluster_id: str | None = None
    ) -> list[SimJob]:
        """Jobs that ended at or after ``since``, oldest first."""
        with self._lock:
            ids = None if cluster_id is None else [cluster_id]
            return [j.snapshot() for j in self._workload.ended_since(since, ids)]

    def busy_instance_ids(self) -> frozenset[str]:
        """Instances whose node runs a job now (the job may use only some of its GPUs:
        see ``node_loads``)."""
        with self._lock:
            out: set[str] = set()
            for cid, name in self._workload.busy:
                iid = self._live.get(name, {}).get(cid)
                if iid is not None:
                    out.add(iid)
            return frozenset(out)

    def node_loads(self) -> dict[str, NodeLoad]:
        """What the running jobs put on each machine now, by instance id (idle machines
        left out): the load of each GPU a job uses and the InfiniBand traffic it moves.
        A job's kind comes from its name, its level from its id (``load.py``), so the
        telemetry that follows is the same on every run of a seeded world."""
        with self._lock:
            out: dict[str, NodeLoad] = {}
            for job in self._workload.running.values():
                shape = JobShape(job.job_id, job.name, node_count=job.node_count, gpus=job.gpus)
                for position, name in enumerate(job.nodes):
                    iid = self._live.get(name, {}).get(job.cluster_id)
                    if iid is None:
                        continue
                    gpu_count = self._instances[iid].gpu_count
                    load = node_load(shape, position=position, gpu_count=gpu_count)
                    if load.busy:
                        out[iid] = load
            return out

    @property
    def scheduler_available(self) -> bool:
        return self._scheduler_available

    def set_scheduler_available(self, available: bool) -> None:
        """Make the workload manager unreachable (to test that drains fail closed)."""
        with self._lock:
            self._scheduler_available = available
            self._save()

    # -- internals --------------------------------------------------------------------

    def _gpus_per_node(self, cluster_id: str, *, asked: int | None) -> int:
        """The GPU count most of the cluster's live nodes have (ties: the larger)."""
        counts = Counter(
            r.gpu_count
            for r in self._instances.values()
            if r.cluster_id == cluster_id and r.terminated_at is None
        )
        if not counts:
            raise DriverError(
                f"sim: cluster {cluster_id}: no nodes to size a job of {asked} by; "
                "pass gpus_per_node"
            )
        return max(counts, key=lambda g: (counts[g], g))

    def _check_spec(self, spec: SimInstanceSpec) -> None:
        if spec.gpu_model not in GPU_MODELS:
            known = ", ".join(sorted(GPU_MODELS))
            raise DriverError(
                f"sim: cannot provision node {spec.node_name}: unknown GPU model "
                f"{spec.gpu_model!r} (known: {known})"
            )
        if not 1 <= spec.gpu_count <= MAX_GPUS_PER_NODE:
            raise DriverError(
                f"sim: cannot provision node {spec.node_name}: gpu_count {spec.gpu_count} "
                f"is outside 1..{MAX_GPUS_PER_NODE}"
            )

    def _create(self, spec: SimInstanceSpec, *, plan: BootPlan, now: dt.datetime) -> InstanceRecord:
        rng = self._rng
        slot = self._next_slot
        self._next_slot += 1
        record = InstanceRecord(
            instance_id=f"i-{rng.getrandbits(64):016x}",
            client_token=spec.client_token,
            cluster_id=spec.cluster_id,
            node_name=spec.node_name,
            gpu_model=spec.gpu_model,
            gpu_count=spec.gpu_count,
            user_data=dict(spec.user_data),
            created_at=now,
            ready_at=now + dt.timedelta(seconds=rng.uniform(*plan.delay_range_s)),
            will_fail=rng.random() < plan.failure_rate,
            slot=slot,
            serial=f"SIM{rng.getrandbits(40):010X}",
            gpus=[self._new_gpu(i) for i in range(spec.gpu_count)],
            booted_at=now,
        )
        self._index(record)
        self._touch(record)
        return record

    def _new_gpu(self, index: int) -> SimGpu:
        gpu_uuid = uuid.UUID(int=self._rng.getrandbits(128), version=4)
        return SimGpu(index, f"GPU-{gpu_uuid}", str(self._rng.randrange(10**12, 10**13)))

    def _restart(self, record: InstanceRecord, *, plan: BootPlan, action: str) -> None:
        now = self._clock.now()
        self._workload.kill_on((record.cluster_id, record.node_name), now)
        record.ready_at = now + dt.timedelta(seconds=self._rng.uniform(*plan.delay_range_s))
        record.boot_id += 1
        record.booted_at = now
        record.gpu_resets = {}  # a boot re-initialises every GPU
        record.actions[action] = record.actions.get(action, 0) + 1
        # A fresh boot clears every fault but bad hardware's, which recurs after the boot.
        faults = fm.restart(
            record.faults,
            now=now,
            back_at=record.ready_at,
            config=self._fault_model.config,
            rng=self._rng,
        )
        if faults is not None:
            record.faults = faults
            self._notify({record.instance_id})
        if action == "reprovision":
            # A reinstall boots over the network: its failure is drawn afresh each time.
            record.will_fail = self._rng.random() < plan.failure_rate
            record.failure = None
        elif plan.failure_rate > 0 and self._rng.random() < plan.failure_rate:
            # A reboot keeps a host that already failed failed; it may also break one.
            # No draw at rate 0, so old seeds replay as before.
            record.will_fail = True
            record.failure = f"sim: host did not come back after {action.replace('_', ' ')}"
        self._touch(record)

    def _require_live(self, instance_id: str, *, action: str) -> InstanceRecord:
        record = self._instances.get(instance_id)
        if record is None:
            raise DriverError(f"sim: cannot {action} {instance_id}: no such instance")
        if record.terminated_at is not None:
            raise DriverError(
                f"sim: cannot {action} node {record.node_name} ({instance_id}): terminated"
            )
        return record

    def _unindex_live(self, record: InstanceRecord) -> None:
        by_cluster = self._live.get(record.node_name, {})
        if by_cluster.get(record.cluster_id) == record.instance_id:
            del by_cluster[record.cluster_id]
            if not by_cluster:
                del self._live[record.node_name]

    def _resolve(self, node_name: str, cluster_id: str | None) -> InstanceRecord:
        by_cluster = self._live.get(node_name, {})
        if cluster_id is not None:
            iid = by_cluster.get(cluster_id)
            if iid is None:
                raise DriverError(f"sim: node {node_name} not found in cluster {cluster_id}")
            return self._instances[iid]
        if not by_cluster:
            raise DriverError(f"sim: node {node_name} not found")
        if len(by_cluster) > 1:
            raise DriverError(
                f"sim: node name {node_name} is in several clusters "
                f"({', '.join(sorted(by_cluster))}); use a cluster-scoped scheduler"
            )
        return self._instances[next(iter(by_cluster.values()))]

    @staticmethod
    def _key(record: InstanceRecord) -> NodeKey:
        return (record.cluster_id, record.node_name)

    def _status(self, record: InstanceRecord, now: dt.datetime) -> SimNodeStatus:
        key = (record.cluster_id, record.node_name)
        flags = self._workload.flags.get(key)
        job_id = self._workload.busy.get(key)
        return SimNodeStatus(
            cluster_id=record.cluster_id,
            node_name=record.node_name,
            instance_id=record.instance_id,
            instance_state=record.state_at(now),
            gpus=record.gpu_count,
            drained=flags.drained if flags else False,
            down=flags.down if flags else False,
            reason=flags.reason if flags else None,
            job_ids=() if job_id is None else (job_id,),
        )

    # -- persistence (see store.py) --------------------------------------------------

    def _touch(self, record: InstanceRecord) -> None:
        self._changes.append({"i": record.to_json()})

    def _index(self, record: InstanceRecord) -> None:
        self._instances[record.instance_id] = record
        self._by_token[record.client_token] = record.instance_id
        if record.terminated_at is None:
            self._live.setdefault(record.node_name, {})[record.cluster_id] = record.instance_id

    def _meta(self) -> dict[str, Any]:
        return {
            "next_slot": self._next_slot,
            "next_job_id": self._workload.next_job_id,
            "targets": self._workload.targets,
            "scheduler_available": self._scheduler_available,
            "restarts": self._restarts,
            "faults_drawn_at": _iso(self._fault_model.drawn_at),
        }

    def _save(self) -> None:
        changes = [*self._changes, *self._workload.changes, {"m": self._meta()}]
        self._changes.clear()
        self._workload.changes.clear()
        if self._store is None:
            return
        if self._store.wants_snapshot():
            self._store.write_snapshot(
                {
                    "meta": self._meta(),
                    "instances": [r.to_json() for r in self._instances.values()],
                    "workload": self._workload.to_json(),
                }
            )
        else:
            self._store.append(changes)

    def _open(self, store: WorldStore) -> None:
        snapshot, entries = store.load()
        if snapshot is None:
            # Journal lines extend a snapshot, so there must be one before the first line.
            store.write_snapshot(
                {"meta": self._meta(), "instances": [], "workload": self._workload.to_json()}
            )
            return
        meta = snapshot["meta"]
        for item in snapshot["instances"]:
            record = InstanceRecord.from_json(item)
            self._instances[record.instance_id] = record
        self._workload.load_json(snapshot["workload"])
        for entry in entries:
            if "i" in entry:
                record = InstanceRecord.from_json(entry["i"])
                self._instances[record.instance_id] = record
            elif "m" in entry:
                meta = entry["m"]
            else:
                self._workload.apply_change(entry)
        for record in self._instances.values():
            self._index(record)
        self._workload.rebuild_busy()
        self._next_slot = int(meta["next_slot"])
        self._workload.next_job_id = int(meta["next_job_id"])
        self._workload.targets = {str(k): float(v) for k, v in dict(meta["targets"]).items()}
        self._scheduler_available = bool(meta["scheduler_available"])
        drawn_at = meta.get("faults_drawn_at")
        self._fault_model.drawn_at = (
            None if drawn_at is None else dt.datetime.fromisoformat(drawn_at)
        )
        # A fresh random stream per restart: replaying the seed's first stream would hand
        # out serials and GPU UUIDs that already exist.
        self._restarts = int(meta["restarts"]) + 1
        self._rng = random.Random(None if self._seed is None else f"{self._seed}:{self._restarts}")
        self._save()
