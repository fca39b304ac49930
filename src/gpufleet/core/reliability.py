"""Badput: where a fleet's GPU-hours went, read from its own history.

The unit is an **outage**: a node leaves service (cordoned, draining, drained,
repairing, failed, removing — and acceptance when a repaired node is tested again) and
ends when it is back in service, when it is removed, or not yet. Its GPU-hours lost are
the node's GPUs times the outage's time inside the window asked for. Each outage is put
down to one **cause**, in this order:

1. the repair that was open on the node when it left service, else the first one
   proposed while it was out (its signature);
2. else the worst finding open on the node when it left (critical before warning,
   oldest first);
3. else ``unattributed`` (an admin's cordon with nothing recorded behind it).

Detection is the earliest of: the first sighting of the cause's findings open when the
node left (or when the repair was proposed), the repair's proposal, the outage's start.
**MTTR** is the mean of detection → back in service over outages that ended in service
inside the window (a removed node was not repaired: it is counted, not timed). **MTBF**
is in-service node-hours over failures (outages with a cause) that started in the
window, per cluster and per host.

Jobs lost are counted apart (work thrown away, not capacity idled): a job that ended
failed (``FAILED``, ``NODE_FAIL``, Kubernetes ``Failed``) on a node where a critical
finding was first seen while it ran (or up to ``JOB_GRACE`` after) is put down to that
finding's signature. A job that failed on a healthy node is the job's own doing.

Everything here is pure: the server's ``services/reliability.py`` loads the history.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from gpufleet.core.enums import NodeState, Severity

N = NodeState
OUT_STATES = frozenset({N.CORDONED, N.DRAINING, N.DRAINED, N.REPAIRING, N.FAILED, N.REMOVING})
FAILED_JOB_STATES = frozenset({"FAILED", "NODE_FAIL", "BOOT_FAIL"})
JOB_GRACE = dt.timedelta(minutes=10)
UNATTRIBUTED = "unattributed"
MAX_OUTAGES = 200  # listed, newest first; the sums count them all
_SEVERITY_RANK = {Severity.CRITICAL.value: 0, Severity.WARNING.value: 1}


# -- history, as the store holds it -----------------------------------------------------


@dataclass(frozen=True)
class StateChange:
    ts: dt.datetime
    from_state: NodeState
    to_state: NodeState


@dataclass(frozen=True)
class NodeHistory:
    node_id: str
    name: str
    cluster: str
    host: str  # the machine: serial, else hostname, else the node's name
    gpus: int
    gpu_model: str  # "" when no GPU ever reported one
    created_at: dt.datetime
    removed_at: dt.datetime | None
    state: NodeState  # now: the state of a node with no recorded change
    changes: tuple[StateChange, ...]  # oldest first


@dataclass(frozen=True)
class FindingSpan:
    node_id: str
    signature: str
    severity: str
    first_seen: dt.datetime
    cleared_at: dt.datetime | None

    def open_at(self, ts: dt.datetime) -> bool:
        return self.first_seen <= ts and (self.cleared_at is None or self.cleared_at > ts)


@dataclass(frozen=True)
class RepairSpan:
    repair_id: str
    node_ids: tuple[str, ...]  # one node, or an incident's members
    signature: str
    created_at: dt.datetime
    finished_at: dt.datetime | None

    def open_at(self, ts: dt.datetime) -> bool:
        return self.created_at <= ts and (self.finished_at is None or self.finished_at >= ts)


@dataclass(frozen=True)
class JobSpan:
    job_id: str
    node_ids: tuple[str, ...]
    state: str
    started_at: dt.datetime | None
    ended_at: dt.datetime
    gpu_hours: float


# -- the report, as the API returns it ---------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


class Outage(_Out):
    node_id: str
    node: str
    cluster: str
    host: str
    gpus: int
    signature: str
    cause: str  # "repair" | "finding" | "unattributed"
    repair_id: str | None
    detected_at: dt.datetime
    out_at: dt.datetime
    back_at: dt.datetime | None  # None: removed, or still out
    ended: str  # "in_service" | "removed" | "ongoing"
    gpu_hours_lost: float  # inside the window


class BadputRow(_Out):
    """GPU-hours lost to one signature, GPU model or day."""

    key: str
    gpu_hours_lost: float
    job_gpu_hours_lost: float
    outages: int


class ReliabilityRow(_Out):
    """One cluster or host: what it lost, how often it failed, how fast it came back."""

    name: str
    cluster: str
    gpus: int
    node_hours: float  # present in the window
    gpu_hours_lost: float
    failures: int
    recovered: int
    removed: int
    mttr_h: float | None  # None: nothing came back in the window
    mtbf_h: float | None  # None: no failure in the window


class ReliabilityReport(_Out):
    """``GET /api/v1/reliability``: the window's badput, MTTR and MTBF."""

    since: dt.datetime
    until: dt.datetime
    gpu_hours: float  # capacity: every node's GPUs for its time in the window
    gpu_hours_lost: float
    job_gpu_hours_lost: float
    available_pct: float | None
    failures: int
    mttr_h: float | None
    mtbf_h: float | None
    by_signature: list[BadputRow]
    by_gpu_model: list[BadputRow]
    by_day: list[BadputRow]
    by_cluster: list[ReliabilityRow]
    by_host: list[ReliabilityRow]
    outages: list[Outage]  # newest first, at most MAX_OUTAGES
    outages_total: int


# -- the computation ----------------------------------------------------------------------


@dataclass
class _Episode:
    node: NodeHistory
    start: dt.datetime
    end: dt.datetime | None  # None: ongoing
    ended: str
    signature: str = UNATTRIBUTED
    cause: str = UNATTRIBUTED
    repair_id: str | None = None
    detected: dt.datetime | None = None


def _episodes(node: NodeHistory) -> list[_Episode]:
    """The node's outages, from its state changes (a change from an out state into
    acceptance keeps the outage open: a repaired node is tested before it serves)."""
    out: list[_Episode] = []
    current: _Episode | None = None
    state = node.changes[0].from_state if node.changes else node.state
    if state in OUT_STATES:
        current = _Episode(node, node.created_at, None, "ongoing")
    for change in node.changes:
        target = change.to_state
        if current is None:
            if target in OUT_STATES:
                current = _Episode(node, change.ts, None, "ongoing")
        elif target is N.IN_SERVICE:
            current.end, current.ended = change.ts, "in_service"
            out.append(current)
            current = None
        elif target is N.REMOVED or target is N.PROVISIONING:
            current.end, current.ended = change.ts, "removed"
            out.append(current)
            current = None
        state = target
    if current is not None:
        if node.removed_at is not None:
            current.end, current.ended = node.removed_at, "removed"
        out.append(current)
    return out


def _attribute(
    episode: _Episode,
    findings: Sequence[FindingSpan],
    repairs: Sequence[RepairSpan],
) -> None:
    start, end = episode.start, episode.end
    during = [
        r
        for r in repairs
        if (end is None or r.created_at <= end)
        and (r.finished_at is None or r.finished_at >= start)
    ]
    # The repair open when the node left; else the first one proposed while it was out.
    repair = min(
        during, key=lambda r: (not r.open_at(start), r.created_at, r.repair_id), default=None
    )
    if repair is not None:
        episode.signature, episode.cause, episode.repair_id = (
            repair.signature or UNATTRIBUTED,
            "repair",
            repair.repair_id,
        )
        # Detected when the repair's signature was first seen in the spell that led to it.
        cue = max(start, repair.created_at)
        seen = [
            f.first_seen
            for f in findings
            if f.signature == repair.signature and (f.open_at(start) or f.open_at(cue))
        ]
        episode.detected = min([*seen, repair.created_at, start])
        return
    open_then = [f for f in findings if f.open_at(start) and f.severity in _SEVERITY_RANK]
    if open_then:
        worst = min(open_then, key=lambda f: (_SEVERITY_RANK[f.severity], f.first_seen))
        episode.signature, episode.cause = worst.signature, "finding"
        episode.detected = worst.first_seen
        return
    episode.detected = start


def _clip(
    start: dt.datetime, end: dt.datetime | None, since: dt.datetime, until: dt.datetime
) -> float:
    """Seconds of [start, end) inside [since, until)."""
    lo, hi = max(start, since), min(end or until, until)
    return max(0.0, (hi - lo).total_seconds())


def _days(start: dt.datetime, end: dt.datetime, gpus: int) -> Iterable[tuple[str, float]]:
    """GPU-hours of [start, end) split at UTC midnights."""
    at = start
    while at < end:
        midnight = dt.datetime.combine(
            at.astimezone(dt.UTC).date() + dt.timedelta(days=1), dt.time(), dt.UTC
        )
        stop = min(end, midnight)
        yield at.astimezone(dt.UTC).date().isoformat(), gpus * (stop - at).total_seconds() / 3600
        at = stop


def _mean_h(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values) / 3600, 4) if values else None


@dataclass
class _Sum:
    lost: float = 0.0
    job_lost: float = 0.0
    outages: int = 0


@dataclass
class _Tally:
    """A cluster's or host's sums over the window."""

    name: str
    cluster: str
    gpus: int = 0
    present_s: float = 0.0
    out_s: float = 0.0
    lost: float = 0.0
    failures: int = 0
    recovered: int = 0
    removed: int = 0
    ttr: list[float] = field(default_factory=list)

    def row(self) -> ReliabilityRow:
        up_h = (self.present_s - self.out_s) / 3600
        return ReliabilityRow(
            name=self.name,
            cluster=self.cluster,
            gpus=self.gpus,
            node_hours=round(self.present_s / 3600, 4),
            gpu_hours_lost=round(self.lost, 4),
            failures=self.failures,
            recovered=self.recovered,
            removed=self.removed,
            mttr_h=_mean_h(self.ttr),
            mtbf_h=round(up_h / self.failures, 4) if self.failures else None,
        )


def reliability_report(
    *,
    nodes: Sequence[NodeHistory],
    findings: Sequence[FindingSpan],
    repairs: Sequence[RepairSpan],
    jobs: Sequence[JobSpan],
    since: dt.datetime,
    until: dt.datetime,
) -> ReliabilityReport:
    """The window [since, until)'s report over ``nodes`` and what happened to them."""
    findings_of: dict[str, list[FindingSpan]] = defaultdict(list)
    for finding in findings:
        findings_of[finding.node_id].append(finding)
    repairs_of: dict[str, list[RepairSpan]] = defaultdict(list)
    for repair in repairs:
        for node_id in repair.node_ids:
            repairs_of[node_id].append(repair)

    by_sig: dict[str, _Sum] = defaultdict(_Sum)
    by_model: dict[str, _Sum] = defaultdict(_Sum)
    by_day: dict[str, _Sum] = defaultdict(_Sum)
    clusters: dict[str, _Tally] = {}
    hosts: dict[str, _Tally] = {}
    fleet = _Tally("fleet", "")
    outages: list[Outage] = []
    capacity = 0.0  # GPU-hours

    for node in nodes:
        present = _clip(node.created_at, node.removed_at, since, until)
        if present <= 0:
            continue
        capacity += node.gpus * present / 3600
        tallies = (
            fleet,
            clusters.setdefault(node.cluster, _Tally(node.cluster, node.cluster)),
            hosts.setdefault(node.host, _Tally(node.host, node.cluster)),
        )
        for tally in tallies:
            tally.gpus += node.gpus
            tally.present_s += present
        model = node.gpu_model or "unknown"
        for episode in _episodes(node):
            inside = _clip(episode.start, episode.end, since, until)
            started_inside = since <= episode.start < until
            if inside <= 0 and not started_inside:
                continue
            _attribute(episode, findings_of[node.node_id], repairs_of[node.node_id])
            lost = node.gpus * inside / 3600
            ended_inside = episode.end is not None and since <= episode.end < until
            ttr = (
                (episode.end - (episode.detected or episode.start)).total_seconds()
                if episode.end is not None and ended_inside and episode.ended == "in_service"
                else None
            )
            for tally in tallies:
                tally.lost += lost
                tally.out_s += inside
                tally.failures += started_inside and episode.cause != UNATTRIBUTED
                tally.removed += ended_inside and episode.ended == "removed"
                if ttr is not None:
                    tally.recovered += 1
                    tally.ttr.append(ttr)
            for sums in (by_sig[episode.signature], by_model[model]):
                sums.lost += lost
                sums.outages += 1
            lo, hi = max(episode.start, since), min(episode.end or until, until)
            for day, hours in _days(lo, hi, node.gpus):
                by_day[day].lost += hours
            outages.append(
                Outage(
                    node_id=node.node_id,
                    node=node.name,
                    cluster=node.cluster,
                    host=node.host,
                    gpus=node.gpus,
                    signature=episode.signature,
                    cause=episode.cause,
                    repair_id=episode.repair_id,
                    detected_at=episode.detected or episode.start,
                    out_at=episode.start,
                    back_at=episode.end if episode.ended == "in_service" else None,
                    ended=episode.ended,
                    gpu_hours_lost=round(lost, 4),
                )
            )

    job_lost = 0.0
    node_by_id = {n.node_id: n for n in nodes}
    for job in jobs:
        if job.state.upper() not in FAILED_JOB_STATES or not since <= job.ended_at < until:
            continue
        ran_from = job.started_at or job.ended_at
        culprits = [
            f
            for node_id in job.node_ids
            for f in findings_of.get(node_id, ())
            if f.severity == Severity.CRITICAL.value
            and ran_from <= f.first_seen <= job.ended_at + JOB_GRACE
        ]
        if not culprits:
            continue
        first = min(culprits, key=lambda f: f.first_seen)
        culprit_node = node_by_id.get(first.node_id)
        job_lost += job.gpu_hours
        by_sig[first.signature].job_lost += job.gpu_hours
        by_model[
            (culprit_node.gpu_model if culprit_node else "") or "unknown"
        ].job_lost += job.gpu_hours
        by_day[job.ended_at.astimezone(dt.UTC).date().isoformat()].job_lost += job.gpu_hours

    outages.sort(key=lambda o: (o.out_at, o.node_id), reverse=True)
    total = fleet.row()
    return ReliabilityReport(
        since=since,
        until=until,
        gpu_hours=round(capacity, 4),
        gpu_hours_lost=total.gpu_hours_lost,
        job_gpu_hours_lost=round(job_lost, 4),
        available_pct=round(100.0 * (1 - fleet.lost / capacity), 4) if capacity else None,
        failures=total.failures,
        mttr_h=total.mttr_h,
        mtbf_h=total.mtbf_h,
        by_signature=_badput_rows(by_sig),
        by_gpu_model=_badput_rows(by_model),
        by_day=sorted(_badput_rows(by_day), key=lambda r: r.key),
        by_cluster=_tally_rows(clusters),
        by_host=_tally_rows(hosts),
        outages=outages[:MAX_OUTAGES],
        outages_total=len(outages),
    )


def _badput_rows(table: dict[str, _Sum]) -> list[BadputRow]:
    """Rows, most lost first."""
    made = [
        BadputRow(
            key=key,
            gpu_hours_lost=round(s.lost, 4),
            job_gpu_hours_lost=round(s.job_lost, 4),
            outages=s.outages,
        )
        for key, s in table.items()
    ]
    return sorted(made, key=lambda r: (-(r.gpu_hours_lost + r.job_gpu_hours_lost), r.key))


def _tally_rows(tallies: dict[str, _Tally]) -> list[ReliabilityRow]:
    rows = [t.row() for t in tallies.values()]
    return sorted(rows, key=lambda r: (-r.gpu_hours_lost, r.cluster, r.name))


def gpu_model_of(models: Iterable[str | None]) -> str:
    """A node's GPU model: the most common one its GPUs reported ("" for none)."""
    counted = Counter(m for m in models if m)
    return counted.most_common(1)[0][0] if counted else ""
