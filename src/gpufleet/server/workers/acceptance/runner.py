"""The acceptance loop: startup scripts and acceptance runs, carried out step by step.

Each pass:

1. moves every open startup run one step (queue the next script, take in a result);
2. gives every node that entered ``acceptance`` a run (``adoption.py``);
3. moves every run that is not done one step, the step its stage names in ``STEPS``:
   ``node`` (``node_stage.py``: node-level check runs → once every node has a verdict
   and no machine is still booting, the cluster-wide check runs over the nodes that
   passed) → ``cluster`` (``cluster_stage.py``) → the report (``finishing.py``, JSON +
   SHA-256) → ``gating`` (``gating.py``: nodes in acceptance go in service (passed) or
   are cordoned (failed), and the cluster goes ready, degraded or stays in acceptance);
4. makes a degraded cluster whose nodes are all back in service ready.

Level-triggered and crash-safe like the other loops: each step's apply re-reads the run
under lock while it is still in the stage the step loaded it in (``ctx.locked()``); the
check runs of a step are created in the transaction that records their ids; scheduler
calls happen outside any transaction and are idempotent. A server killed anywhere
resumes the run where it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from sqlalchemy import select

from gpufleet.core.enums import AcceptanceStage, ClusterStatus
from gpufleet.server.db.tables import AcceptanceRunRow, ClusterRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.acceptance import ACTOR, settle_cluster_status, settle_degraded
from gpufleet.server.services.startup_scripts import advance_startup, open_startup_ids
from gpufleet.server.workers.acceptance.adoption import COMING_UP, adopt_nodes
from gpufleet.server.workers.acceptance.cluster_stage import cluster_stage
from gpufleet.server.workers.acceptance.context import AcceptanceContext, Loaded, stage_guard
from gpufleet.server.workers.acceptance.gating import gate
from gpufleet.server.workers.acceptance.node_stage import node_stage
from gpufleet.server.workers.base import LoopDeps, LoopService, Step, dispatch

log = logging.getLogger(__name__)

# A run's step, by stage (a done run has none).
STEPS: dict[AcceptanceStage, Step[AcceptanceContext, Loaded]] = {
    AcceptanceStage.NODE: node_stage,
    AcceptanceStage.CLUSTER: cluster_stage,
    AcceptanceStage.GATING: gate,
}


class AcceptanceLoop(LoopService):
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
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.failpoints = failpoints or Failpoints()
        self._limit = asyncio.Semaphore(concurrency)
        self.steps = 0

    async def run_once(self) -> None:
        await self._startups()
        await adopt_nodes(self.db, clock=self.clock, drivers=self.drivers)
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

    async def _guarded(self, work: Coroutine[Any, Any, object], what: str) -> None:
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

    async def step_run(self, run_id: str) -> None:
        """Take one run one step on. Safe to call again at any time."""
        async with self.db.session() as session:
            run = await session.get(AcceptanceRunRow, run_id)
            if run is None or run.stage == AcceptanceStage.DONE:
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            if cluster is None:
                return
        self.steps += 1
        stage = AcceptanceStage(run.stage)
        ctx = AcceptanceContext(
            db=self.db,
            clock=self.clock,
            row_type=AcceptanceRunRow,
            row_id=run_id,
            guard=stage_guard(stage),
            drivers=self.drivers,
            failpoints=self.failpoints,
        )
        await dispatch(STEPS, key=stage, ctx=ctx, loaded=Loaded(run=run, cluster=cluster))

    async def _settle_clusters(self) -> None:
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(ClusterRow.id).where(
                        ClusterRow.status.in_([*COMING_UP, ClusterStatus.DEGRADED.value])
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
