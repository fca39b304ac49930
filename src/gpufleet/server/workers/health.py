"""The health loop: silent nodes become ``unknown``; cluster health follows its nodes."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import or_, select

from gpufleet.core.enums import ClusterStatus, Health, NodeState, Severity
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow
from gpufleet.server.services.health import refresh_cluster_health
from gpufleet.server.services.node_health import set_node_health
from gpufleet.server.workers.base import LoopDeps, LoopService

ACTOR = "system:health"


class HealthLoop(LoopService):
    name = "health"

    def __init__(self, deps: LoopDeps, *, interval_s: float, staleness_s: float) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.staleness_s = staleness_s
        self.marked_unknown = 0

    async def run_once(self) -> None:
        now = self.clock.now()
        cutoff = now - dt.timedelta(seconds=self.staleness_s)
        async with self.db.transaction() as session:
            stale = (
                await session.execute(
                    select(NodeRow, ClusterRow.project_id)
                    .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
                    .where(
                        NodeRow.health != Health.UNKNOWN.value,
                        NodeRow.state.not_in([NodeState.REMOVED.value]),
                        or_(NodeRow.last_report_at.is_(None), NodeRow.last_report_at < cutoff),
                    )
                    .with_for_update(skip_locked=True, of=NodeRow)
                )
            ).all()
            unhealthy_by_finding = (
                set(
                    await session.scalars(
                        select(FindingRow.node_id).where(
                            FindingRow.node_id.in_([n.id for n, _ in stale]),
                            FindingRow.cleared_at.is_(None),
                            FindingRow.severity.in_(
                                [Severity.CRITICAL.value, Severity.FATAL.value]
                            ),
                        )
                    )
                )
                if stale
                else set()
            )
            for node, project_id in stale:
                silent = (
                    "never reported"
                    if node.last_report_at is None
                    else f"no report for {int((now - node.last_report_at).total_seconds())} s"
                )
                if node.id in unhealthy_by_finding:
                    # Known bad beats unknown: silence does not hide an open critical finding.
                    set_node_health(
                        session,
                        node=node,
                        project_id=project_id,
                        target=Health.UNHEALTHY,
                        actor=ACTOR,
                        now=now,
                        reason=f"an open critical finding; {silent}",
                    )
                    continue
                if set_node_health(
                    session,
                    node=node,
                    project_id=project_id,
                    target=Health.UNKNOWN,
                    actor=ACTOR,
                    now=now,
                    reason=silent,
                ):
                    self.marked_unknown += 1
        async with self.db.transaction() as session:
            clusters = (
                await session.scalars(
                    select(ClusterRow).where(
                        ClusterRow.status.not_in(
                            [ClusterStatus.DELETED.value, ClusterStatus.DELETING.value]
                        )
                    )
                )
            ).all()
            for cluster in clusters:
                await refresh_cluster_health(
                    session, cluster=cluster, staleness_s=self.staleness_s, now=now
                )
