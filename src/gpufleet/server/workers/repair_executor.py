"""The repair executor: drive approved repairs through cordoning → draining → acting →
verifying → succeeded | failed.

Level-triggered and crash-safe (STYLE §7). One pass takes every active repair one step:
load (a short read) → act (scheduler/provider calls, no transaction open) → apply (a
transaction that re-reads the row and checks it is still where the step saw it). Every
driver call is idempotent or guarded by what ``progress`` recorded before it was made, so
a server killed anywhere re-runs the step and ends in the same place:

- cordon: a scheduler drain with gpufleet's reason, idempotent;
- drain: read the jobs; an unreadable scheduler means wait, never kill (fail closed);
- act: ``progress.requested_at`` is written *before* the provider is asked; after a
  crash the machine's ``booted_at`` tells whether the reboot already happened;
- failover: the replacement's client token is the repair id, so asking twice returns
  the same machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, NodeState, RepairAction, RepairStatus, Severity
from gpufleet.core.errors import DriverError, InvalidInput
from gpufleet.core.repair.models import ACTIVE_STATUSES, PolicyConfig
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.providers.base import (
    Instance,
    InstanceState,
    Provider,
    ProvisionRequest,
    SupportsGpuReset,
    SupportsReboot,
    SupportsReprovision,
)
from gpufleet.schedulers.base import (
    DRAIN_REASON_PREFIX,
    Scheduler,
    SupportsDown,
    SupportsDrain,
    SupportsRequeue,
)
from gpufleet.server.db.tables import ClusterRow, FindingRow, GpuRow, NodeRow, RepairRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.agent_findings import refresh_node_health
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, generate_token, hash_token
from gpufleet.server.services.events import record_event
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.repair_policy import load_policy
from gpufleet.server.services.repairs import switch_repair_status
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)

ACTOR = "system:repairs"
_BAD = frozenset({Severity.CRITICAL.value, Severity.FATAL.value})


def drain_reason(repair: RepairRow) -> str:
    """What ``sinfo -R`` shows: ``gpufleet: <repair id> <signature>``."""
    return f"{DRAIN_REASON_PREFIX} {repair.id} {repair.signature_id or repair.action}"


def _ts(value: Any) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclasses.dataclass
class _Loaded:
    repair: RepairRow
    node: NodeRow
    cluster: ClusterRow
    policy: PolicyConfig


class RepairExecutor(LoopService):
    name = "repair-executor"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        server_url: Any,
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
        await self.settle_manual_drains()

    async def _limited(self, repair_id: str) -> None:
        async with self._limit:
            try:
                await self.step(repair_id)
            except Exception:  # one repair's trouble never stalls the others
                log.exception("repairs: step of %s failed", repair_id)

    # -- one step -------------------------------------------------------------------------

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
            if after == before.value or after is None:
                return
            if RepairStatus(after) not in ACTIVE_STATUSES:
                return

    async def step_once(self, repair_id: str) -> RepairStatus | None:
        """One step; returns the status it started from (None: nothing to do)."""
        loaded = await self._load(repair_id)
        if loaded is None:
            return None
        self.steps += 1
        await self._dispatch(loaded)
        return RepairStatus(loaded.repair.status)

    async def _dispatch(self, loaded: _Loaded) -> None:
        if NodeState(loaded.node.state) in (NodeState.REMOVING, NodeState.REMOVED) and (
            RepairAction(loaded.repair.action) is not RepairAction.REMOVE
        ):
            await self._transition(
                loaded, RepairStatus.FAILED, f"node {loaded.node.name} was removed meanwhile"
            )
            return
        status = RepairStatus(loaded.repair.status)
        if status is RepairStatus.APPROVED:
            await self._transition(loaded, RepairStatus.CORDONING, "cordoning the node")
        elif status is RepairStatus.CORDONING:
            await self._cordon(loaded)
        elif status is RepairStatus.DRAINING:
            await self._drain(loaded)
        elif status is RepairStatus.ACTING:
            await self._act(loaded)
        elif status is RepairStatus.VERIFYING:
            await self._verify(loaded)

    async def _load(self, repair_id: str) -> _Loaded | None:
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
        return _Loaded(repair=repair, node=node, cluster=cluster, policy=policy)

    def _scheduler(self, loaded: _Loaded) -> Scheduler:
        return scheduler_for(self.drivers, loaded.cluster)

    def _provider(self, loaded: _Loaded) -> Provider:
        return self.drivers.provider(loaded.cluster.provider)

    # Apply helpers: each opens a transaction, re-reads the repair and node, and does
    # nothing if the repair moved on since it was loaded (another pass, a dismissal).

    async def _transition(
        self,
        loaded: _Loaded,
        target: RepairStatus,
        reason: str,
        *,
        node_target: NodeState | None = None,
        progress: dict[str, Any] | None = None,
        detail: str | None = None,
    ) -> bool:
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                return False
            if progress:
                repair.progress = {**(repair.progress or {}), **progress}
            repair.detail = detail if detail is not None else reason
            if node_target is not None:
                switch_node_state(
                    session,
                    node=node,
                    project_id=loaded.cluster.project_id,
                    target=node_target,
                    actor=ACTOR,
                    reason=f"repair {repair.id}: {reason}",
                    now=now,
                )
            switch_repair_status(
                session,
                repair=repair,
                project_id=loaded.cluster.project_id,
                node_name=node.name,
                target=target,
                actor=ACTOR,
                reason=reason,
                now=now,
            )
        return True

    async def _note(
        self, loaded: _Loaded, detail: str, *, progress: dict[str, Any] | None = None
    ) -> None:
        """Progress inside a step: stored on the repair; an event only when it changes."""
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            if repair is None or repair.status != loaded.repair.status:
                return
            if progress:
                repair.progress = {**(repair.progress or {}), **progress}
            if repair.detail != detail:
                repair.detail = detail
                record_event(
                    session,
                    kind=EventKind.REPAIR_STEP,
                    message=f"repair {repair.id} ({repair.action} on {loaded.node.name}): {detail}",
                    project_id=loaded.cluster.project_id,
                    cluster_id=repair.cluster_id,
                    node_id=repair.node_id,
                    actor=ACTOR,
                    data={"status": repair.status, "detail": detail},
                    ts=now,
                )
            repair.updated_at = now

    async def _fail(self, loaded: _Loaded, reason: str) -> None:
        """The repair failed: the node stays out of service (cordoned, gpufleet's drain
        kept) and the planner recommends the next rung."""
        node_state = NodeState(loaded.node.state)
        target = (
            None if node_state in (NodeState.CORDONED, NodeState.REMOVED) else (NodeState.CORDONED)
        )
        await self._transition(loaded, RepairStatus.FAILED, reason, node_target=target)

    # -- cordoning ----------------------------------------------------------------------

    async def _cordon(self, loaded: _Loaded) -> None:
        scheduler = self._scheduler(loaded)
        name = loaded.node.scheduler_name or loaded.node.name
        if not isinstance(scheduler, SupportsDrain):
            await self._fail(loaded, f"scheduler {scheduler.kind} cannot drain nodes")
            return
        try:
            await scheduler.drain(name, reason=drain_reason(loaded.repair))
        except DriverError as exc:
            await self._note(loaded, f"cordon failed, retrying: {exc.message}")
            return
        self.failpoints.hit("repair.cordoning.after_drain")
        # One apply: node cordoned then draining, repair draining.
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                return
            why = f"repair {repair.id}: {drain_reason(repair)}"
            for target in (NodeState.CORDONED, NodeState.DRAINING):
                switch_node_state(
                    session,
                    node=node,
                    project_id=loaded.cluster.project_id,
                    target=target,
                    actor=ACTOR,
                    reason=why,
                    now=now,
                )
            repair.detail = "waiting for the node's jobs to end"
            switch_repair_status(
                session,
                repair=repair,
                project_id=loaded.cluster.project_id,
                node_name=node.name,
                target=RepairStatus.DRAINING,
                actor=ACTOR,
                reason=f"cordoned in {scheduler.kind} ({drain_reason(repair)}); draining",
                now=now,
            )

    # -- draining -----------------------------------------------------------------------

    async def _drain(self, loaded: _Loaded) -> None:
        scheduler = self._scheduler(loaded)
        name = loaded.node.scheduler_name or loaded.node.name
        try:
            jobs = await scheduler.jobs_on_node(name)
        except DriverError as exc:
            # Fail closed: if we cannot see the jobs, we cannot know they are gone.
            await self._note(
                loaded, f"job state unreadable, waiting (nothing is killed): {exc.message}"
            )
            return
        if not jobs:
            self.failpoints.hit("repair.draining.after_empty")
            await self._transition(
                loaded,
                RepairStatus.ACTING,
                "drained: no job runs on the node",
                node_target=NodeState.DRAINED,
            )
            return
        repair, policy = loaded.repair, loaded.policy
        now = self.clock.now()
        started = repair.step_started_at or now
        waited = (now - started).total_seconds()
        listing = ", ".join(f"{j.job_id} ({j.user}, {j.account})" for j in jobs[:5])
        more = f" and {len(jobs) - 5} more" if len(jobs) > 5 else ""
        progress = repair.progress or {}
        kill = progress.get("kill_now") or (repair.forced and waited >= policy.drain_timeout_s)
        if kill and isinstance(scheduler, SupportsDown):
            try:
                await scheduler.down(name, reason=drain_reason(repair))
            except DriverError as exc:
                await self._note(loaded, f"force: kill failed, retrying: {exc.message}")
                return
            await self._note(
                loaded,
                f"forced by an admin: killed {len(jobs)} job(s): {listing}{more}",
                progress={"killed_at": now.isoformat(), "kill_now": False},
            )
            return
        if waited >= policy.drain_timeout_s and not progress.get("requeued_at"):
            if policy.drain_timeout_action.value == "requeue" and isinstance(
                scheduler, SupportsRequeue
            ):
                try:
                    requeued = await scheduler.requeue_jobs(name)
                except DriverError as exc:
                    await self._note(loaded, f"requeue failed, waiting: {exc.message}")
                    return
                await self._note(
                    loaded,
                    f"drain timeout ({policy.drain_timeout_s:.0f} s): requeued "
                    f"{', '.join(requeued) or 'no job'}",
                    progress={"requeued_at": now.isoformat()},
                )
                return
            await self._note(
                loaded,
                f"drain timeout ({policy.drain_timeout_s:.0f} s) passed; still waiting for "
                f"{listing}{more} (policy: wait; an admin may force)",
            )
            return
        await self._note(loaded, f"waiting for {len(jobs)} job(s) to end: {listing}{more}")

    # -- acting -------------------------------------------------------------------------

    async def _act(self, loaded: _Loaded) -> None:
        action = RepairAction(loaded.repair.action)
        if action is RepairAction.FAILOVER:
            await self._failover(loaded)
        elif action is RepairAction.REMOVE:
            await self._remove(loaded)
        else:
            await self._restart(loaded, action)

    async def _mark_requested(self, loaded: _Loaded) -> dt.datetime | None:
        """Record, before the provider is asked, that it is about to be: the node goes to
        repairing. Returns the time recorded (None if the repair moved on)."""
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                return None
            requested = _ts((repair.progress or {}).get("requested_at"))
            if requested is not None:
                return requested
            repair.progress = {**(repair.progress or {}), "requested_at": now.isoformat()}
            repair.detail = f"asking {loaded.cluster.provider} to {repair.action}"
            switch_node_state(
                session,
                node=node,
                project_id=loaded.cluster.project_id,
                target=NodeState.REPAIRING,
                actor=ACTOR,
                reason=f"repair {repair.id}: {repair.action}",
                now=now,
            )
        loaded.repair.progress = {**(loaded.repair.progress or {}), "requested_at": now.isoformat()}
        return now

    async def _restart(self, loaded: _Loaded, action: RepairAction) -> None:
        """reboot, reprovision, reset_gpu: ask once, then wait for the machine."""
        provider = self._provider(loaded)
        instance_id = loaded.node.provider_instance_id
        if instance_id is None:
            await self._fail(loaded, "the node has no machine to act on")
            return
        progress = loaded.repair.progress or {}
        requested = _ts(progress.get("requested_at"))
        called = _ts(progress.get("called_at"))
        if called is None:
            if requested is None:
                requested = await self._mark_requested(loaded)
                if requested is None:
                    return
                self.failpoints.hit("repair.acting.before_call")
            else:
                # Crashed between recording the request and recording the call: the
                # machine's boot time says whether the call was made.
                instance = await provider.get_instance(instance_id)
                if action is not RepairAction.RESET_GPU and _booted_since(instance, requested):
                    await self._note(
                        loaded, f"{action.value} already under way", progress=_called(self)
                    )
                    return
            try:
                await self._call(loaded, provider, action, instance_id)
            except DriverError as exc:
                await self._fail(loaded, f"{action.value} failed: {exc.message}")
                return
            except InvalidInput as exc:
                await self._fail(loaded, exc.message)
                return
            self.failpoints.hit("repair.acting.after_call")
            if action is RepairAction.RESET_GPU:
                await self._acted(loaded, f"GPU reset done ({_gpus(loaded.repair)})")
                return
            await self._note(
                loaded, f"{action.value} asked; waiting for the machine", progress=_called(self)
            )
            return
        instance = await provider.get_instance(instance_id)
        assert requested is not None
        if instance is None or instance.state is InstanceState.TERMINATED:
            await self._fail(loaded, f"machine {instance_id} is gone")
        elif instance.state is InstanceState.FAILED:
            await self._fail(
                loaded, f"machine did not come back after {action.value}: {instance.error}"
            )
        elif instance.state is InstanceState.RUNNING and _booted_since(instance, requested):
            await self._acted(loaded, f"{action.value} done: machine {instance_id} is running")
        elif (self.clock.now() - requested).total_seconds() > loaded.policy.verify_timeout_s:
            await self._fail(
                loaded,
                f"machine not back {loaded.policy.verify_timeout_s:.0f} s after {action.value}",
            )

    async def _call(
        self, loaded: _Loaded, provider: Provider, action: RepairAction, instance_id: str
    ) -> None:
        if action is RepairAction.REBOOT:
            if not isinstance(provider, SupportsReboot):
                raise InvalidInput(f"provider {provider.kind} cannot reboot machines")
            await provider.reboot(instance_id)
        elif action is RepairAction.REPROVISION:
            if not isinstance(provider, SupportsReprovision):
                raise InvalidInput(f"provider {provider.kind} cannot reprovision machines")
            token = generate_token(NODE_TOKEN_PREFIX)
            async with self.db.transaction() as session:
                node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
                if node is None:
                    return
                node.token_hash = hash_token(token)  # a fresh install gets a fresh token
            await provider.reprovision(instance_id, user_data=self._user_data(token))
        elif action is RepairAction.RESET_GPU:
            if not isinstance(provider, SupportsGpuReset):
                raise InvalidInput(f"provider {provider.kind} cannot reset GPUs")
            await provider.reset_gpu(instance_id, gpu_index=loaded.repair.gpu_index)
        else:
            raise InvalidInput(f"no provider call for action {action.value}")

    def _user_data(self, token: str) -> dict[str, str]:
        url = self.server_url() if callable(self.server_url) else str(self.server_url)
        return {"gpufleet_url": url, "gpufleet_node_token": token}

    async def _acted(self, loaded: _Loaded, reason: str) -> None:
        await self._transition(
            loaded,
            RepairStatus.VERIFYING,
            reason,
            progress={"acted_at": self.clock.now().isoformat()},
            detail="waiting for the node to report clean",
        )

    async def _failover(self, loaded: _Loaded) -> None:
        """Provision a replacement, wait for it, move the node onto it, retire the old."""
        provider = self._provider(loaded)
        repair = loaded.repair
        progress = repair.progress or {}
        if progress.get("swapped_at"):
            old = progress.get("old_instance_id")
            if isinstance(old, str):
                await provider.terminate(old)
            await self._acted(loaded, f"failed over to machine {loaded.node.provider_instance_id}")
            return
        if _ts(progress.get("requested_at")) is None and await self._mark_requested(loaded) is None:
            return
        token = generate_token(NODE_TOKEN_PREFIX)
        request = ProvisionRequest(
            client_token=f"{repair.id}/failover",
            cluster_id=loaded.cluster.id,
            node_name=loaded.node.name,
            gpu_model=loaded.cluster.gpu_model,
            gpu_count=loaded.cluster.gpus_per_node,
            user_data=self._user_data(token),
        )
        try:
            # Idempotent by client token: the same replacement every pass (user data, and
            # so the node token, refreshed to the one whose hash is stored below).
            instance = await provider.provision(request)
        except DriverError as exc:
            await self._note(loaded, f"no replacement machine yet: {exc.message}")
            return
        async with self.db.transaction() as session:
            row = await session.get(RepairRow, repair.id, with_for_update=True)
            if row is None or row.status != repair.status:
                return
            row.progress = {
                **(row.progress or {}),
                "replacement_instance_id": instance.instance_id,
                "replacement_token_hash": hash_token(token),
            }
        if instance.state is InstanceState.FAILED:
            await provider.terminate(instance.instance_id)
            await self._fail(loaded, f"replacement machine failed to boot: {instance.error}")
            return
        if instance.state is not InstanceState.RUNNING:
            await self._note(loaded, f"waiting for replacement machine {instance.instance_id}")
            return
        self.failpoints.hit("repair.acting.after_call")
        await self._swap(loaded, instance, token_hash=hash_token(token))

    async def _swap(self, loaded: _Loaded, instance: Instance, *, token_hash: str) -> None:
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                return
            old = node.provider_instance_id
            node.provider_instance_id = instance.instance_id
            node.token_hash = token_hash
            node.serial = instance.serial
            node.hostname = instance.hostname or node.hostname
            node.bmc_address = instance.bmc_address
            node.rack, node.leaf_switch, node.pdu = (
                instance.rack,
                instance.leaf_switch,
                instance.pdu,
            )
            node.last_report_at = None
            for gpu in await session.scalars(
                select(GpuRow).where(GpuRow.node_id == node.id, GpuRow.removed_at.is_(None))
            ):
                gpu.removed_at = now  # the old host's GPUs leave with it
            await _close_findings(
                session, node=node, project_id=loaded.cluster.project_id, now=now,
                why="the node moved to a new host",
            )  # fmt: skip
            repair.progress = {
                **(repair.progress or {}),
                "old_instance_id": old,
                "swapped_at": now.isoformat(),
            }
            record_event(
                session,
                kind=EventKind.REPAIR_STEP,
                message=f"repair {repair.id}: node {node.name} moved from machine {old} to "
                f"{instance.instance_id} (serial {instance.serial})",
                project_id=loaded.cluster.project_id,
                cluster_id=node.cluster_id,
                node_id=node.id,
                actor=ACTOR,
                data={"old_instance_id": old, "new_instance_id": instance.instance_id},
                ts=now,
            )

    async def _remove(self, loaded: _Loaded) -> None:
        """Give the machine back and take the node out of the cluster, flagged for
        hardware service."""
        requested = _ts((loaded.repair.progress or {}).get("requested_at"))
        if requested is None and await self._mark_requested(loaded) is None:
            return
        instance_id = loaded.node.provider_instance_id
        if instance_id is not None:
            await self._provider(loaded).terminate(instance_id)
        self.failpoints.hit("repair.acting.after_call")
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                return
            why = (
                f"repair {repair.id}: removed for hardware service "
                f"(host {repair.host or node.serial}, {repair.signature_id})"
            )
            for target in (NodeState.REMOVING, NodeState.REMOVED):
                switch_node_state(
                    session,
                    node=node,
                    project_id=loaded.cluster.project_id,
                    target=target,
                    actor=ACTOR,
                    reason=why,
                    now=now,
                )
            node.token_hash = None
            await _close_findings(
                session, node=node, project_id=loaded.cluster.project_id, now=now, why=why
            )
            repair.progress = {**(repair.progress or {}), "hardware_service": True}
            for step in (RepairStatus.VERIFYING, RepairStatus.SUCCEEDED):
                switch_repair_status(
                    session,
                    repair=repair,
                    project_id=loaded.cluster.project_id,
                    node_name=node.name,
                    target=step,
                    actor=ACTOR,
                    reason=f"machine {instance_id} given back; flagged for hardware service",
                    now=now,
                )

    # -- verifying ----------------------------------------------------------------------

    async def _verify(self, loaded: _Loaded) -> None:
        """The node must report again after the action, with every GPU, and stay free of
        critical findings for ``verify_settle_s``; then it returns to service."""
        repair, policy, node = loaded.repair, loaded.policy, loaded.node
        progress = repair.progress or {}
        acted = _ts(progress.get("acted_at")) or repair.step_started_at or self.clock.now()
        now = self.clock.now()
        async with self.db.session() as session:
            findings = list(
                await session.scalars(
                    select(FindingRow).where(
                        FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None)
                    )
                )
            )
            fresh_gpus = len(
                list(
                    await session.scalars(
                        select(GpuRow.id).where(
                            GpuRow.node_id == node.id,
                            GpuRow.removed_at.is_(None),
                            GpuRow.sampled_at > acted,
                        )
                    )
                )
            )
        recurred = [f for f in findings if f.severity in _BAD and _still_bad(f, acted=acted)]
        if recurred:
            worst = recurred[0]
            await self._fail(
                loaded,
                f"verification failed: {worst.signature_id} ({worst.title}) seen again "
                f"after the {repair.action}",
            )
            return
        if (now - acted).total_seconds() > policy.verify_timeout_s:
            await self._fail(
                loaded,
                f"verification failed: the node did not report all {node.expected_gpus} GPUs "
                f"within {policy.verify_timeout_s:.0f} s of the {repair.action}",
            )
            return
        reported = node.last_report_at is not None and node.last_report_at > acted
        if not reported or fresh_gpus < node.expected_gpus:
            await self._note(
                loaded,
                f"waiting for the node to report ({fresh_gpus}/{node.expected_gpus} GPUs seen "
                "since the action)",
            )
            return
        first = _ts(progress.get("first_report_at"))
        if first is None:
            await self._note(
                loaded,
                f"node reports again; watching it for {policy.verify_settle_s:.0f} s",
                progress={"first_report_at": now.isoformat()},
            )
            if policy.verify_settle_s > 0:
                return
            first = now
        if (now - first).total_seconds() < policy.verify_settle_s:
            return
        await self._return_to_service(loaded)

    async def _return_to_service(self, loaded: _Loaded) -> None:
        scheduler = self._scheduler(loaded)
        name = loaded.node.scheduler_name or loaded.node.name
        foreign: str | None = None
        if isinstance(scheduler, SupportsDrain):
            try:
                await scheduler.resume(name)  # only ever gpufleet's own drain
            except DriverError as exc:
                foreign = await _foreign_reason(scheduler, name)
                if foreign is None:
                    await self._note(loaded, f"verified, but resume failed: {exc.message}")
                    return
        self.failpoints.hit("repair.verifying.after_resume")
        now = self.clock.now()
        async with self.db.transaction() as session:
            repair = await session.get(RepairRow, loaded.repair.id, with_for_update=True)
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if repair is None or node is None or repair.status != loaded.repair.status:
                return
            acted = _ts((repair.progress or {}).get("acted_at")) or now
            await _close_findings(
                session,
                node=node,
                project_id=loaded.cluster.project_id,
                now=now,
                why=f"repair {repair.id} verified",
                before=acted,
            )
            await refresh_node_health(
                session,
                node=node,
                project_id=loaded.cluster.project_id,
                now=now,
                staleness_s=self.staleness_s,
            )
            # Someone else's drain (an operator, NHC) stays: the node stays cordoned.
            target = NodeState.IN_SERVICE if foreign is None else NodeState.CORDONED
            switch_node_state(
                session,
                node=node,
                project_id=loaded.cluster.project_id,
                target=target,
                actor=ACTOR,
                reason=f"repair {repair.id} verified"
                + ("" if foreign is None else f"; kept out by a drain not ours: {foreign!r}"),
                now=now,
            )
            repair.detail = (
                "verified; back in service"
                if foreign is None
                else f"verified; the node stays drained by someone else ({foreign!r})"
            )
            switch_repair_status(
                session,
                repair=repair,
                project_id=loaded.cluster.project_id,
                node_name=node.name,
                target=RepairStatus.SUCCEEDED,
                actor=ACTOR,
                reason="verified: the node reports every GPU and no critical finding recurred",
                now=now,
            )

    # -- manual drains --------------------------------------------------------------------

    async def settle_manual_drains(self) -> None:
        """An admin's drain (no repair behind it): draining → drained once no job runs."""
        async with self.db.session() as session:
            rows = (
                await session.execute(
                    select(NodeRow, ClusterRow)
                    .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
                    .where(NodeRow.state == NodeState.DRAINING.value)
                )
            ).all()
            active = set(
                await session.scalars(
                    select(RepairRow.node_id).where(
                        RepairRow.status.in_([s.value for s in ACTIVE_STATUSES])
                    )
                )
            )
        for node, cluster in rows:
            if node.id in active:
                continue
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


async def _foreign_reason(scheduler: Scheduler, name: str) -> str | None:
    """The node's drain reason when it is someone else's (not ``gpufleet:``)."""
    try:
        nodes = await scheduler.list_nodes()
    except DriverError:
        return None
    for node in nodes:
        if node.name == name and node.reason and not node.reason.startswith(DRAIN_REASON_PREFIX):
            return node.reason
    return None


def _called(executor: RepairExecutor) -> dict[str, Any]:
    return {"called_at": executor.clock.now().isoformat()}


def _gpus(repair: RepairRow) -> str:
    return "all GPUs" if repair.gpu_index is None else f"GPU {repair.gpu_index}"


def _booted_since(instance: Instance | None, since: dt.datetime) -> bool:
    return instance is not None and instance.booted_at is not None and instance.booted_at >= since


def _clears_on_repair(signature_id: str) -> bool:
    signature = get_signature(signature_id)
    return (
        signature is not None and signature.clear is not None and (signature.clear.mode == "repair")
    )


def _still_bad(finding: FindingRow, *, acted: dt.datetime) -> bool:
    """A finding that says the repair did not work: seen again after the action, or one
    that clears by itself (metric, state) and has not (a log line from before the repair
    stays open until the repair is verified)."""
    if finding.last_seen > acted:
        return True
    return not _clears_on_repair(finding.signature_id) and finding.source != "kernel-log"


async def _close_findings(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    now: dt.datetime,
    why: str,
    before: dt.datetime | None = None,
) -> None:
    """Close the node's open findings (those last seen before ``before``, if given)."""
    query = select(FindingRow).where(FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None))
    if before is not None:
        query = query.where(FindingRow.last_seen <= before)
    for finding in await session.scalars(query):
        finding.cleared_at = now
        record_event(
            session,
            kind=EventKind.FINDING_CLEARED,
            message=f"node {node.name}: {finding.title} cleared ({why})",
            project_id=project_id,
            cluster_id=node.cluster_id,
            node_id=node.id,
            actor=ACTOR,
            data={"finding_id": finding.id, "signature": finding.signature_id, "reason": why},
            ts=now,
        )
