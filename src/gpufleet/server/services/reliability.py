"""The reliability report: the history of the caller's nodes read from the store —
their state changes (the ``node.state`` events every transition writes), findings,
repairs and failed jobs — and handed to ``core.reliability`` to sum."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, NodeState
from gpufleet.core.errors import InvalidInput
from gpufleet.core.rbac import Permission
from gpufleet.core.reliability import (
    FAILED_JOB_STATES,
    FindingSpan,
    JobSpan,
    NodeHistory,
    ReliabilityReport,
    RepairSpan,
    StateChange,
    gpu_model_of,
    reliability_report,
)
from gpufleet.server.db.tables import (
    ClusterRow,
    EventRow,
    FindingRow,
    GpuRow,
    JobRow,
    NodeRow,
    ProjectRow,
    RepairRow,
)
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.projects import get_project_row_or_error

MAX_SPAN = dt.timedelta(days=366)
# How far before the window the cause of an outage already under way is looked for.
LOOKBACK = dt.timedelta(days=30)
_CHUNK = 500  # ids per IN (...): SQLite's and PostgreSQL's limits stay far away


async def reliability(
    session: AsyncSession,
    *,
    caller: Caller,
    since: dt.datetime,
    until: dt.datetime,
    project_ref: str | None = None,
    cluster_id: str | None = None,
) -> ReliabilityReport:
    if until <= since:
        raise InvalidInput("until must be after since", field="until")
    if until - since > MAX_SPAN:
        raise InvalidInput("at most 366 days per report", field="since")
    clusters = select(ClusterRow.id, ClusterRow.name, ProjectRow.name).join(
        ProjectRow, ProjectRow.id == ClusterRow.project_id
    )
    visible = caller.visible_project_ids()
    if visible is not None:
        readable = [p for p in visible if caller.can(Permission.REPAIR_READ, p)]
        clusters = clusters.where(ClusterRow.project_id.in_(readable))
    if project_ref is not None:
        project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
        clusters = clusters.where(ClusterRow.project_id == project.id)
    if cluster_id is not None:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        clusters = clusters.where(ClusterRow.id == cluster.id)
    names = {cid: f"{p}/{c}" for cid, c, p in (await session.execute(clusters)).all()}
    nodes = await _nodes(session, names, since=since, until=until)
    node_ids = [n.node_id for n in nodes]
    return reliability_report(
        nodes=nodes,
        findings=await _findings(session, node_ids, since=since, until=until),
        repairs=await _repairs(session, list(names), set(node_ids), since=since, until=until),
        jobs=await _jobs(session, list(names), since=since, until=until),
        since=since,
        until=until,
    )


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)]


async def _nodes(
    session: AsyncSession, cluster_names: dict[str, str], *, since: dt.datetime, until: dt.datetime
) -> list[NodeHistory]:
    rows: list[NodeRow] = []
    for chunk in _chunks(list(cluster_names)):
        rows += (
            await session.scalars(
                select(NodeRow).where(
                    NodeRow.cluster_id.in_(chunk),
                    NodeRow.created_at < until,
                    or_(NodeRow.removed_at.is_(None), NodeRow.removed_at >= since),
                )
            )
        ).all()
    models: dict[str, list[str | None]] = defaultdict(list)
    changes: dict[str, list[StateChange]] = defaultdict(list)
    for chunk in _chunks([n.id for n in rows]):
        for node_id, model in await session.execute(
            select(GpuRow.node_id, GpuRow.model).where(GpuRow.node_id.in_(chunk))
        ):
            models[node_id].append(model)
        events = await session.execute(
            select(EventRow.node_id, EventRow.ts, EventRow.data)
            .where(
                EventRow.kind == EventKind.NODE_STATE.value,
                EventRow.node_id.in_(chunk),
                EventRow.ts < until,
            )
            .order_by(EventRow.id)
        )
        for node_id, ts, data in events:
            change = _change(ts, data)
            if node_id is not None and change is not None:
                changes[node_id].append(change)
    return [
        NodeHistory(
            node_id=row.id,
            name=row.name,
            cluster=cluster_names[row.cluster_id],
            host=row.serial or row.hostname or f"{cluster_names[row.cluster_id]}/{row.name}",
            gpus=row.expected_gpus,
            gpu_model=gpu_model_of(models[row.id]),
            created_at=_utc(row.created_at),
            removed_at=None if row.removed_at is None else _utc(row.removed_at),
            state=NodeState(row.state),
            changes=tuple(sorted(changes[row.id], key=lambda c: c.ts)),
        )
        for row in rows
    ]


def _change(ts: dt.datetime, data: object) -> StateChange | None:
    """A ``node.state`` event's move; None for one that names no known states."""
    if not isinstance(data, dict):
        return None
    try:
        return StateChange(_utc(ts), NodeState(str(data["from"])), NodeState(str(data["to"])))
    except KeyError:
        return None
    except ValueError:
        return None


async def _findings(
    session: AsyncSession, node_ids: Sequence[str], *, since: dt.datetime, until: dt.datetime
) -> list[FindingSpan]:
    spans: list[FindingSpan] = []
    for chunk in _chunks(node_ids):
        rows = await session.execute(
            select(
                FindingRow.node_id,
                FindingRow.signature_id,
                FindingRow.severity,
                FindingRow.first_seen,
                FindingRow.cleared_at,
            ).where(
                FindingRow.node_id.in_(chunk),
                FindingRow.first_seen < until,
                or_(FindingRow.cleared_at.is_(None), FindingRow.cleared_at >= since - LOOKBACK),
            )
        )
        spans += [
            FindingSpan(n, sig, sev, _utc(first), None if cleared is None else _utc(cleared))
            for n, sig, sev, first, cleared in rows
        ]
    return spans


async def _repairs(
    session: AsyncSession,
    cluster_ids: Sequence[str],
    node_ids: set[str],
    *,
    since: dt.datetime,
    until: dt.datetime,
) -> list[RepairSpan]:
    spans: list[RepairSpan] = []
    for chunk in _chunks(cluster_ids):
        rows = await session.scalars(
            select(RepairRow).where(
                RepairRow.cluster_id.in_(chunk),
                RepairRow.created_at < until,
                or_(RepairRow.finished_at.is_(None), RepairRow.finished_at >= since - LOOKBACK),
            )
        )
        for row in rows:
            members = [row.node_id] if row.node_id else [str(n) for n in row.node_ids or ()]
            spans.append(
                RepairSpan(
                    row.id,
                    tuple(n for n in members if n in node_ids),
                    row.signature_id,
                    _utc(row.created_at),
                    None if row.finished_at is None else _utc(row.finished_at),
                )
            )
    return spans


async def _jobs(
    session: AsyncSession, cluster_ids: Sequence[str], *, since: dt.datetime, until: dt.datetime
) -> list[JobSpan]:
    """Failed jobs that ended in the window, their node names turned into node ids."""
    spans: list[JobSpan] = []
    for chunk in _chunks(cluster_ids):
        jobs = (
            await session.scalars(
                select(JobRow).where(
                    JobRow.cluster_id.in_(chunk),
                    JobRow.ended_at >= since,
                    JobRow.ended_at < until,
                    func.upper(JobRow.state).in_(sorted(FAILED_JOB_STATES)),
                )
            )
        ).all()
        if not jobs:
            continue
        by_name: dict[tuple[str, str], str] = {}
        for node_id, cid, *known in await session.execute(
            select(NodeRow.id, NodeRow.cluster_id, NodeRow.name, NodeRow.scheduler_name,
                   NodeRow.hostname).where(NodeRow.cluster_id.in_({j.cluster_id for j in jobs}))
        ):  # fmt: skip
            for name in known:
                if name:
                    by_name.setdefault((cid, name), node_id)
        for job in jobs:
            assert job.ended_at is not None  # selected on it
            spans.append(
                JobSpan(
                    job.id,
                    tuple(
                        by_name[(job.cluster_id, str(n))]
                        for n in job.nodes or ()
                        if (job.cluster_id, str(n)) in by_name
                    ),
                    job.state,
                    None if job.started_at is None else _utc(job.started_at),
                    _utc(job.ended_at),
                    job.gpu_hours,
                )
            )
    return spans


def _utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
