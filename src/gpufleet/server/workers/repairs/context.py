"""What a repair step is given (``RepairContext``), and the applies every step shares.

A step gets the context and the repair as loaded (``LoadedRepair``). Its apply is
``ctx.locked(loaded)``: the repair and its node re-read under lock while the repair is
still in the status the step loaded it in (``Tx``), or None when it moved on since
(another pass, a dismissal), so a step that lost a race writes nothing. The executor's
loop lease makes it the only writer of repairs in these statuses, so the guard is the
loaded status (``StatusGuard``), not a row claim. ``Tx`` changes the node and the repair
through the one function each entity has, with the step's actor and time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, NodeState, RepairStatus
from gpufleet.core.holds import HoldReason, repair_hold
from gpufleet.core.repair.models import PolicyConfig
from gpufleet.providers.base import Provider
from gpufleet.schedulers.base import Scheduler
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.events import record_event
from gpufleet.server.services.findings import close_findings_for_repair
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.repairs import switch_repair_status
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import StatusGuard, StepContext

ACTOR = "system:repairs"


def hold_reason(repair: RepairRow) -> HoldReason:
    """What ``sinfo -R`` shows while the repair holds its node."""
    return repair_hold(repair.id, signature_id=repair.signature_id, action=repair.action)


def parse_ts(value: Any) -> dt.datetime | None:
    """A time ``progress`` recorded (ISO text), or None."""
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclasses.dataclass
class LoadedRepair:
    """A repair as one step saw it when it started, with its node, cluster and the
    project's repair policy."""

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


def status_guard(loaded: LoadedRepair) -> StatusGuard:
    """A repair step's apply guard: the repair is still where the step loaded it."""
    return StatusGuard(statuses=frozenset({loaded.repair.status}))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RepairContext(StepContext[RepairRow]):
    """One step of one repair: the executor's drivers, the server's URL (for a machine's
    user data), the failpoints a crash test sets, and the repair, guarded by the status
    it was loaded in (``status_guard``)."""

    drivers: DriverRegistry
    server_url: Callable[[], str]
    failpoints: Failpoints
    staleness_s: float  # seconds without a report before a node's health is unknown

    def scheduler(self, loaded: LoadedRepair) -> Scheduler:
        return scheduler_for(self.drivers, loaded.cluster)

    def provider(self, loaded: LoadedRepair) -> Provider:
        return self.drivers.provider_for(loaded.cluster)

    def now_iso(self) -> str:
        """Now, as ``progress`` records a time."""
        return self.clock.now().isoformat()

    @contextlib.asynccontextmanager
    async def locked(self, loaded: LoadedRepair) -> AsyncIterator[Tx | None]:
        """The guarded apply: None when the repair moved on since ``loaded``."""
        async with self.apply() as applied:
            if applied is None:
                yield None
                return
            node = await applied.session.get(NodeRow, loaded.node.id, with_for_update=True)
            if node is None:
                yield None
                return
            yield Tx(
                session=applied.session,
                repair=applied.row,
                node=node,
                project_id=loaded.cluster.project_id,
                now=applied.now,
            )

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
        """Move the repair on (and its node, to ``node_target``); False: it moved on
        already."""
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
