"""The acceptance loop: startup scripts and acceptance runs, carried out step by step.

Each pass:

1. moves every open startup run one step (queue the next script, take in a result);
2. gives every node that entered ``acceptance`` a run: the cluster's open provisioning
   run takes it in (its node-level checks start at once, while other machines still
   boot), else a new run is made; on a cluster that opted out meanwhile the node goes
   straight into service;
3. moves every run that is not done one step (``AcceptanceSteps``): node-level check runs
   → once every node has a verdict and no machine is still booting, the cluster-wide
   check runs over the nodes that passed → the report (JSON + SHA-256) → gating: nodes
   in acceptance go in service (passed) or are cordoned (failed), and the cluster goes
   ready, degraded or stays in acceptance (``settle_cluster_status``);
4. makes a degraded cluster whose nodes are all back in service ready.

Level-triggered and crash-safe like the other loops: each step re-reads its rows under
lock in the transaction that applies it; the check runs of a step are created in the
transaction that records their ids; scheduler calls happen outside any transaction and
are idempotent. A server killed anywhere resumes the run where it was.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select

from gpufleet.core.acceptance import AcceptanceScope, AcceptanceTrigger
from gpufleet.core.enums import AcceptanceStage, ClusterStatus, NodeState
from gpufleet.core.repair.models import ACTIVE_STATUSES
from gpufleet.server.db.tables import AcceptanceRunRow, ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.acceptance import (
    ACTOR,
    create_acceptance_run,
    settle_cluster_status,
    settle_degraded,
)
from gpufleet.server.services.node_holds import release_in_scheduler
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.services.startup_scripts import advance_startup, open_startup_ids
from gpufleet.server.workers.acceptance_steps import AcceptanceSteps
from gpufleet.server.workers.base import LoopDeps

log = logging.getLogger(__name__)

_COMING_UP = [ClusterStatus.PROVISIONING.value, ClusterStatus.ACCEPTANCE.value]


class AcceptanceLoop(AcceptanceSteps):
    name = "acceptance"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        failpoints: Failpoints | None = None,
        concurrency: int = 16,
    ) -> None:
        super().__init__(deps, interval_s=interval_s, drivers=drivers, failpoints=failpoints)
        self._limit = asyncio.Semaphore(concurrency)

    async def run_once(self) -> None:
        await self._startups()
        await self._adopt_nodes()
        async with self.db.session() as session:
            run_ids = list(
                await session.scalars(
                    select(AcceptanceRunRow.id)
                    .where(AcceptanceRunRow.stage != AcceptanceStage.DONE.value)
                    .order_by(AcceptanceRunRow.id)
                )
            )
        await asyncio.gather(*(self._guarded(self.step_run(i), i) for i in run_ids))
        await self._settle_clusters()

    async def _guarded(self, work: object, what: str) -> None:
        assert asyncio.iscoroutine(work)
        async with self._limit:
            try:
                await work
            except Exception:  # one run's trouble never stalls the others
                log.exception("acceptance: step of %s failed", what)

    async def _startups(self) -> None:
        async with self.db.session() as session:
            ids = await open_startup_ids(session)
        await asyncio.gather(
            *(self._guarded(advance_startup(self.db, i, now=self.clock.now()), i) for i in ids)
        )
        if ids:
            self.failpoints.hit("acceptance.startup.after_step")

    # -- nodes that entered acceptance --------------------------------------------------

    async def _adopt_nodes(self) -> None:
        """Every node in ``acceptance`` belongs to a run that is not done."""
        async with self.db.session() as session:
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
                await self._adopt(cluster_id, node_ids)
            except Exception:
                log.exception("acceptance: cluster %s: adopting nodes failed", cluster_id)

    async def _left_in_acceptance(self, cluster_ids: list[str]) -> set[str]:
        """Nodes the last run that tested them left in acceptance on purpose (a failure
        pinned on nobody, a skip): they wait for an admin's run, not for another
        automatic one (which would fail the same way, forever)."""
        async with self.db.session() as session:
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

    async def _adopt(self, cluster_id: str, node_ids: list[str]) -> None:
        async with self.db.session() as session:
            cluster = await session.get(ClusterRow, cluster_id)
        if cluster is None:
            return
        if not cluster.acceptance_tests:
            await self._release(cluster, node_ids)
            return
        left = await self._left_in_acceptance([cluster_id])
        node_ids = [n for n in node_ids if n not in left]
        if not node_ids:
            return
        async with self.db.transaction() as session:
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
            now = self.clock.now()
            coming_up = locked.status in _COMING_UP
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

    async def _release(self, cluster: ClusterRow, node_ids: list[str]) -> None:
        """The cluster opted out while these nodes waited for acceptance: in service
        (cordoned, when someone else's drain is on the node)."""
        scheduler = scheduler_for(self.drivers, cluster)
        async with self.db.session() as session:
            nodes = list(await session.scalars(select(NodeRow).where(NodeRow.id.in_(node_ids))))
        for node in nodes:
            release = await release_in_scheduler(scheduler, node.scheduler_name or node.name)
            if not release.settled:  # an unreachable scheduler: next pass
                log.warning("acceptance: resume of %s failed: %s", node.name, release.error)
                continue
            async with self.db.transaction() as session:
                row = await session.get(NodeRow, node.id, with_for_update=True)
                if row is None or row.state != NodeState.ACCEPTANCE.value:
                    continue
                # Someone else's drain stays: cordoned with whose, as at gating.
                self.release_node(
                    session, row, cluster, release,
                    "acceptance tests turned off for the cluster",
                    kept_detail="acceptance tests turned off",
                )  # fmt: skip

    async def _settle_clusters(self) -> None:
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(ClusterRow.id).where(
                        ClusterRow.status.in_([*_COMING_UP, ClusterStatus.DEGRADED.value])
                    )
                )
            )
        for cluster_id in ids:
            try:
                async with self.db.transaction() as session:
                    cluster = await session.get(ClusterRow, cluster_id, with_for_update=True)
                    if cluster is None:
                        continue
                    now = self.clock.now()
                    if cluster.status == ClusterStatus.DEGRADED.value:
                        await settle_degraded(session, cluster=cluster, actor=ACTOR, now=now)
                    elif cluster.status == ClusterStatus.ACCEPTANCE.value:
                        await settle_cluster_status(session, cluster=cluster, actor=ACTOR, now=now)
            except Exception:
                log.exception("acceptance: settling cluster %s failed", cluster_id)
