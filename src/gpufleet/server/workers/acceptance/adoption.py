"""Nodes that entered ``acceptance`` get a run: the cluster's open provisioning run
takes them in (its node-level checks start at once, while other machines still boot),
else a new run is made; on a cluster that opted out meanwhile they go straight into
service. A node the last run left in acceptance on purpose waits for an admin's run."""

from __future__ import annotations

import logging

from sqlalchemy import select

from gpufleet.core.acceptance import AcceptanceScope, AcceptanceTrigger
from gpufleet.core.clock import Clock
from gpufleet.core.enums import AcceptanceStage, ClusterStatus, NodeState
from gpufleet.core.repair.models import ACTIVE_STATUSES
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import AcceptanceRunRow, ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.acceptance import ACTOR, create_acceptance_run
from gpufleet.server.services.node_holds import release_in_scheduler
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.acceptance.context import release_node
from gpufleet.server.workers.base import guarded_apply

log = logging.getLogger(__name__)

COMING_UP = [ClusterStatus.PROVISIONING.value, ClusterStatus.ACCEPTANCE.value]


async def adopt_nodes(db: Database, *, clock: Clock, drivers: DriverRegistry) -> None:
    """Every node in ``acceptance`` belongs to a run that is not done."""
    async with db.session() as session:
        covered: set[str] = set()
        for node_ids in await session.scalars(
            select(AcceptanceRunRow.node_ids).where(
                AcceptanceRunRow.stage != AcceptanceStage.DONE.value
            )
        ):
            covered.update(str(n) for n in node_ids or [])
        # A node a repair put in acceptance is the repair's to move on (its run may
        # have ended a moment before the repair reads it).
        covered.update(
            str(n)
            for n in await session.scalars(
                select(RepairRow.node_id).where(
                    RepairRow.status.in_([s.value for s in ACTIVE_STATUSES]),
                    RepairRow.node_id.is_not(None),
                )
            )
        )
        rows = (
            await session.execute(
                select(NodeRow.id, NodeRow.cluster_id).where(
                    NodeRow.state == NodeState.ACCEPTANCE.value
                )
            )
        ).all()
    waiting: dict[str, list[str]] = {}
    for node_id, cluster_id in rows:
        if node_id not in covered:
            waiting.setdefault(cluster_id, []).append(node_id)
    for cluster_id, node_ids in waiting.items():
        try:
            await _adopt(db, cluster_id, node_ids, clock=clock, drivers=drivers)
        except Exception:
            log.exception("acceptance: cluster %s: adopting nodes failed", cluster_id)


async def _left_in_acceptance(db: Database, cluster_ids: list[str]) -> set[str]:
    """Nodes the last run that tested them left in acceptance on purpose (a failure
    pinned on nobody, a skip): they wait for an admin's run, not for another
    automatic one (which would fail the same way, forever)."""
    async with db.session() as session:
        # Not the report column: it is the big one.
        runs = (
            await session.execute(
                select(
                    AcceptanceRunRow.node_ids,
                    AcceptanceRunRow.results,
                    AcceptanceRunRow.status,
                )
                .where(
                    AcceptanceRunRow.cluster_id.in_(cluster_ids),
                    AcceptanceRunRow.stage == AcceptanceStage.DONE.value,
                    AcceptanceRunRow.trigger != AcceptanceTrigger.REPAIR.value,
                )
                .order_by(AcceptanceRunRow.id.desc())
            )
        ).all()
    seen: set[str] = set()
    left: set[str] = set()
    for node_ids, results, status in runs:  # newest first: a node's last run decides
        outcomes = (results or {}).get("nodes") or {}
        for node_id in node_ids or []:
            if node_id in seen:
                continue
            seen.add(node_id)
            outcome = (outcomes.get(node_id) or {}).get("outcome")
            if status != "cancelled" and outcome not in ("pass", "warn"):
                left.add(node_id)
    return left


async def _adopt(
    db: Database, cluster_id: str, node_ids: list[str], *, clock: Clock, drivers: DriverRegistry
) -> None:
    async with db.session() as session:
        cluster = await session.get(ClusterRow, cluster_id)
    if cluster is None:
        return
    if not cluster.acceptance_tests:
        await _release(db, cluster, node_ids, clock=clock, drivers=drivers)
        return
    left = await _left_in_acceptance(db, [cluster_id])
    node_ids = [n for n in node_ids if n not in left]
    if not node_ids:
        return
    async with db.transaction() as session:
        locked = await session.get(ClusterRow, cluster_id, with_for_update=True)
        if locked is None:
            return
        nodes = list(
            await session.scalars(
                select(NodeRow).where(
                    NodeRow.id.in_(node_ids), NodeRow.state == NodeState.ACCEPTANCE.value
                )
            )
        )
        busy: set[str] = set()
        for ids in await session.scalars(
            select(AcceptanceRunRow.node_ids).where(
                AcceptanceRunRow.cluster_id == cluster_id,
                AcceptanceRunRow.stage != AcceptanceStage.DONE.value,
            )
        ):
            busy.update(str(n) for n in ids or [])
        nodes = [n for n in nodes if n.id not in busy]
        if not nodes:
            return
        now = clock.now()
        coming_up = locked.status in COMING_UP
        open_run = (
            await session.scalar(
                select(AcceptanceRunRow)
                .where(
                    AcceptanceRunRow.cluster_id == cluster_id,
                    AcceptanceRunRow.trigger == AcceptanceTrigger.PROVISIONING.value,
                    AcceptanceRunRow.stage == AcceptanceStage.NODE.value,
                )
                .order_by(AcceptanceRunRow.id.desc())
                .limit(1)
                .with_for_update()
            )
            if coming_up
            else None
        )
        if open_run is not None:
            open_run.node_ids = [*open_run.node_ids, *(n.id for n in nodes)]
            per_node = dict((open_run.results or {}).get("nodes") or {})
            for n in nodes:
                per_node[n.id] = {"outcome": "pending", "reasons": []}
            open_run.results = {**(open_run.results or {}), "nodes": per_node}
            open_run.updated_at = now
            return
        create_acceptance_run(
            session,
            cluster=locked,
            # A cluster coming up is tested as a whole; a node joining a running
            # cluster (a retry, a grow) gets the node-level checks.
            scope=AcceptanceScope.CLUSTER if coming_up else AcceptanceScope.NODE,
            trigger=AcceptanceTrigger.PROVISIONING,
            node_ids=[n.id for n in nodes],
            node_names=[n.name for n in nodes],
            actor=ACTOR,
            now=now,
        )


def _in_acceptance(row: NodeRow) -> bool:
    return row.state == NodeState.ACCEPTANCE.value


async def _release(
    db: Database, cluster: ClusterRow, node_ids: list[str], *, clock: Clock, drivers: DriverRegistry
) -> None:
    """The cluster opted out while these nodes waited for acceptance: in service
    (cordoned, when someone else's drain is on the node)."""
    scheduler = scheduler_for(drivers, cluster)
    async with db.session() as session:
        nodes = list(await session.scalars(select(NodeRow).where(NodeRow.id.in_(node_ids))))
    for node in nodes:
        release = await release_in_scheduler(scheduler, node.scheduler_name or node.name)
        if not release.settled:  # an unreachable scheduler: next pass
            log.warning("acceptance: resume of %s failed: %s", node.name, release.error)
            continue
        async with guarded_apply(
            db, row_type=NodeRow, row_id=node.id, guard=_in_acceptance, clock=clock
        ) as applied:
            if applied is None:
                continue
            # Someone else's drain stays: cordoned with whose, as at gating.
            release_node(
                applied.session, applied.row, cluster, release,
                "acceptance tests turned off for the cluster",
                kept_detail="acceptance tests turned off", now=applied.now,
            )  # fmt: skip
