"""The repair executor: the loop that drives approved repairs through cordoning →
draining → acting → verifying → succeeded | failed.

Level-triggered and crash-safe (STYLE §7). One pass takes every active repair as far as
it can go: load (a short read) → act (scheduler/provider calls, no transaction open) →
apply (``ctx.locked()``: a transaction that re-reads the row and checks it is still where
the step saw it). Each status's step is in ``STEPS``. Every driver call is idempotent or
guarded by what ``progress`` recorded before it was made, so a server killed anywhere
re-runs the step and ends in the same place:

- approved, cordoning: ``cordoning.py`` (a scheduler drain with gpufleet's reason);
- draining: ``draining.py`` (wait for the jobs; unreadable means wait, never kill);
- acting: ``acting.py``; verifying: ``verifying.py``.

A repair whose node was removed meanwhile fails whatever its status (a removal repair
aside). Each pass also settles admins' drains that have no repair behind them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqlalchemy import select

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus
from gpufleet.core.repair.models import ACTIVE_STATUSES, PolicyConfig
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.repair_policy import load_policy
from gpufleet.server.workers.base import LoopDeps, LoopService, Step, dispatch
from gpufleet.server.workers.repairs.acting import act
from gpufleet.server.workers.repairs.context import (
    LoadedRepair,
    RepairContext,
    status_guard,
)
from gpufleet.server.workers.repairs.cordoning import begin, cordon
from gpufleet.server.workers.repairs.draining import drain, settle_manual_drains
from gpufleet.server.workers.repairs.verifying import verify

log = logging.getLogger(__name__)

STEPS: dict[RepairStatus, Step[RepairContext, LoadedRepair]] = {
    RepairStatus.APPROVED: begin,
    RepairStatus.CORDONING: cordon,
    RepairStatus.DRAINING: drain,
    RepairStatus.ACTING: act,
    RepairStatus.VERIFYING: verify,
}


class RepairExecutor(LoopService):
    name = "repair-executor"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        server_url: Callable[[], str],
        default_policy: PolicyConfig | None = None,
        failpoints: Failpoints | None = None,
        staleness_s: float = 45.0,
        # Steps in flight; under the store's connection pool (10 + 10 overflow on
        # PostgreSQL) so a pass never waits for, or churns, connections.
        concurrency: int = 16,
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.server_url = server_url
        self.default_policy = default_policy or PolicyConfig()
        self.failpoints = failpoints or Failpoints()
        self.staleness_s = staleness_s
        self._limit = asyncio.Semaphore(concurrency)
        self.steps = 0

    async def run_once(self) -> None:
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(RepairRow.id)
                    .where(RepairRow.status.in_([s.value for s in ACTIVE_STATUSES]))
                    .order_by(RepairRow.id)
                )
            )
        await asyncio.gather(*(self._limited(i) for i in ids))
        await settle_manual_drains(self.db, clock=self.clock, drivers=self.drivers)

    async def _limited(self, repair_id: str) -> None:
        async with self._limit:
            try:
                await self.step(repair_id)
            except Exception:  # one repair's trouble never stalls the others
                log.exception("repairs: step of %s failed", repair_id)

    async def step(self, repair_id: str) -> None:
        """Take one repair as far as it can go now: step after step while each one moves
        it on (approved → cordoning → draining → acting in one pass when no job runs),
        stopping at the first that has to wait. Safe to call again at any time."""
        for _ in range(len(ACTIVE_STATUSES) + 1):
            before = await self.step_once(repair_id)
            if before is None:
                return
            async with self.db.session() as session:
                after = await session.scalar(
                    select(RepairRow.status).where(RepairRow.id == repair_id)
                )
            if after is None or after == before.value:
                return
            if RepairStatus(after) not in ACTIVE_STATUSES:
                return

    async def step_once(self, repair_id: str) -> RepairStatus | None:
        """One step; returns the status it started from (None: nothing to do)."""
        loaded = await self.load(repair_id)
        if loaded is None:
            return None
        self.steps += 1
        status = RepairStatus(loaded.repair.status)
        ctx = self.context(loaded)
        gone = NodeState(loaded.node.state) in (NodeState.REMOVING, NodeState.REMOVED)
        if gone and RepairAction(loaded.repair.action) is not RepairAction.REMOVE:
            await ctx.transition(
                loaded, RepairStatus.FAILED, f"node {loaded.node.name} was removed meanwhile"
            )
        else:
            await dispatch(STEPS, key=status, ctx=ctx, loaded=loaded)
        return status

    def context(self, loaded: LoadedRepair) -> RepairContext:
        """What a step of ``loaded`` is given: its applies write while the repair is
        still in the status it was loaded in."""
        return RepairContext(
            db=self.db,
            clock=self.clock,
            row_type=RepairRow,
            row_id=loaded.repair.id,
            guard=status_guard(loaded),
            drivers=self.drivers,
            server_url=self.server_url,
            failpoints=self.failpoints,
            staleness_s=self.staleness_s,
        )

    async def load(self, repair_id: str) -> LoadedRepair | None:
        """An active repair with its node, cluster and policy (None: nothing to do)."""
        async with self.db.session() as session:
            repair = await session.get(RepairRow, repair_id)
            if repair is None or RepairStatus(repair.status) not in ACTIVE_STATUSES:
                return None
            cluster = await session.get(ClusterRow, repair.cluster_id)
            node = await session.get(NodeRow, repair.node_id) if repair.node_id else None
            if cluster is None or node is None:
                return None
            policy = await load_policy(
                session, project_id=cluster.project_id, default=self.default_policy
            )
        return LoadedRepair(repair=repair, node=node, cluster=cluster, policy=policy)
