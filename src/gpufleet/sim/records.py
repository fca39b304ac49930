"""The world's live, mutable records and their JSON form. Private to ``gpufleet.sim``.

JSON rather than pickle so a person can read (and a test can edit) the state files, and so
a file written by one version of the code still loads after an upgrade.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from gpufleet.sim.demand import TraceJob
from gpufleet.sim.faults import SimFault
from gpufleet.sim.models import SimGpu, SimInstance, SimInstanceState, SimJob

BOOT_FAILURE = "sim: host failed to boot (PXE timeout after reinstall)"


def _ts(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_ts(value: Any) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(str(value))


def _req_ts(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(str(value))


@dataclass
class InstanceRecord:
    instance_id: str
    client_token: str
    cluster_id: str
    node_name: str
    gpu_model: str
    gpu_count: int
    user_data: dict[str, str]
    created_at: dt.datetime
    ready_at: dt.datetime
    will_fail: bool
    slot: int
    serial: str
    gpus: list[SimGpu]
    boot_id: int = 1
    terminated_at: dt.datetime | None = None
    faults: list[SimFault] = field(default_factory=list)  # active ones and a few cleared
    booted_at: dt.datetime | None = None  # the last boot's start; None: created_at
    failure: str | None = None  # why the next boot fails, when will_fail
    gpu_resets: dict[int, dt.datetime] = field(default_factory=dict)  # GPU -> back at
    actions: dict[str, int] = field(default_factory=dict)  # provider action -> times done

    def state_at(self, now: dt.datetime) -> SimInstanceState:
        # Computed, not stored: the clock alone moves an instance from pending to running,
        # so nothing has to run for a booted machine to show up as booted.
        if self.terminated_at is not None:
            return SimInstanceState.TERMINATED
        if now < self.ready_at:
            return SimInstanceState.PENDING
        return SimInstanceState.FAILED if self.will_fail else SimInstanceState.RUNNING

    def snapshot(self, now: dt.datetime) -> SimInstance:
        state = self.state_at(now)
        slot = self.slot
        return SimInstance(
            instance_id=self.instance_id,
            client_token=self.client_token,
            cluster_id=self.cluster_id,
            node_name=self.node_name,
            gpu_model=self.gpu_model,
            gpu_count=self.gpu_count,
            state=state,
            created_at=self.created_at,
            ready_at=self.ready_at,
            hostname=self.node_name,
            serial=self.serial,
            bmc_address=f"10.{128 + slot // 65536}.{(slot // 256) % 256}.{slot % 256}",
            rack=f"rack-{slot // 8:03d}",
            leaf_switch=f"leaf-{slot // 16:02d}",
            pdu=f"pdu-{slot // 4:03d}",
            gpus=tuple(self.gpus),
            user_data=dict(self.user_data),
            boot_id=self.boot_id,
            error=(self.failure or BOOT_FAILURE) if state is SimInstanceState.FAILED else None,
            terminated_at=self.terminated_at,
            booted_at=self.booted_at or self.created_at,
            resetting_until=self.resetting_at(now),
        )

    def resetting_at(self, now: dt.datetime) -> dict[int, dt.datetime]:
        """The GPUs still resetting at ``now``, with when each is back."""
        if self.state_at(now) is not SimInstanceState.RUNNING:
            return {}
        return {i: until for i, until in sorted(self.gpu_resets.items()) if until > now}

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "client_token": self.client_token,
            "cluster_id": self.cluster_id,
            "node_name": self.node_name,
            "gpu_model": self.gpu_model,
            "gpu_count": self.gpu_count,
            "user_data": self.user_data,
            "created_at": _ts(self.created_at),
            "ready_at": _ts(self.ready_at),
            "will_fail": self.will_fail,
            "slot": self.slot,
            "serial": self.serial,
            "gpus": [[g.index, g.uuid, g.serial] for g in self.gpus],
            "boot_id": self.boot_id,
            "terminated_at": _ts(self.terminated_at),
            "faults": [f.to_json() for f in self.faults],
            "booted_at": _ts(self.booted_at),
            "failure": self.failure,
            "gpu_resets": {str(i): _ts(t) for i, t in self.gpu_resets.items()},
            "actions": self.actions,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> InstanceRecord:
        return cls(
            instance_id=str(raw["instance_id"]),
            client_token=str(raw["client_token"]),
            cluster_id=str(raw["cluster_id"]),
            node_name=str(raw["node_name"]),
            gpu_model=str(raw["gpu_model"]),
            gpu_count=int(raw["gpu_count"]),
            user_data={str(k): str(v) for k, v in dict(raw["user_data"]).items()},
            created_at=_req_ts(raw["created_at"]),
            ready_at=_req_ts(raw["ready_at"]),
            will_fail=bool(raw["will_fail"]),
            slot=int(raw["slot"]),
            serial=str(raw["serial"]),
            gpus=[SimGpu(int(i), str(u), str(s)) for i, u, s in raw["gpus"]],
            boot_id=int(raw["boot_id"]),
            terminated_at=_parse_ts(raw.get("terminated_at")),
            # Files written before faults existed have none.
            faults=[SimFault.from_json(str(raw["instance_id"]), f) for f in raw.get("faults", [])],
            # Files written before these existed: boot time unknown (the snapshot shows the
            # creation time, a lower bound), the default failure text, no resets or counts.
            booted_at=_parse_ts(raw.get("booted_at")),
            failure=None if raw.get("failure") is None else str(raw["failure"]),
            gpu_resets={int(i): _req_ts(t) for i, t in dict(raw.get("gpu_resets", {})).items()},
            actions={str(k): int(v) for k, v in dict(raw.get("actions", {})).items()},
        )


@dataclass
class JobRecord:
    job_id: str
    name: str
    user: str
    account: str
    cluster_id: str
    node_count: int
    gpus_per_node: int
    submitted_at: dt.datetime
    duration_s: float
    state: str = "PENDING"
    nodes: list[str] = field(default_factory=list)
    started_at: dt.datetime | None = None
    end_at: dt.datetime | None = None  # when a running job will finish on its own
    ended_at: dt.datetime | None = None
    exit_code: int | None = None
    requeueable: bool = True  # False: submitted with --no-requeue
    requeues: int = 0  # times requeued (Slurm's Restarts)
    queued_at: dt.datetime | None = None  # when a requeue put it back; None: submitted_at
    # GPUs it asked for, when fewer than its whole nodes: it loads only that many (the
    # first of each node, in order); None: every GPU of its nodes.
    gpus: int | None = None

    def snapshot(self) -> SimJob:
        return SimJob(
            job_id=self.job_id,
            name=self.name,
            user=self.user,
            account=self.account,
            cluster_id=self.cluster_id,
            state=self.state,
            node_count=self.node_count,
            nodes=tuple(self.nodes),
            gpus=self.node_count * self.gpus_per_node,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            ended_at=self.ended_at,
            exit_code=self.exit_code,
            requeues=self.requeues,
        )

    def to_json(self) -> list[Any]:
        # A list, not a dict: the accounting tail holds thousands of these and the file is
        # rewritten on every job start/end, so its size is the simulator's main cost.
        return [
            self.job_id,
            self.name,
            self.user,
            self.account,
            self.cluster_id,
            self.node_count,
            self.gpus_per_node,
            _ts(self.submitted_at),
            self.duration_s,
            self.state,
            self.nodes,
            _ts(self.started_at),
            _ts(self.end_at),
            _ts(self.ended_at),
            self.exit_code,
            self.requeueable,
            self.requeues,
            _ts(self.queued_at),
            self.gpus,
        ]

    @classmethod
    def from_json(cls, raw: list[Any]) -> JobRecord:
        return cls(
            job_id=str(raw[0]),
            name=str(raw[1]),
            user=str(raw[2]),
            account=str(raw[3]),
            cluster_id=str(raw[4]),
            node_count=int(raw[5]),
            gpus_per_node=int(raw[6]),
            submitted_at=_req_ts(raw[7]),
            duration_s=float(raw[8]),
            state=str(raw[9]),
            nodes=[str(n) for n in raw[10]],
            started_at=_parse_ts(raw[11]),
            end_at=_parse_ts(raw[12]),
            ended_at=_parse_ts(raw[13]),
            exit_code=None if raw[14] is None else int(raw[14]),
            # Files written before requeue existed have 15 fields.
            requeueable=bool(raw[15]) if len(raw) > 15 else True,
            requeues=int(raw[16]) if len(raw) > 16 else 0,
            # Files written before pending work existed: queued since submitted.
            queued_at=_parse_ts(raw[17]) if len(raw) > 17 else None,
            # Files written before job loads existed: the job used its whole nodes.
            gpus=None if len(raw) <= 18 or raw[18] is None else int(raw[18]),
        )


@dataclass
class DemandFeed:
    """A demand trace being fed into one cluster: ``jobs[next:]`` have yet to arrive, each
    at ``start + arrive_s``, as a job of ``ceil(gpus / gpus_per_node)`` whole nodes."""

    feed_id: int
    cluster_id: str
    start: dt.datetime
    gpus_per_node: int
    jobs: list[TraceJob]
    next: int = 0

    def arrival(self, index: int) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.jobs[index].arrive_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.feed_id,
            "cluster_id": self.cluster_id,
            "start": _ts(self.start),
            "gpus_per_node": self.gpus_per_node,
            "jobs": [[j.id, j.arrive_s, j.gpus, j.duration_s] for j in self.jobs],
            "next": self.next,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> DemandFeed:
        return cls(
            feed_id=int(raw["id"]),
            cluster_id=str(raw["cluster_id"]),
            start=_req_ts(raw["start"]),
            gpus_per_node=int(raw["gpus_per_node"]),
            jobs=[TraceJob(str(i), float(a), int(g), float(d)) for i, a, g, d in raw["jobs"]],
            next=int(raw["next"]),
        )


@dataclass
class NodeFlags:
    """Workload-manager flags of one node, keyed by (cluster_id, node_name).

    Kept apart from the instance because they belong to the scheduler's node entry: a
    replaced host comes back under the same name still drained, as in Slurm.
    """

    drained: bool = False
    down: bool = False
    reason: str | None = None
