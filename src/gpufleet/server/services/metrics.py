"""``GET /metrics``: the fleet as Prometheus reads it, from the store at scrape time.

Every gauge here is a few aggregate queries (``GROUP BY`` over nodes, findings and
repairs) plus one row per live node for its report age, so a scrape costs the same
whatever the history and every replica answers alike (query one replica, or take
``max without (instance)``). What only a process sees (API latency, loop passes, repair
step times, the ingest's counters) comes from ``server/metrics.py`` and the ingestor.

Labels are names (project, cluster, node, hostname), states, signatures and actions:
never an id, a token or anything from a credential.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, Executable, Float, SQLColumnExpression, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet import __version__
from gpufleet.core.enums import ClusterStatus, Health, NodeState, RepairStatus
from gpufleet.core.errors import Unavailable
from gpufleet.core.transitions import REPAIR_TRANSITIONS
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow, ProjectRow, RepairRow
from gpufleet.server.metrics import REGISTRY, IngestCounts

MIN_TOKEN_CHARS = 32
# A repair is open while its status has somewhere to go.
OPEN_REPAIR_STATUSES = tuple(s.value for s, nxt in REPAIR_TRANSITIONS.items() if nxt)
# Nodes that left the fleet keep their rows (history); they are not counted.
COUNTED_NODE_STATES = tuple(s.value for s in NodeState if s is not NodeState.REMOVED)


def scrape_token_matches(token_file: Path | None, token: str) -> bool:
    """Whether ``token`` is the scrape token in ``token_file`` (False when none is set).

    Read at every scrape, so the file rotates without a restart; compared as SHA-256
    digests in constant time. A file that cannot be read or holds a short token is the
    operator's to fix: ``Unavailable`` names the file, never its content.
    """
    if token_file is None:
        return False
    try:
        expected = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise Unavailable(f"metrics_token_file {token_file}: {exc.strerror}") from exc
    if len(expected) < MIN_TOKEN_CHARS:
        raise Unavailable(
            f"metrics_token_file {token_file} holds fewer than {MIN_TOKEN_CHARS} characters; "
            "put a random token there (e.g. `openssl rand -hex 32`)"
        )
    return hmac.compare_digest(
        hashlib.sha256(token.encode()).digest(), hashlib.sha256(expected.encode()).digest()
    )


async def render_metrics(
    db: Database, *, now: dt.datetime, mttr_window_s: float, ingest: IngestCounts
) -> bytes:
    """The exposition text: the process's instruments, then the fleet read now."""
    started = time.perf_counter()
    families = await fleet_metrics(db, now=now, mttr_window_s=mttr_window_s)
    collect = GaugeMetricFamily(
        "gpufleet_metrics_collect_duration_seconds",
        "Time this scrape spent reading the fleet from the store.",
        value=time.perf_counter() - started,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families, *ingest_metrics(ingest), collect]))
    return generate_latest(REGISTRY) + generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def ingest_metrics(ingest: IngestCounts) -> list[Metric]:
    """The agent report ingest's counters (this process, since it started)."""
    return [
        CounterMetricFamily(
            "gpufleet_agent_reports_accepted",
            "Agent reports stored (each batch holds one or more).",
            value=ingest.reports,
        ),
        CounterMetricFamily(
            "gpufleet_agent_report_batches",
            "Agent report batches stored and acknowledged.",
            value=ingest.batches,
        ),
        CounterMetricFamily(
            "gpufleet_ingest_group_commits",
            "Transactions the ingest writer committed (one per group of batches).",
            value=ingest.groups,
        ),
        CounterMetricFamily(
            "gpufleet_ingest_failures",
            "Report batches the store refused even alone (the agent retries them).",
            value=ingest.failures,
        ),
    ]


async def fleet_metrics(db: Database, *, now: dt.datetime, mttr_window_s: float) -> list[Metric]:
    """The fleet's gauges as of ``now``. The queries run outside a transaction
    (``Database.reader``: on SQLite a transaction holds the write lock) and the families
    are built after the session closed."""
    since = now - dt.timedelta(seconds=mttr_window_s)
    async with db.reader() as session:
        rows = await _read_fleet(session, since=since, sqlite=db.is_sqlite)
    clusters = {
        cid: _Cluster(
            project=project,
            name=name,
            live=status != ClusterStatus.DELETED,
            breaker_tripped=tripped is not None,
            pending_gpus=pending,
            pending_age_s=None if read_at is None else _age(now, read_at),
        )
        for cid, name, status, tripped, project, pending, read_at in rows.clusters
    }
    return [
        *_node_counts(rows.nodes, clusters),
        _open_findings(rows.findings, clusters),
        _repairs(rows.repairs, clusters),
        _oldest_open_steps(rows.open_steps, clusters, now=now),
        *_mttr(rows.recoveries, clusters),
        _breakers(clusters),
        *_pending_demand(clusters),
        _report_ages(rows.report_ages, clusters, now=now),
        _build_info(),
    ]


@dataclass(frozen=True)
class _Cluster:
    project: str
    name: str
    live: bool  # not deleted: its zero counts are shown too
    breaker_tripped: bool
    pending_gpus: int | None = None  # None: its scheduler was never read
    pending_age_s: float | None = None


@dataclass(frozen=True)
class _FleetRows:
    """What the queries returned, as rows (see each query for its columns)."""

    clusters: Sequence[tuple[Any, ...]]
    nodes: Sequence[tuple[Any, ...]]
    findings: Sequence[tuple[Any, ...]]
    repairs: Sequence[tuple[Any, ...]]
    open_steps: Sequence[tuple[Any, ...]]
    recoveries: Sequence[tuple[Any, ...]]
    report_ages: Sequence[tuple[Any, ...]]


async def _read_fleet(session: AsyncSession, *, since: dt.datetime, sqlite: bool) -> _FleetRows:
    async def rows(query: Executable) -> Sequence[tuple[Any, ...]]:
        return [tuple(row) for row in await session.execute(query)]

    entered = func.min(func.coalesce(RepairRow.step_started_at, RepairRow.created_at))
    took = _seconds_between(RepairRow.created_at, RepairRow.finished_at, sqlite=sqlite)
    return _FleetRows(
        clusters=await rows(
            select(
                ClusterRow.id,
                ClusterRow.name,
                ClusterRow.status,
                ClusterRow.repair_breaker_tripped_at,
                ProjectRow.name,
                ClusterRow.pending_gpus,
                ClusterRow.pending_read_at,
            ).join(ProjectRow, ProjectRow.id == ClusterRow.project_id)
        ),
        nodes=await rows(
            select(NodeRow.cluster_id, NodeRow.state, NodeRow.health, func.count())
            .where(NodeRow.state.in_(COUNTED_NODE_STATES))
            .group_by(NodeRow.cluster_id, NodeRow.state, NodeRow.health)
        ),
        findings=await rows(
            select(
                FindingRow.cluster_id, FindingRow.signature_id, FindingRow.severity, func.count()
            )
            .where(FindingRow.cleared_at.is_(None))
            .group_by(FindingRow.cluster_id, FindingRow.signature_id, FindingRow.severity)
        ),
        repairs=await rows(
            select(RepairRow.cluster_id, RepairRow.status, RepairRow.action, func.count()).group_by(
                RepairRow.cluster_id, RepairRow.status, RepairRow.action
            )
        ),
        open_steps=await rows(
            select(RepairRow.cluster_id, RepairRow.status, RepairRow.action, entered)
            .where(RepairRow.status.in_(OPEN_REPAIR_STATUSES))
            .group_by(RepairRow.cluster_id, RepairRow.status, RepairRow.action)
        ),
        recoveries=await rows(
            select(RepairRow.cluster_id, RepairRow.action, func.count(), func.avg(took))
            .where(
                RepairRow.status == RepairStatus.SUCCEEDED.value,
                RepairRow.finished_at >= since,
            )
            .group_by(RepairRow.cluster_id, RepairRow.action)
        ),
        # One row per live node: the series count is the fleet's size, by design.
        report_ages=await rows(
            select(
                NodeRow.cluster_id,
                NodeRow.name,
                NodeRow.hostname,
                NodeRow.state,
                func.coalesce(NodeRow.last_report_at, NodeRow.created_at),
            ).where(NodeRow.state.in_(COUNTED_NODE_STATES))
        ),
    )


def _seconds_between(
    start: SQLColumnExpression[dt.datetime],
    end: SQLColumnExpression[dt.datetime | None],
    *,
    sqlite: bool,
) -> ColumnElement[float]:
    """``end - start`` in seconds, in SQL (SQLite keeps datetimes as ISO text)."""
    if sqlite:
        return cast((func.julianday(end) - func.julianday(start)) * 86400.0, Float)
    return cast(func.extract("epoch", end - start), Float)


def _where(clusters: dict[str, _Cluster], cluster_id: str) -> list[str]:
    found = clusters.get(cluster_id)
    return [found.project, found.name] if found else ["", ""]  # a cluster made just now


def _node_counts(
    rows: Sequence[tuple[Any, ...]], clusters: dict[str, _Cluster]
) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    by_state: dict[tuple[str, str], int] = defaultdict(int)
    by_health: dict[tuple[str, str], int] = defaultdict(int)
    for cluster_id, state, health, count in rows:
        by_state[cluster_id, state] += count
        by_health[cluster_id, health] += count
    # Every state of every live cluster, zeros too: an alert on a count never sees its
    # series vanish when the last node leaves a state.
    for cluster_id, cluster in clusters.items():
        if cluster.live:
            for state in COUNTED_NODE_STATES:
                by_state.setdefault((cluster_id, state), 0)
            for health in Health:
                by_health.setdefault((cluster_id, health.value), 0)
    states = GaugeMetricFamily(
        "gpufleet_nodes_by_state",
        "Nodes by lifecycle state (removed nodes are not counted).",
        labels=["project", "cluster", "state"],
    )
    for (cluster_id, state), count in sorted(by_state.items()):
        states.add_metric([*_where(clusters, cluster_id), state], count)
    healths = GaugeMetricFamily(
        "gpufleet_nodes_by_health",
        "Nodes by health (unknown: no report within the staleness window).",
        labels=["project", "cluster", "health"],
    )
    for (cluster_id, health), count in sorted(by_health.items()):
        healths.add_metric([*_where(clusters, cluster_id), health], count)
    return states, healths


def _open_findings(rows: Sequence[tuple[Any, ...]], clusters: dict[str, _Cluster]) -> Metric:
    family = GaugeMetricFamily(
        "gpufleet_findings_open",
        "Open findings (not cleared) by failure signature and severity.",
        labels=["project", "cluster", "signature", "severity"],
    )
    for cluster_id, signature, severity, count in sorted(rows):
        family.add_metric([*_where(clusters, cluster_id), signature, severity], count)
    return family


def _repairs(rows: Sequence[tuple[Any, ...]], clusters: dict[str, _Cluster]) -> Metric:
    family = GaugeMetricFamily(
        "gpufleet_repairs_by_status",
        "Repairs by status and action, ever (finished ones stay counted in their end status).",
        labels=["project", "cluster", "status", "action"],
    )
    for cluster_id, status, action, count in sorted(rows):
        family.add_metric([*_where(clusters, cluster_id), status, action], count)
    return family


def _oldest_open_steps(
    rows: Sequence[tuple[Any, ...]], clusters: dict[str, _Cluster], *, now: dt.datetime
) -> Metric:
    family = GaugeMetricFamily(
        "gpufleet_repair_oldest_step_age_seconds",
        "How long the open repair that has waited longest in its step has been there, by "
        "step (status) and action: a repair stuck in a step shows here.",
        labels=["project", "cluster", "status", "action"],
    )
    for cluster_id, status, action, since in sorted(rows, key=lambda r: r[:3]):
        family.add_metric([*_where(clusters, cluster_id), status, action], _age(now, since))
    return family


def _mttr(
    rows: Sequence[tuple[Any, ...]], clusters: dict[str, _Cluster]
) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    mean = GaugeMetricFamily(
        "gpufleet_repair_mttr_seconds",
        "Mean time to recover: from a repair's proposal to its success (the node back in "
        "service), over the repairs that succeeded within the MTTR window.",
        labels=["project", "cluster", "action"],
    )
    count = GaugeMetricFamily(
        "gpufleet_repair_recoveries",
        "Repairs that succeeded within the MTTR window (the weights of the mean: "
        "sum(mttr * recoveries) / sum(recoveries) is the fleet's MTTR).",
        labels=["project", "cluster", "action"],
    )
    for cluster_id, action, n, avg in sorted(rows, key=lambda r: r[:2]):
        labels = [*_where(clusters, cluster_id), action]
        count.add_metric(labels, n)
        mean.add_metric(labels, max(0.0, float(avg or 0.0)))
    return mean, count


def _breakers(clusters: dict[str, _Cluster]) -> Metric:
    family = GaugeMetricFamily(
        "gpufleet_repair_breaker_tripped",
        "1 while the cluster's repair circuit breaker is tripped (no new repairs start "
        "until an admin resets it).",
        labels=["project", "cluster"],
    )
    for cluster in sorted(clusters.values(), key=lambda c: (c.project, c.name)):
        if cluster.live:
            family.add_metric([cluster.project, cluster.name], int(cluster.breaker_tripped))
    return family


def _pending_demand(clusters: dict[str, _Cluster]) -> tuple[Metric, Metric]:
    demand = GaugeMetricFamily(
        "gpufleet_pending_gpu_demand",
        "GPUs the cluster's pending jobs wait for (jobs more nodes would start), as last "
        "read from its scheduler.",
        labels=["project", "cluster"],
    )
    age = GaugeMetricFamily(
        "gpufleet_pending_gpu_demand_age_seconds",
        "How long ago the pending GPU demand was read from the cluster's scheduler.",
        labels=["project", "cluster"],
    )
    for cluster in clusters.values():
        if cluster.live and cluster.pending_gpus is not None:
            demand.add_metric([cluster.project, cluster.name], cluster.pending_gpus)
            age.add_metric([cluster.project, cluster.name], cluster.pending_age_s or 0.0)
    return demand, age


def _report_ages(
    rows: Sequence[tuple[Any, ...]], clusters: dict[str, _Cluster], *, now: dt.datetime
) -> Metric:
    family = GaugeMetricFamily(
        "gpufleet_node_last_report_age_seconds",
        "Seconds since the node's agent last reported (since the node was created, if it "
        "never has). hostname is the agent's, to join with agent and DCGM series.",
        labels=["project", "cluster", "node", "hostname", "state"],
    )
    for cluster_id, name, hostname, state, last in sorted(rows, key=lambda r: r[:2]):
        family.add_metric(
            [*_where(clusters, cluster_id), name, hostname or name, state], _age(now, last)
        )
    return family


def _build_info() -> GaugeMetricFamily:
    family = GaugeMetricFamily("gpufleet_build_info", "The server's version.", labels=["version"])
    family.add_metric([__version__], 1)
    return family


def _age(now: dt.datetime, then: dt.datetime | str) -> float:
    """Seconds from ``then`` to ``now``. An aggregate's datetime may come back from
    SQLite as the stored text (no column type to convert it)."""
    parsed = dt.datetime.fromisoformat(then) if isinstance(then, str) else then
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return max(0.0, (now - parsed).total_seconds())
