"""The provisioning loop: make each cluster's machines match its rows.

Level-triggered and crash-safe. Every provider call is idempotent (the client token is
the node id and attempt), and each step is load → act (no transaction open) → apply
(``guarded_apply``: a transaction that re-reads the row under lock and writes only while
it is still as the step saw it: the node still provisioning, still on the machine the
step looked at). A server killed at any point re-runs the step and converges on the same
nodes; the unique (cluster, name) constraint makes a duplicate node impossible even with
two replicas.

A machine that is up runs the cluster's startup scripts (``services/startup_scripts.py``;
the node stays ``provisioning`` meanwhile, and stays there with the error shown when one
fails), then goes to ``acceptance`` (drained in the scheduler with gpufleet's reason, so
it takes no job) where the acceptance loop tests it, or straight into service when the
cluster opted out of acceptance tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus, EventKind, NodeState, StartupStatus
from gpufleet.core.errors import DriverError
from gpufleet.core.holds import acceptance_hold
from gpufleet.providers.base import Instance, InstanceState, Provider, ProvisionRequest
from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.acceptance import settle_cluster_status
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, generate_token, hash_token
from gpufleet.server.services.autoscale import provider_id_of
from gpufleet.server.services.clusters import (
    new_node_rows,
    switch_cluster_status,
)
from gpufleet.server.services.enrollment import open_enrollment, takes_no_user_data
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_holds import (
    NodeListing,
    can_hold,
    hold_for_acceptance,
    record_hold,
)
from gpufleet.server.services.node_slots import free_slots
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.services.stacks import stack_user_data
from gpufleet.server.services.startup_scripts import (
    StartupTrigger,
    boot_key,
    ensure_startup,
)
from gpufleet.server.workers.base import LoopDeps, LoopService, StatusGuard, guarded_apply

log = logging.getLogger(__name__)

ACTOR = "system:provisioning"
MAX_ATTEMPTS = 3  # a slot that fails to boot this often is marked failed for a human
# A node Slurm resumed for a job: no drain (it would requeue the job), see hold_for_acceptance.
_BOOT_HOLD = (
    "; not drained: the scheduler waits for this machine with a job allocated, which "
    "starts once its slurmd does, after acceptance"
)
_ACTIVE = [
    ClusterStatus.PROVISIONING.value,
    ClusterStatus.READY.value,
    ClusterStatus.DEGRADED.value,
    ClusterStatus.DELETING.value,
]


@dataclasses.dataclass(frozen=True)
class MachineGuard:
    """The node still runs on ``instance_id`` (the machine the step looked at) and, with
    ``provisioning``, is still provisioning."""

    instance_id: str | None
    provisioning: bool = True

    def __call__(self, row: NodeRow) -> bool:
        if self.provisioning and row.state != NodeState.PROVISIONING.value:
            return False
        return row.provider_instance_id == self.instance_id


def _provisioning(row: NodeRow) -> bool:
    return row.state == NodeState.PROVISIONING.value


def _any_status(_row: ClusterRow) -> bool:
    """Any cluster: ``settle_cluster_status`` decides what its status says."""
    return True


_DELETING = StatusGuard(frozenset({ClusterStatus.DELETING.value}))


@dataclasses.dataclass(frozen=True)
class _NodeView:
    id: str
    name: str
    state: NodeState
    instance_id: str | None
    attempts: int
    enroll_open: bool = False  # waits for its bare-metal machine's agent to enroll
    reported: bool = False  # its agent reported at least once


class ProvisioningLoop(LoopService):
    name = "provisioning"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        server_url: Callable[[], str],
        concurrency: int = 32,
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.server_url = server_url
        self._limit = asyncio.Semaphore(concurrency)

    async def run_once(self) -> None:
        async with self.db.session() as session:
            cluster_ids = list(
                await session.scalars(select(ClusterRow.id).where(ClusterRow.status.in_(_ACTIVE)))
            )
        for cluster_id in cluster_ids:
            try:
                await self.reconcile_cluster(cluster_id)
            except Exception:  # one cluster's trouble never stalls the others
                log.exception("provisioning: cluster %s failed this pass", cluster_id)

    async def reconcile_cluster(self, cluster_id: str) -> None:
        async with self.db.session() as session:
            cluster = await session.get(ClusterRow, cluster_id)
            if cluster is None:
                return
            if cluster.status != ClusterStatus.DELETING.value and await self._settled(
                session, cluster
            ):
                return  # nothing to provision: skip loading every node row each pass
            nodes = [
                _NodeView(
                    n.id,
                    n.name,
                    NodeState(n.state),
                    n.provider_instance_id,
                    n.provision_attempts,
                    enroll_open=n.enroll_open_at is not None,
                    reported=n.last_report_at is not None,
                )
                for n in await session.scalars(
                    select(NodeRow).where(
                        NodeRow.cluster_id == cluster_id, NodeRow.state != NodeState.REMOVED.value
                    )
                )
            ]
        provider = self.drivers.provider_for(cluster)
        if cluster.status == ClusterStatus.DELETING.value:
            await self._delete(cluster, nodes, provider)
            return
        await self._ensure_slots(cluster, nodes)
        pending = [n for n in nodes if n.state is NodeState.PROVISIONING]
        # The nodes held for acceptance in this pass share one read of the scheduler.
        listing = NodeListing(lambda: scheduler_for(self.drivers, cluster))
        await asyncio.gather(
            *(self._limited(self._step_node(cluster, n, provider, listing)) for n in pending)
        )
        await self._update_cluster_status(cluster_id)

    @staticmethod
    async def _settled(session: AsyncSession, cluster: ClusterRow) -> bool:
        """True when every slot has a node and none is still provisioning (one count)."""
        rows = await session.execute(
            select(NodeRow.state, func.count())
            .where(NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value)
            .group_by(NodeRow.state)
        )
        counts = {str(state): int(n) for state, n in rows}
        provisioning = counts.get(NodeState.PROVISIONING.value, 0)
        return (
            provisioning == 0
            and sum(counts.values()) >= cluster.size
            and cluster.status != ClusterStatus.PROVISIONING.value
        )

    async def _limited(self, step: Awaitable[None]) -> None:
        async with self._limit:
            try:
                await step
            except Exception:
                log.exception("provisioning: node step failed")

    async def _ensure_slots(self, cluster: ClusterRow, nodes: list[_NodeView]) -> None:
        """As many nodes as the cluster's size: counted, not matched by slot name (Slurm
        names a resumed node itself: ``cloud1`` fills a slot as ``hpc-001`` would). A
        missing one gets a name no node of the cluster ever had."""
        if len(nodes) >= cluster.size:
            return
        async with self.db.transaction() as session:
            live = await session.scalar(
                select(func.count()).where(
                    NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value
                )
            )
            missing = cluster.size - int(live or 0)
            if missing <= 0:
                return
            slots = await free_slots(session, cluster, missing)
            session.add_all(new_node_rows(cluster, slots=slots, now=self.clock.now()))

    async def _step_node(
        self, cluster: ClusterRow, node: _NodeView, provider: Provider, listing: NodeListing
    ) -> None:
        if node.instance_id is None:
            await self._request_machine(cluster, node, provider, listing)
            return
        instance = await provider.get_instance(node.instance_id)
        if instance is None or instance.state is InstanceState.TERMINATED:
            await self._forget_instance(cluster, node, reason="the provider no longer has it")
        elif instance.state is InstanceState.RUNNING:
            if takes_no_user_data(cluster.provider) and (node.enroll_open or not node.reported):
                # The BMC says the power is on; the machine is ours once its agent enrolled
                # and reported (the install must run it with the cluster's enroll token).
                await self._wait_for_agent(node, instance)
                return
            await self._mark_provisioned(cluster, node, instance, listing)
        elif instance.state is InstanceState.FAILED:
            await provider.terminate(instance.instance_id)
            await self._forget_instance(
                cluster, node, reason=f"boot failed: {instance.error or 'no reason given'}"
            )

    async def _request_machine(
        self, cluster: ClusterRow, node: _NodeView, provider: Provider, listing: NodeListing
    ) -> None:
        token = generate_token(NODE_TOKEN_PREFIX)
        enrolls = takes_no_user_data(cluster.provider)
        user_data = {
            "gpufleet_url": self.server_url(),
            "gpufleet_scheduler": cluster.scheduler,
            "gpufleet_provider_id": provider_id_of(cluster.id, node.name),
        }
        if not enrolls:
            user_data["gpufleet_node_token"] = token
        async with self.db.session() as session:
            stack = await stack_user_data(session, cluster.stack)
        if stack is not None:
            user_data["gpufleet_stack"] = stack
        request = ProvisionRequest(
            client_token=f"{node.id}/{node.attempts}",
            cluster_id=cluster.id,
            node_name=node.name,
            gpu_model=cluster.gpu_model,
            gpu_count=cluster.gpus_per_node,
            user_data=user_data,
        )
        try:
            instance = await provider.provision(request)
        except DriverError as exc:
            async with guarded_apply(
                self.db, row_type=NodeRow, row_id=node.id, guard=_provisioning, clock=self.clock
            ) as refused:
                if refused is None:
                    return
                refused.row.provision_error = exc.message
                refused.row.provision_error_code = exc.code
                refused.row.updated_at = refused.now
                record_event(
                    refused.session,
                    kind=EventKind.PROVIDER_ERROR,
                    message=f"node {node.name}: provision failed: {exc.message}",
                    project_id=cluster.project_id,
                    cluster_id=cluster.id,
                    node_id=node.id,
                    actor=ACTOR,
                    data={"code": exc.code},
                )
            return
        await self._hold_early(cluster, node, listing)
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=_provisioning, clock=self.clock
        ) as applied:
            if applied is None:
                return
            row = applied.row
            row.provider_instance_id = instance.instance_id
            row.provision_requested_at = applied.now
            row.provision_error, row.provision_error_code = "", None
            if enrolls:
                open_enrollment(row, now=applied.now)  # its agent enrolls for its token
            else:
                row.token_hash = hash_token(token)
            row.updated_at = applied.now
            record_event(
                applied.session,
                kind=EventKind.NODE_CREATED,
                message=f"node {node.name}: machine requested from {provider.kind} "
                f"(instance {instance.instance_id}, attempt {node.attempts + 1})",
                project_id=cluster.project_id,
                cluster_id=cluster.id,
                node_id=node.id,
                actor=ACTOR,
                data={"instance_id": instance.instance_id, "attempt": node.attempts + 1},
            )

    async def _hold_early(self, cluster: ClusterRow, node: _NodeView, listing: NodeListing) -> None:
        """Hold a node that will be tested before its machine is even up, so no job lands
        on it between its scheduler seeing it and acceptance holding it (a cloud node that
        registers takes a waiting job at once). Best effort: a scheduler that does not
        know the node yet (a kubelet not registered) refuses, and the hold made when the
        machine runs (``_mark_provisioned``) still comes before acceptance."""
        if not cluster.acceptance_tests:
            return
        try:
            await hold_for_acceptance(listing, node.name, reason=acceptance_hold())
        except DriverError as exc:
            log.debug("provisioning: node %s: early hold: %s", node.name, exc)

    async def _wait_for_agent(self, node: _NodeView, instance: Instance) -> None:
        """Show why a bare-metal node still provisions: its host is claimed and powered,
        and its agent has not enrolled (or not reported since). No timeout replaces the
        machine: an install takes what it takes, and the detail says what is missing."""
        host = instance.hostname or instance.instance_id
        if node.enroll_open:
            detail = (
                f"waiting for the agent on host {host} to enroll: install it with the "
                "cluster's enroll token (gpufleet clusters enroll-token)"
            )
        else:
            detail = f"the agent on host {host} enrolled; waiting for its first report"
        async with guarded_apply(
            self.db,
            row_type=NodeRow,
            row_id=node.id,
            guard=MachineGuard(instance.instance_id),
            clock=self.clock,
        ) as applied:
            if applied is None or applied.row.state_detail == detail:
                return
            row = applied.row
            row.hostname = row.hostname or instance.hostname
            row.scheduler_name = row.scheduler_name or instance.hostname or row.name
            row.state_detail = detail
            row.updated_at = applied.now

    async def _mark_provisioned(
        self, cluster: ClusterRow, node: _NodeView, instance: Instance, listing: NodeListing
    ) -> None:
        """The machine is up: record who it is, run the startup scripts, then hand the
        node to acceptance (or to service, where the cluster opted out). Called again
        every pass while the node is provisioning; each call moves it on if it can."""
        guard = MachineGuard(instance.instance_id)
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=guard, clock=self.clock
        ) as applied:
            if applied is None:
                return
            session, row, now = applied.session, applied.row, applied.now
            row.hostname = row.hostname or instance.hostname
            row.scheduler_name = row.scheduler_name or instance.hostname or row.name
            row.serial = instance.serial or row.serial
            row.bmc_address = instance.bmc_address
            row.rack, row.leaf_switch, row.pdu = instance.rack, instance.leaf_switch, instance.pdu
            startup = await ensure_startup(
                session,
                node=row,
                cluster=cluster,
                trigger=StartupTrigger.PROVISION,
                key=boot_key(instance.instance_id, instance.booted_at),
                actor=ACTOR,
                now=now,
            )
            if startup is not None and startup.status != StartupStatus.SUCCEEDED.value:
                if startup.status == StartupStatus.RUNNING.value:
                    detail = (
                        f"running startup script {min(startup.current + 1, len(startup.scripts))}"
                        f" of {len(startup.scripts)}"
                    )
                    if row.state_detail != detail:
                        row.state_detail = detail
                return  # running, or failed (the node stays here with the error shown)
            if not cluster.acceptance_tests:
                switch_node_state(
                    session,
                    node=row,
                    project_id=cluster.project_id,
                    target=NodeState.IN_SERVICE,
                    actor=ACTOR,
                    reason=f"machine {instance.instance_id} is running"
                    + (" and its startup scripts ran" if startup is not None else "")
                    + "; acceptance tests opted out",
                    now=now,
                )
                row.state_detail = ""
                return
            name = row.scheduler_name or row.name
        # Acceptance: no job may land on the node while it is tested.
        try:
            drained = await hold_for_acceptance(listing, name, reason=acceptance_hold())
        except DriverError as exc:
            log.warning("provisioning: node %s: drain for acceptance: %s", node.name, exc)
            return  # next pass tries again
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=guard, clock=self.clock
        ) as applied:
            if applied is None:
                return
            row = applied.row
            record_hold(
                applied.session,
                node=row,
                project_id=cluster.project_id,
                targets=(NodeState.ACCEPTANCE,),
                actor=ACTOR,
                reason=f"machine {instance.instance_id} is running"
                + (" and its startup scripts ran" if cluster.startup_scripts else "")
                + "; acceptance tests next"
                + ("" if drained or not can_hold(listing.scheduler) else _BOOT_HOLD),
                now=applied.now,
            )
            row.state_detail = "waiting for acceptance checks"

    async def _forget_instance(self, cluster: ClusterRow, node: _NodeView, *, reason: str) -> None:
        guard = MachineGuard(node.instance_id, provisioning=False)
        async with guarded_apply(
            self.db, row_type=NodeRow, row_id=node.id, guard=guard, clock=self.clock
        ) as applied:
            if applied is None:
                return
            session, row = applied.session, applied.row
            row.provider_instance_id = None
            row.token_hash = None
            row.provision_attempts += 1
            record_event(
                session,
                kind=EventKind.PROVIDER_ERROR,
                message=f"node {node.name}: instance {node.instance_id} given up: {reason}",
                project_id=cluster.project_id,
                cluster_id=cluster.id,
                node_id=node.id,
                actor=ACTOR,
                data={"instance_id": node.instance_id, "attempts": row.provision_attempts},
            )
            if row.provision_attempts >= MAX_ATTEMPTS:
                switch_node_state(
                    session,
                    node=row,
                    project_id=cluster.project_id,
                    target=NodeState.FAILED,
                    actor=ACTOR,
                    reason=f"{row.provision_attempts} provisioning attempts failed",
                    now=applied.now,
                )

    async def _update_cluster_status(self, cluster_id: str) -> None:
        async with guarded_apply(
            self.db, row_type=ClusterRow, row_id=cluster_id, guard=_any_status, clock=self.clock
        ) as applied:
            if applied is None:
                return
            await settle_cluster_status(
                applied.session, cluster=applied.row, actor=ACTOR, now=applied.now
            )

    async def _delete(
        self, cluster: ClusterRow, nodes: list[_NodeView], provider: Provider
    ) -> None:
        instance_ids = {n.instance_id for n in nodes if n.instance_id}
        # Also machines the provider has for this cluster that no row knows (a crash
        # between provisioning and recording it): nothing may be left running and billed.
        instance_ids |= {i.instance_id for i in await provider.list_instances(cluster.id)}
        await asyncio.gather(*(provider.terminate(i) for i in instance_ids))
        async with guarded_apply(
            self.db, row_type=ClusterRow, row_id=cluster.id, guard=_DELETING, clock=self.clock
        ) as applied:
            if applied is None:
                return
            session, row = applied.session, applied.row
            for node in await session.scalars(
                select(NodeRow).where(
                    NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value
                )
            ):
                for target in (NodeState.REMOVING, NodeState.REMOVED):
                    switch_node_state(
                        session,
                        node=node,
                        project_id=row.project_id,
                        target=target,
                        actor=ACTOR,
                        reason="cluster deleted",
                        now=applied.now,
                    )
                node.token_hash = None
            switch_cluster_status(
                session,
                cluster=row,
                target=ClusterStatus.DELETED,
                actor=ACTOR,
                reason=f"{len(instance_ids)} machines given back",
                now=applied.now,
            )
