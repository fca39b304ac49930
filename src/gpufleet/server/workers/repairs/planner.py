"""The repair planner: findings → recommendations, by the pure policy in ``core.repair``.

Each pass loads every cluster that has an open finding or a pending recommendation into
``ClusterFacts``, asks ``plan()`` what to do, reads the jobs on nodes about to get a new
recommendation (the evidence a human approves on), and applies the decisions in one
transaction per cluster, re-checking each against the rows as they are then.
Auto-approval goes through the same approval function as a human's, breaker and all.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from sqlalchemy import and_, or_, select, union
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus, EventKind, NodeState, RepairAction, RepairStatus
from gpufleet.core.repair.models import (
    OPEN_STATUSES,
    ClusterFacts,
    Decision,
    PolicyConfig,
    Propose,
    ProposeIncident,
    RepairKind,
    RepairSource,
    Resolve,
    Supersede,
    Update,
)
from gpufleet.core.repair.policy import plan
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.events import record_event
from gpufleet.server.services.repair_policy import (
    finding_fact,
    load_policy,
    node_fact,
    repair_fact,
)
from gpufleet.server.services.repairs import (
    approve_repair_row,
    create_repair,
    jobs_on_nodes_for_humans,
    switch_repair_status,
)
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)

ACTOR = "system:repair-policy"
AUTO_ACTOR = "system:auto-approve"
_LIVE = [ClusterStatus.READY.value, ClusterStatus.DEGRADED.value, ClusterStatus.PROVISIONING.value]
_GONE = [NodeState.REMOVED.value]


class RepairPlanner(LoopService):
    name = "repair-planner"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        default_policy: PolicyConfig | None = None,
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.default_policy = default_policy or PolicyConfig()
        self.decisions = 0

    async def run_once(self) -> None:
        async with self.db.session() as session:
            busy = union(
                select(FindingRow.cluster_id).where(FindingRow.cleared_at.is_(None)),
                select(RepairRow.cluster_id).where(RepairRow.status == RepairStatus.PROPOSED.value),
            ).subquery()
            cluster_ids = list(
                await session.scalars(
                    select(ClusterRow.id).where(
                        ClusterRow.id.in_(select(busy.c.cluster_id)),
                        ClusterRow.status.in_(_LIVE),
                    )
                )
            )
        for cluster_id in cluster_ids:
            try:
                await self.plan_cluster(cluster_id)
            except Exception:  # one cluster's trouble never stalls the others
                log.exception("repair planner: cluster %s failed this pass", cluster_id)

    async def plan_cluster(self, cluster_id: str) -> list[Decision]:
        now = self.clock.now()
        async with self.db.session() as session:
            cluster = await session.get(ClusterRow, cluster_id)
            if cluster is None:
                return []
            policy = await load_policy(
                session, project_id=cluster.project_id, default=self.default_policy
            )
            facts, nodes = await self._facts(session, cluster=cluster, policy=policy, now=now)
        decisions = plan(facts, policy, now=now)
        if not any(not _is_hold(d) for d in decisions):
            return decisions
        jobs = await self._jobs(cluster, nodes, decisions)
        async with self.db.transaction() as session:
            cluster_row = await session.get(ClusterRow, cluster_id, with_for_update=True)
            if cluster_row is None:
                return decisions
            for decision in decisions:
                await self._apply(
                    session, cluster=cluster_row, policy=policy, decision=decision,
                    nodes=nodes, jobs=jobs, now=now,
                )  # fmt: skip
        return decisions

    async def _facts(
        self, session: AsyncSession, *, cluster: ClusterRow, policy: PolicyConfig, now: dt.datetime
    ) -> tuple[ClusterFacts, dict[str, NodeRow]]:
        window = now - dt.timedelta(seconds=max(policy.ladder_window_s, policy.cooldown_s))
        nodes = {
            n.id: n
            for n in await session.scalars(
                select(NodeRow).where(NodeRow.cluster_id == cluster.id, NodeRow.state.not_in(_GONE))
            )
        }
        repairs = list(
            await session.scalars(
                select(RepairRow).where(
                    RepairRow.cluster_id == cluster.id,
                    or_(
                        RepairRow.status.in_([s.value for s in OPEN_STATUSES]),
                        # History (cooldown, the ladder) is of repairs for faults: a
                        # rollout's reinstall is planned maintenance, not a rung climbed.
                        and_(
                            RepairRow.finished_at >= window,
                            RepairRow.source != RepairSource.ROLLOUT.value,
                        ),
                    ),
                )
            )
        )
        named = sorted({str(f) for r in repairs for f in (r.finding_ids or [])})
        findings = list(
            await session.scalars(
                select(FindingRow).where(
                    FindingRow.cluster_id == cluster.id,
                    or_(
                        FindingRow.cleared_at.is_(None),
                        FindingRow.cleared_at >= now - dt.timedelta(seconds=policy.ladder_window_s),
                        FindingRow.id.in_(named),
                    ),
                )
            )
        )
        facts = ClusterFacts(
            cluster_id=cluster.id,
            nodes=tuple(node_fact(n) for n in nodes.values()),
            findings=tuple(finding_fact(f) for f in findings if f.node_id in nodes),
            repairs=tuple(repair_fact(r) for r in repairs),
            breaker_tripped=cluster.repair_breaker_tripped_at is not None,
            unsupported=self.drivers.unsupported_actions(cluster),
        )
        return facts, nodes

    async def _jobs(
        self, cluster: ClusterRow, nodes: dict[str, NodeRow], decisions: list[Decision]
    ) -> dict[str, list[dict[str, Any]]]:
        """The jobs on each node about to get a new recommendation (read outside any
        transaction; an unreadable scheduler is recorded as such)."""
        wanted = {d.node_id for d in decisions if isinstance(d, Propose) and d.node_id in nodes}
        ids = sorted(wanted)
        found = await jobs_on_nodes_for_humans(
            self.drivers, cluster=cluster, nodes=[nodes[i] for i in ids]
        )
        return dict(zip(ids, found, strict=True))

    async def _apply(
        self,
        session: AsyncSession,
        *,
        cluster: ClusterRow,
        policy: PolicyConfig,
        decision: Decision,
        nodes: dict[str, NodeRow],
        jobs: dict[str, list[dict[str, Any]]],
        now: dt.datetime,
    ) -> None:
        if isinstance(decision, Propose):
            await self._propose(
                session, cluster=cluster, policy=policy, decision=decision,
                node=nodes.get(decision.node_id), jobs=jobs.get(decision.node_id, []), now=now,
            )  # fmt: skip
        elif isinstance(decision, ProposeIncident):
            await self._incident(session, cluster=cluster, decision=decision, now=now)
        elif isinstance(decision, Update):
            await self._update(
                session, cluster=cluster, policy=policy, decision=decision, nodes=nodes, now=now
            )
        elif isinstance(decision, Resolve | Supersede):
            repair = await session.get(RepairRow, decision.repair_id, with_for_update=True)
            if repair is None or repair.status != RepairStatus.PROPOSED.value:
                return
            node = nodes.get(repair.node_id or "")
            target = (
                RepairStatus.RESOLVED if isinstance(decision, Resolve) else RepairStatus.SUPERSEDED
            )
            switch_repair_status(
                session,
                repair=repair,
                project_id=cluster.project_id,
                node_name=node.name if node else None,
                target=target,
                actor=ACTOR,
                reason=decision.reason,
                now=now,
            )
            self.decisions += 1

    async def _propose(
        self,
        session: AsyncSession,
        *,
        cluster: ClusterRow,
        policy: PolicyConfig,
        decision: Propose,
        node: NodeRow | None,
        jobs: list[dict[str, Any]],
        now: dt.datetime,
    ) -> None:
        if node is None:
            return
        clash = await session.scalar(
            select(RepairRow.id).where(
                RepairRow.node_id == node.id,
                RepairRow.status.in_([s.value for s in OPEN_STATUSES]),
            )
        )
        if clash is not None:
            return  # one open repair per node
        repair = create_repair(
            session,
            cluster=cluster,
            node=node,
            kind=RepairKind.NODE,
            source=RepairSource.POLICY,
            action=decision.action,
            signature_id=decision.signature_id,
            reason=decision.reason,
            rule=decision.rule,
            evidence={**decision.evidence, "jobs": jobs},
            finding_ids=decision.finding_ids,
            gpu_index=_gpu_index(decision),
            detail="waiting for an admin's approval",
            actor=ACTOR,
            now=now,
        )
        self.decisions += 1
        if decision.auto_approve:
            await self._auto_approve(session, repair=repair, cluster=cluster, node=node,
                                     policy=policy, now=now)  # fmt: skip

    async def _auto_approve(
        self,
        session: AsyncSession,
        *,
        repair: RepairRow,
        cluster: ClusterRow,
        node: NodeRow | None,
        policy: PolicyConfig,
        now: dt.datetime,
    ) -> None:
        await session.flush()
        refusal = await approve_repair_row(
            session,
            repair=repair,
            cluster=cluster,
            node=node,
            policy=policy,
            actor=AUTO_ACTOR,
            reason=f"auto-approved by the project's policy ({repair.signature_id} → "
            f"{repair.action})",
            now=now,
        )
        if refusal is None:
            repair.auto_approved = True
        else:
            repair.detail = f"auto-approval held: {refusal}"

    async def _incident(
        self, session: AsyncSession, *, cluster: ClusterRow, decision: ProposeIncident,
        now: dt.datetime,
    ) -> None:  # fmt: skip
        clash = await session.scalar(
            select(RepairRow.id).where(
                RepairRow.cluster_id == cluster.id,
                RepairRow.incident_key == decision.incident_key,
                RepairRow.status == RepairStatus.PROPOSED.value,
            )
        )
        if clash is not None:
            return
        create_repair(
            session,
            cluster=cluster,
            node=None,
            kind=RepairKind.INCIDENT,
            source=RepairSource.POLICY,
            action=RepairAction.NONE,
            signature_id=decision.signature_id,
            reason=decision.reason,
            rule=decision.rule,
            evidence=decision.evidence,
            finding_ids=decision.finding_ids,
            node_ids=decision.node_ids,
            incident_key=decision.incident_key,
            detail="infrastructure incident: inspect the shared component",
            actor=ACTOR,
            now=now,
        )
        self.decisions += 1

    async def _update(
        self,
        session: AsyncSession,
        *,
        cluster: ClusterRow,
        policy: PolicyConfig,
        decision: Update,
        nodes: dict[str, NodeRow],
        now: dt.datetime,
    ) -> None:
        repair = await session.get(RepairRow, decision.repair_id, with_for_update=True)
        if repair is None or repair.status != RepairStatus.PROPOSED.value:
            return
        old = repair.action
        repair.action = decision.action.value
        repair.signature_id = decision.signature_id
        repair.finding_ids = list(decision.finding_ids)
        if decision.node_ids:
            repair.node_ids = list(decision.node_ids)
        repair.reason = decision.reason
        repair.rule = decision.rule
        repair.evidence = {**decision.evidence, "jobs": (repair.evidence or {}).get("jobs", [])}
        if decision.escalated_from is not None:
            repair.escalated_from = decision.escalated_from.value
        repair.updated_at = now
        node = nodes.get(repair.node_id or "")
        where = f"node {node.name}" if node else f"incident {repair.incident_key}"
        message = (
            f"{where}: recommendation escalated in place {old} → {decision.action.value}: "
            f"{decision.reason}"
            if decision.escalated_from is not None
            else f"{where}: recommendation {repair.action} now rests on "
            f"{len(decision.finding_ids)} finding(s)"
        )
        record_event(
            session,
            kind=EventKind.REPAIR_UPDATED,
            message=message,
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=repair.node_id,
            actor=ACTOR,
            data={"repair_id": repair.id, "from": old, "to": decision.action.value},
            ts=now,
        )
        self.decisions += 1
        if decision.auto_approve and not repair.auto_approved:
            await self._auto_approve(
                session, repair=repair, cluster=cluster, node=node, policy=policy, now=now
            )


def _is_hold(decision: Decision) -> bool:
    return not isinstance(decision, Propose | ProposeIncident | Update | Resolve | Supersede)


def _gpu_index(decision: Propose) -> int | None:
    """The GPU a reset_gpu repair resets: the one its findings name, if they name one."""
    if decision.action is not RepairAction.RESET_GPU:
        return None
    findings = decision.evidence.get("findings", [])
    indexes = {f.get("gpu_index") for f in findings if isinstance(f, dict)}
    return indexes.pop() if len(indexes) == 1 and None not in indexes else None
