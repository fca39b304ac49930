"""The autoscaler loop: for each cluster with autoscaling on, read what waits and what
idles from its scheduler, let the policy decide (``core.autoscale.decide``; only in mode
``gpufleet``), and carry every open ``AutoscaleAction`` forward, whoever started it.

Each pass per cluster: step the open actions, then observe (scheduler reads, no
transaction open), write each node's ``idle_since``, and — with no action open — decide
and start one (``services/autoscale.py``). A step down takes each node through:

- ``chosen`` → ``held``: drained in the scheduler with ``gpufleet: autoscale <id>
  scale-down`` (no new job lands there), the node cordoned;
- ``held`` → ``removing``: its jobs read once more; none, and the node goes — one, and it
  is released and stays (``kept``; the cluster's size grows back by one). A scheduler
  that cannot be read keeps the node held, to be tried again: never removed blind;
- ``removing`` → ``removed``: its machine given back to the provider (idempotent), the
  node removed.

Every step is load → act → apply (``guarded_apply``), so a restart at any point resumes
where it stopped; the loop's lease makes it the only writer of actions.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.autoscale import (
    Decision,
    NodePhase,
    NodeView,
    PendingWork,
    ScaleState,
    decide,
)
from gpufleet.core.autoscaling import AutoscaleKind, AutoscaleMode, AutoscaleSource, AutoscaleStatus
from gpufleet.core.enums import ClusterStatus, EventKind, NodeState
from gpufleet.core.errors import Conflict, DriverError
from gpufleet.core.holds import autoscale_hold
from gpufleet.core.repair.models import OPEN_STATUSES as OPEN_REPAIR_STATUSES
from gpufleet.schedulers.base import SchedNodeState, SupportsPendingWork
from gpufleet.server.db.tables import (
    AutoscaleActionRow,
    AutoscalePolicyRow,
    ClusterRow,
    NodeRow,
    RepairRow,
)
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.autoscale import (
    SCALABLE,
    nodes_in_acceptance,
    open_actions,
    policy_of,
    settings_of,
    start_scale_down,
    start_scale_up,
    switch_autoscale_status,
)
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_holds import (
    hold_in_scheduler,
    record_hold,
    record_release,
    release_in_scheduler,
)
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService, guarded_apply

log = logging.getLogger(__name__)

ACTOR = "system:autoscaler"
_BUSY_STATES = frozenset({SchedNodeState.ALLOCATED, SchedNodeState.MIXED})


@dataclass(frozen=True, slots=True)
class Observation:
    """One reading of a cluster's scheduler."""

    busy: dict[str, bool]  # by node id: a job runs there
    pending: list[PendingWork]


@dataclass(frozen=True)
class _NodeState:
    """Guard: the node is still in ``state``."""

    state: NodeState

    def __call__(self, row: NodeRow) -> bool:
        return row.state == self.state.value


class AutoscalerLoop(LoopService):
    name = "autoscaler"

    def __init__(self, deps: LoopDeps, *, interval_s: float, drivers: DriverRegistry) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers

    async def run_once(self) -> None:
        async with self.db.session() as session:
            with_policy = set(
                await session.scalars(
                    select(AutoscalePolicyRow.cluster_id).where(
                        AutoscalePolicyRow.mode != AutoscaleMode.OFF.value
                    )
                )
            )
            with_actions = set(
                await session.scalars(
                    select(AutoscaleActionRow.cluster_id).where(
                        AutoscaleActionRow.status == AutoscaleStatus.ACTING.value
                    )
                )
            )
        for cluster_id in sorted(with_policy | with_actions):
            try:
                await self.reconcile_cluster(cluster_id)
            except Exception:  # one cluster's trouble never stalls the others
                log.exception("autoscaler: cluster %s failed this pass", cluster_id)

    async def reconcile_cluster(self, cluster_id: str) -> None:
        async with self.db.session() as session:
            cluster = await session.get(ClusterRow, cluster_id)
            if cluster is None:
                return
            actions = await open_actions(session, cluster_id)
        for action in actions:
            if action.kind == AutoscaleKind.SCALE_UP.value:
                await self._step_up(cluster, action.id)
            else:
                await self._step_down(cluster, action.id)
        async with self.db.session() as session:
            cluster = await session.get(ClusterRow, cluster_id, populate_existing=True)
            policy = await session.get(AutoscalePolicyRow, cluster_id, populate_existing=True)
            if (
                cluster is None
                or policy is None
                or policy.mode == AutoscaleMode.OFF.value
                or ClusterStatus(cluster.status) not in SCALABLE
            ):
                return
            nodes = list(
                await session.scalars(
                    select(NodeRow).where(
                        NodeRow.cluster_id == cluster_id,
                        NodeRow.state != NodeState.REMOVED.value,
                    )
                )
            )
            still_open = bool(await open_actions(session, cluster_id))
        observation = await self._observe(cluster, nodes)
        if observation is None:
            return
        decides = policy.mode == AutoscaleMode.GPUFLEET.value and not still_open
        await self._apply(cluster_id, observation, decides=decides)

    # -- observe --------------------------------------------------------------------------

    async def _observe(self, cluster: ClusterRow, nodes: list[NodeRow]) -> Observation | None:
        scheduler = scheduler_for(self.drivers, cluster)
        try:
            listed = {n.name: n for n in await scheduler.list_nodes()}
            pending = (
                await scheduler.pending_work() if isinstance(scheduler, SupportsPendingWork) else []
            )
        except DriverError as exc:
            await self._note(cluster.id, f"the scheduler could not be read: {exc.message}")
            return None
        busy: dict[str, bool] = {}
        for node in nodes:
            seen = listed.get(node.scheduler_name or node.name)
            if seen is not None:
                busy[node.id] = bool(seen.job_ids) or seen.state in _BUSY_STATES
        return Observation(busy=busy, pending=pending)

    # -- apply: idle times, then the decision -----------------------------------------

    async def _apply(self, cluster_id: str, observation: Observation, *, decides: bool) -> None:
        """One transaction: each node's idle time from the reading (in service and no job:
        idle since the first reading that saw it so, kept while it stays idle; busy, or out
        of service: none), then, with ``decides``, the policy's decision and its action."""
        async with self.db.transaction() as session:
            cluster = await session.get(
                ClusterRow, cluster_id, with_for_update=True, populate_existing=True
            )
            policy = await session.get(AutoscalePolicyRow, cluster_id, populate_existing=True)
            if cluster is None or policy is None:
                return
            now = self.clock.now()
            live = list(
                await session.scalars(
                    select(NodeRow).where(
                        NodeRow.cluster_id == cluster_id, NodeRow.state != NodeState.REMOVED.value
                    )
                )
            )
            for node in live:
                busy = observation.busy.get(node.id)
                if node.state != NodeState.IN_SERVICE.value or busy is None or busy:
                    if node.idle_since is not None:
                        node.idle_since = None
                elif node.idle_since is None:
                    node.idle_since = now
            settings = settings_of(cluster, policy)
            if (
                not decides
                or policy.mode != AutoscaleMode.GPUFLEET.value
                or settings.min_nodes is None
                or settings.max_nodes is None
            ):
                return
            nodes = [n for n in live if n.state != NodeState.REMOVING.value]
            repairing: set[str] = set(
                await session.scalars(
                    select(RepairRow.node_id).where(
                        RepairRow.node_id.is_not(None),
                        RepairRow.cluster_id == cluster_id,
                        RepairRow.status.in_([s.value for s in OPEN_REPAIR_STATUSES]),
                    )
                )
            )
            accepting = await nodes_in_acceptance(session, cluster_id)
            views = [_view(n, observation, repairing, accepting) for n in nodes]
            decision = decide(
                policy_of(settings),
                ScaleState(
                    nodes=views,
                    pending=observation.pending,
                    gpus_per_node=max(1, cluster.gpus_per_node),
                    now=now,
                    last_up_at=policy.last_up_at,
                    last_down_at=policy.last_down_at,
                ),
            )
            policy.last_decision = "; ".join(decision.reasons)
            if not decision.changes:
                return
            try:
                await self._start(session, cluster, nodes, observation, decision, now)
            except Conflict as exc:
                policy.last_decision = f"{policy.last_decision}; refused: {exc.message}"

    @staticmethod
    async def _start(
        session: AsyncSession,
        cluster: ClusterRow,
        nodes: list[NodeRow],
        observation: Observation,
        decision: Decision,
        now: dt.datetime,
    ) -> None:
        if decision.add:
            await start_scale_up(
                session, cluster=cluster, count=decision.add, source=AutoscaleSource.POLICY,
                reasons=decision.reasons, actor=ACTOR, now=now,
            )  # fmt: skip
            return
        by_name = {n.name: n for n in nodes}
        chosen = [by_name[name] for name in decision.remove if name in by_name]
        await start_scale_down(
            session, cluster=cluster, nodes=chosen,
            busy={n.id: observation.busy.get(n.id) for n in chosen},
            source=AutoscaleSource.POLICY, reasons=decision.reasons, actor=ACTOR, now=now,
        )  # fmt: skip

    async def _note(self, cluster_id: str, text: str) -> None:
        async with self.db.transaction() as session:
            policy = await session.get(AutoscalePolicyRow, cluster_id, with_for_update=True)
            if policy is not None and policy.last_decision != text:
                policy.last_decision = text

    # -- a step up ------------------------------------------------------------------------

    async def _step_up(self, cluster: ClusterRow, action_id: str) -> None:
        async with self.db.transaction() as session:
            action = await session.get(AutoscaleActionRow, action_id, with_for_update=True)
            if action is None or action.status != AutoscaleStatus.ACTING.value:
                return
            nodes = list(
                await session.scalars(select(NodeRow).where(NodeRow.id.in_(action.node_ids)))
            )
            now = self.clock.now()
            states = [NodeState(n.state) for n in nodes]
            failed = [
                n for n in nodes if NodeState(n.state) in (NodeState.FAILED, NodeState.REMOVED)
            ]
            if failed:
                why = "; ".join(
                    f"{n.name} {n.state}" + (f": {n.state_detail}" if n.state_detail else "")
                    for n in failed
                )
                switch_autoscale_status(
                    session, action=action, cluster=cluster, target=AutoscaleStatus.FAILED,
                    actor=ACTOR, now=now,
                    reason=f"{len(failed)} of {len(nodes)} node(s) did not come: {why}",
                )  # fmt: skip
                return
            if states and all(s is NodeState.IN_SERVICE for s in states):
                switch_autoscale_status(
                    session, action=action, cluster=cluster, target=AutoscaleStatus.SUCCEEDED,
                    actor=ACTOR, reason=f"{len(nodes)} node(s) in service: "
                    + ", ".join(n.name for n in nodes),
                    now=now,
                )  # fmt: skip
                return
            counts: dict[str, int] = {}
            for state in states:
                counts[state.value] = counts.get(state.value, 0) + 1
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            if action.detail != detail:
                action.detail = detail
                action.updated_at = now

    # -- a step down ----------------------------------------------------------------------

    async def _step_down(self, cluster: ClusterRow, action_id: str) -> None:
        async with self.db.session() as session:
            action = await session.get(AutoscaleActionRow, action_id)
            if action is None or action.status != AutoscaleStatus.ACTING.value:
                return
            progress = dict(action.progress)
            # Slurm powers its own nodes down: it chose them idle and schedules nothing
            # there while it does. No drain of gpufleet's (it would outlive the power
            # down and keep Slurm from resuming the node), no second look: they go.
            powered_down_by_slurm = action.source == AutoscaleSource.SLURM.value
            nodes = {
                n.id: n
                for n in await session.scalars(
                    select(NodeRow).where(NodeRow.id.in_(action.node_ids))
                )
            }
        for node_id, where in sorted(progress.items()):
            node = nodes.get(node_id)
            if node is None:
                continue
            try:
                if where == "chosen" and powered_down_by_slurm:
                    await self._drop_unready(cluster, action_id, node, why="Slurm powered it down")
                elif where == "chosen":
                    await self._hold(cluster, action_id, node)
                elif where == "held":
                    await self._check(cluster, action_id, node)
                elif where == "removing":
                    await self._give_back(cluster, action_id, node)
            except DriverError as exc:
                await self._set_detail(action_id, f"node {node.name}: {exc.message}; tried again")
        await self._finish_down(cluster, action_id)

    async def _hold(self, cluster: ClusterRow, action_id: str, node: NodeRow) -> None:
        if node.state in (NodeState.PROVISIONING.value, NodeState.FAILED.value):
            await self._drop_unready(cluster, action_id, node)
            return
        if node.state != NodeState.IN_SERVICE.value:
            await self._keep(cluster, action_id, node, f"it is {node.state} now")
            return
        scheduler = scheduler_for(self.drivers, cluster)
        reason = autoscale_hold(action_id)
        await hold_in_scheduler(scheduler, node.scheduler_name or node.name, reason=reason)
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=_NodeState(NodeState.IN_SERVICE),
            clock=self.clock,
        ) as applied:  # fmt: skip
            if applied is None:
                return  # moved on meanwhile (a repair took it): the next pass keeps it
            record_hold(
                applied.session, node=applied.row, project_id=cluster.project_id,
                targets=[NodeState.CORDONED], actor=ACTOR,
                reason=f"autoscale {action_id[-8:]}: held before removal", now=applied.now,
            )  # fmt: skip
            await self._progress(applied.session, cluster, action_id, node, "held", None)

    async def _drop_unready(
        self, cluster: ClusterRow, action_id: str, node: NodeRow, *, why: str = "never came up"
    ) -> None:
        """A node no job can run on — one that never came up (Slurm powers down one whose
        resume timed out), or one Slurm powered down itself: it goes at once."""
        await self._to_removing(cluster, action_id, node, from_state=NodeState(node.state), why=why)

    async def _to_removing(
        self,
        cluster: ClusterRow,
        action_id: str,
        node: NodeRow,
        *,
        from_state: NodeState,
        why: str,
    ) -> None:
        """The node, still in ``from_state``, goes to removing; its machine is next."""
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=_NodeState(from_state),
            clock=self.clock,
        ) as applied:  # fmt: skip
            if applied is None:
                return
            switch_node_state(
                applied.session, node=applied.row, project_id=cluster.project_id,
                target=NodeState.REMOVING, actor=ACTOR,
                reason=f"autoscale {action_id[-8:]}: {why}; its machine goes back",
                now=applied.now,
            )  # fmt: skip
            await self._progress(applied.session, cluster, action_id, node, "removing", None)

    async def _check(self, cluster: ClusterRow, action_id: str, node: NodeRow) -> None:
        if node.state != NodeState.CORDONED.value:
            await self._keep(cluster, action_id, node, f"it is {node.state} now")
            return
        scheduler = scheduler_for(self.drivers, cluster)
        name = node.scheduler_name or node.name
        jobs = await scheduler.jobs_on_node(name)  # DriverError: stays held, tried again
        if jobs:
            release = await release_in_scheduler(scheduler, name)
            if not release.settled:
                raise DriverError(f"release of {name} failed: {release.error}")
            async with guarded_apply(
                self.db, row_type=NodeRow, row_id=node.id,
                guard=_NodeState(NodeState.CORDONED), clock=self.clock,
            ) as applied:  # fmt: skip
                if applied is None:
                    return
                ids = ", ".join(j.job_id for j in jobs[:5])
                record_release(
                    applied.session, node=applied.row, project_id=cluster.project_id,
                    release=release, actor=ACTOR,
                    reason=f"autoscale {action_id[-8:]}: job {ids} landed; the node stays",
                    now=applied.now,
                )  # fmt: skip
                await self._progress(
                    applied.session, cluster, action_id, node, "kept",
                    f"node {node.name} took job {ids} before it could go; it stays",
                )  # fmt: skip
            return
        await self._to_removing(
            cluster, action_id, node, from_state=NodeState.CORDONED, why="idle, no job"
        )

    async def _give_back(self, cluster: ClusterRow, action_id: str, node: NodeRow) -> None:
        if node.provider_instance_id is not None:
            provider = self.drivers.provider_for(cluster)
            await provider.terminate(node.provider_instance_id)
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=_NodeState(NodeState.REMOVING),
            clock=self.clock,
        ) as applied:  # fmt: skip
            if applied is None:
                return
            row = applied.row
            switch_node_state(
                applied.session, node=row, project_id=cluster.project_id,
                target=NodeState.REMOVED, actor=ACTOR,
                reason=f"autoscale {action_id[-8:]}: machine "
                f"{node.provider_instance_id or '(none)'} given back",
                now=applied.now,
            )  # fmt: skip
            row.token_hash = None
            row.idle_since = None
            await self._progress(
                applied.session, cluster, action_id, node, "removed",
                f"node {node.name} removed; machine {node.provider_instance_id or '(none)'} "
                "given back",
            )  # fmt: skip

    async def _keep(self, cluster: ClusterRow, action_id: str, node: NodeRow, why: str) -> None:
        async with self.db.transaction() as session:
            await self._progress(
                session, cluster, action_id, node, "kept", f"node {node.name} stays: {why}"
            )

    async def _progress(
        self,
        session: AsyncSession,
        cluster: ClusterRow,
        action_id: str,
        node: NodeRow,
        where: str,
        message: str | None,
    ) -> None:
        action = await session.get(AutoscaleActionRow, action_id, with_for_update=True)
        if action is None or action.status != AutoscaleStatus.ACTING.value:
            return
        now = self.clock.now()
        action.progress = {**action.progress, node.id: where}
        action.updated_at = now
        if where == "kept":
            row = await session.get(ClusterRow, cluster.id, with_for_update=True)
            if row is not None:
                row.size += 1  # the node stays: the size it was taken from comes back
                row.updated_at = now
        if message is not None:
            record_event(
                session,
                kind=EventKind.AUTOSCALE_STEP,
                message=f"cluster {cluster.name}: scale down {action_id[-8:]}: {message}",
                project_id=cluster.project_id,
                cluster_id=cluster.id,
                node_id=node.id,
                actor=ACTOR,
                data={"action_id": action_id, "node": node.name, "step": where},
                ts=now,
            )

    async def _set_detail(self, action_id: str, detail: str) -> None:
        async with self.db.transaction() as session:
            action = await session.get(AutoscaleActionRow, action_id, with_for_update=True)
            if action is not None and action.detail != detail:
                action.detail = detail
                action.updated_at = self.clock.now()

    async def _finish_down(self, cluster: ClusterRow, action_id: str) -> None:
        async with self.db.transaction() as session:
            action = await session.get(AutoscaleActionRow, action_id, with_for_update=True)
            if action is None or action.status != AutoscaleStatus.ACTING.value:
                return
            where = dict(action.progress)
            if not all(w in ("removed", "kept") for w in where.values()):
                return
            names = dict(zip(action.node_ids, action.node_names, strict=True))
            removed = [names[i] for i, w in where.items() if w == "removed"]
            kept = [names[i] for i, w in where.items() if w == "kept"]
            summary = (f"removed {', '.join(removed)}" if removed else "removed none") + (
                f"; kept {', '.join(kept)} (took work or moved on)" if kept else ""
            )
            switch_autoscale_status(
                session, action=action, cluster=cluster,
                target=AutoscaleStatus.SUCCEEDED if removed else AutoscaleStatus.CANCELLED,
                actor=ACTOR, reason=summary, now=self.clock.now(),
            )  # fmt: skip


def _view(
    node: NodeRow, observation: Observation, repairing: set[str], accepting: set[str]
) -> NodeView:
    state = NodeState(node.state)
    if state in (NodeState.PROVISIONING, NodeState.ACCEPTANCE):
        phase = NodePhase.COMING
    elif state is NodeState.IN_SERVICE:
        phase = NodePhase.IN_SERVICE
    else:
        phase = NodePhase.HELD
    busy = observation.busy.get(node.id)
    return NodeView(
        name=node.name,
        phase=phase,
        busy=True if busy is None else busy,  # unread: treated as busy, never removed
        idle_since=node.idle_since,
        repairing=node.id in repairing,
        accepting=state is NodeState.ACCEPTANCE or node.id in accepting,
    )
