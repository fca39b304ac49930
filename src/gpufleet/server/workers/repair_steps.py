"""What every repair step shares: loading a repair, the guarded apply, notes, failure.

A step is load → act → apply (STYLE §7). ``locked()`` is the apply: a transaction that
re-reads the repair and its node under lock and yields nothing if the repair moved on
since it was loaded (another pass, a dismissal), so a step that lost a race writes
nothing. ``Tx`` then changes the node and the repair through the one function each
entity has, with the step's actor and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, NodeState, RepairStatus
from gpufleet.core.holds import HoldReason, repair_hold
from gpufleet.core.repair.models import ACTIVE_STATUSES, PolicyConfig
from gpufleet.providers.base import Provider
from gpufleet.schedulers.base import Scheduler
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.events import record_event
from gpufleet.server.services.findings import close_findings_for_repair
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.repair_policy import load_policy
from gpufleet.server.services.repairs import switch_repair_status
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService

ACTOR = "system:repairs"


def hold_reason(repair: RepairRow) -> HoldReason:
    """What ``sinfo -R`` shows while the repair holds its node."""
    return repair_hold(repair.id, signature_id=repair.signature_id, action=repair.action)


def parse_ts(value: Any) -> dt.datetime | None:
    """A time ``progress`` recorded (ISO text), or None."""
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclasses.dataclass
class LoadedRepair:
    """A repair as one step saw it when it started."""

    repair: RepairRow
    node: NodeRow
    cluster: ClusterRow
    policy: PolicyConfig

    @property
    def progress(self) -> dict[str, Any]:
        return self.repair.progress or {}

    @property
    def scheduler_name(self) -> str:
        return self.node.scheduler_name or self.node.name


@dataclasses.dataclass
class Tx:
    """An apply in progress: the repair and node re-read under lock."""

    session: AsyncSession
    repair: RepairRow
    node: NodeRow
    project_id: str
    now: dt.datetime

    def node_to(self, target: NodeState, reason: str) -> None:
        switch_node_state(
            self.session,
            node=self.node,
            project_id=self.project_id,
            target=target,
            actor=ACTOR,
            reason=reason,
            now=self.now,
        )

    def repair_to(self, target: RepairStatus, reason: str) -> None:
        switch_repair_status(
            self.session,
            repair=self.repair,
            project_id=self.project_id,
            node_name=self.node.name,
            target=target,
            actor=ACTOR,
            reason=reason,
            now=self.now,
        )

    def progress(self, **values: Any) -> None:
        self.repair.progress = {**(self.repair.progress or {}), **values}

    def step_event(self, message: str, data: dict[str, Any]) -> None:
        record_event(
            self.session,
            kind=EventKind.REPAIR_STEP,
            message=f"repair {self.repair.id} ({self.repair.action} on {self.node.name}): "
            f"{message}",
            project_id=self.project_id,
            cluster_id=self.repair.cluster_id,
            node_id=self.repair.node_id,
            actor=ACTOR,
            data=data,
            ts=self.now,
        )


class StepBase(LoopService):
    """The executor's state and the helpers its steps share."""

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

    async def load(self, repair_id: str) -> LoadedRepair | None:
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

    def scheduler(self, loaded: LoadedRepair) -> Scheduler:
        return scheduler_for(self.drivers, loaded.cluster)

    def provider(self, loaded: LoadedRepair) -> Provider:
        return self.drivers.provider(loaded.cluster.provider)

    @contextlib.asynccontextmanager
    async def locked(self, loaded: LoadedRepair) -> AsyncIterator[Tx | None]:
        """The guarded apply: None when the repair moved on since ``loaded``."""
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                yield None
            else:
                yield Tx(session, repair, node, loaded.cluster.project_id, self.clock.now())

    async def transition(
        self,
        loaded: LoadedRepair,
        target: RepairStatus,
        reason: str,
        *,
        node_target: NodeState | None = None,
        progress: dict[str, Any] | None = None,
        detail: str | None = None,
    ) -> bool:
        async with self.locked(loaded) as tx:
            if tx is None:
                return False
            tx.progress(**(progress or {}))
            tx.repair.detail = detail if detail is not None else reason
            if node_target is not None:
                tx.node_to(node_target, f"repair {tx.repair.id}: {reason}")
            tx.repair_to(target, reason)
        return True

    async def note(self, loaded: LoadedRepair, detail: str, **progress: Any) -> None:
        """Progress inside a step: stored on the repair; an event only when it changes."""
        async with self.locked(loaded) as tx:
            if tx is None:
                return
            tx.progress(**progress)
            if tx.repair.detail != detail:
                tx.repair.detail = detail
                tx.step_event(detail, {"status": tx.repair.status, "detail": detail})
            tx.repair.updated_at = tx.now

    async def fail(self, loaded: LoadedRepair, reason: str) -> None:
        """The repair failed: the node stays out of service (cordoned, gpufleet's drain
        kept) and the planner recommends the next rung."""
        state = NodeState(loaded.node.state)
        keep = state in (NodeState.CORDONED, NodeState.REMOVED)
        await self.transition(
            loaded, RepairStatus.FAILED, reason, node_target=None if keep else NodeState.CORDONED
        )


async def close_findings(tx: Tx, *, why: str, before: dt.datetime | None = None) -> None:
    """Close the node's open findings (those last seen before ``before``, if given)."""
    await close_findings_for_repair(
        tx.session,
        node=tx.node,
        project_id=tx.project_id,
        actor=ACTOR,
        why=why,
        now=tx.now,
        seen_before=before,
    )
