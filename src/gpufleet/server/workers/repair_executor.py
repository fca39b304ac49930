"""The repair executor: drive approved repairs through cordoning → draining → acting →
verifying → succeeded | failed.

Level-triggered and crash-safe (STYLE §7). One pass takes every active repair as far as
it can go: load (a short read) → act (scheduler/provider calls, no transaction open) →
apply (``locked()``: a transaction that re-reads the row and checks it is still where
the step saw it). Every driver call is idempotent or guarded by what ``progress``
recorded before it was made, so a server killed anywhere re-runs the step and ends in
the same place:

- cordon: a scheduler drain with gpufleet's reason, idempotent;
- drain: read the jobs; an unreadable scheduler means wait, never kill (fail closed);
  at the drain timeout wait or requeue, as the policy says; kill only when forced;
- act and verify: ``repair_acting.py``, ``repair_verifying.py``.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus
from gpufleet.core.errors import DriverError
from gpufleet.core.repair.models import ACTIVE_STATUSES, DrainTimeoutAction
from gpufleet.schedulers.base import SchedJob, SupportsDown, SupportsRequeue
from gpufleet.server.db.tables import ClusterRow, NodeRow, RepairRow
from gpufleet.server.services.node_holds import (
    can_hold,
    down_in_scheduler,
    hold_in_scheduler,
    record_hold,
)
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.repair_acting import ActingSteps
from gpufleet.server.workers.repair_steps import ACTOR, LoadedRepair, hold_reason
from gpufleet.server.workers.repair_verifying import VerifyingSteps

log = logging.getLogger(__name__)

__all__ = ["ACTOR", "RepairExecutor"]


class RepairExecutor(ActingSteps, VerifyingSteps):
    name = "repair-executor"

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
        await self.settle_manual_drains()

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
        gone = NodeState(loaded.node.state) in (NodeState.REMOVING, NodeState.REMOVED)
        if gone and RepairAction(loaded.repair.action) is not RepairAction.REMOVE:
            await self.transition(
                loaded, RepairStatus.FAILED, f"node {loaded.node.name} was removed meanwhile"
            )
        elif status is RepairStatus.APPROVED:
            await self.transition(loaded, RepairStatus.CORDONING, "cordoning the node")
        elif status is RepairStatus.CORDONING:
            await self._cordon(loaded)
        elif status is RepairStatus.DRAINING:
            await self._drain(loaded)
        elif status is RepairStatus.ACTING:
            await self.act(loaded)
        elif status is RepairStatus.VERIFYING:
            await self.verify(loaded)
        return status

    # -- cordoning ----------------------------------------------------------------------

    async def _cordon(self, loaded: LoadedRepair) -> None:
        scheduler = self.scheduler(loaded)
        if not can_hold(scheduler):
            await self.fail(loaded, f"scheduler {scheduler.kind} cannot drain nodes")
            return
        reason = hold_reason(loaded.repair)
        try:
            await hold_in_scheduler(scheduler, loaded.scheduler_name, reason=reason)
        except DriverError as exc:
            await self.note(loaded, f"cordon failed, retrying: {exc.message}")
            return
        self.failpoints.hit("repair.cordoning.after_drain")
        async with self.locked(loaded) as tx:
            if tx is None:
                return
            record_hold(
                tx.session,
                node=tx.node,
                project_id=tx.project_id,
                targets=(NodeState.CORDONED, NodeState.DRAINING),
                actor=ACTOR,
                reason=f"repair {tx.repair.id}: {reason.text}",
                now=tx.now,
            )
            tx.repair.detail = "waiting for the node's jobs to end"
            tx.repair_to(
                RepairStatus.DRAINING, f"cordoned in {scheduler.kind} ({reason.text}); draining"
            )

    # -- draining -----------------------------------------------------------------------

    async def _drain(self, loaded: LoadedRepair) -> None:
        scheduler = self.scheduler(loaded)
        name = loaded.scheduler_name
        try:
            jobs = await scheduler.jobs_on_node(name)
        except DriverError as exc:
            # Fail closed: if we cannot see the jobs, we cannot know they are gone.
            await self.note(
                loaded, f"job state unreadable, waiting (nothing is killed): {exc.message}"
            )
            return
        if not jobs:
            self.failpoints.hit("repair.draining.after_empty")
            await self.transition(
                loaded,
                RepairStatus.ACTING,
                "drained: no job runs on the node",
                node_target=NodeState.DRAINED,
            )
            return
        repair, policy = loaded.repair, loaded.policy
        now = self.clock.now()
        waited = (now - (repair.step_started_at or now)).total_seconds()
        listing = _listing(jobs)
        timed_out = waited >= policy.drain_timeout_s
        if (loaded.progress.get("kill_now") or (repair.forced and timed_out)) and isinstance(
            scheduler, SupportsDown
        ):
            try:
                await down_in_scheduler(scheduler, name, reason=hold_reason(repair))
            except DriverError as exc:
                await self.note(loaded, f"force: kill failed, retrying: {exc.message}")
                return
            await self.note(
                loaded,
                f"forced by an admin: killed {len(jobs)} job(s): {listing}",
                killed_at=now.isoformat(),
                kill_now=False,
            )
        elif not timed_out or loaded.progress.get("requeued_at"):
            await self.note(loaded, f"waiting for {len(jobs)} job(s) to end: {listing}")
        elif policy.drain_timeout_action is DrainTimeoutAction.REQUEUE and isinstance(
            scheduler, SupportsRequeue
        ):
            try:
                requeued = await scheduler.requeue_jobs(name)
            except DriverError as exc:
                await self.note(loaded, f"requeue failed, waiting: {exc.message}")
                return
            await self.note(
                loaded,
                f"drain timeout ({policy.drain_timeout_s:.0f} s): requeued "
                f"{', '.join(requeued) or 'no job'}",
                requeued_at=now.isoformat(),
            )
        else:
            await self.note(
                loaded,
                f"drain timeout ({policy.drain_timeout_s:.0f} s) passed; still waiting for "
                f"{listing} (policy: wait; an admin may force)",
            )

    # -- manual drains --------------------------------------------------------------------

    async def settle_manual_drains(self) -> None:
        """An admin's drain (no repair behind it): draining → drained once no job runs."""
        async with self.db.session() as session:
            active = select(RepairRow.node_id).where(
                RepairRow.status.in_([s.value for s in ACTIVE_STATUSES]),
                RepairRow.node_id.is_not(None),
            )
            rows = (
                await session.execute(
                    select(NodeRow, ClusterRow)
                    .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
                    .where(NodeRow.state == NodeState.DRAINING.value, NodeRow.id.not_in(active))
                )
            ).all()
        for node, cluster in rows:
            try:
                jobs = await scheduler_for(self.drivers, cluster).jobs_on_node(
                    node.scheduler_name or node.name
                )
            except DriverError:
                continue  # unreadable: stay draining
            if jobs:
                continue
            async with self.db.transaction() as session:
                row = await session.get(NodeRow, node.id, with_for_update=True)
                if row is None or row.state != NodeState.DRAINING.value:
                    continue
                switch_node_state(
                    session,
                    node=row,
                    project_id=cluster.project_id,
                    target=NodeState.DRAINED,
                    actor=ACTOR,
                    reason="drained: no job runs on the node",
                    now=self.clock.now(),
                )


def _listing(jobs: list[SchedJob]) -> str:
    shown = ", ".join(f"{j.job_id} ({j.user}, {j.account})" for j in jobs[:5])
    return shown + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
