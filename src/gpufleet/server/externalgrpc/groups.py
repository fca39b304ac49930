"""gpufleet's clusters as Cluster Autoscaler node groups (``externalgrpc.backend``).

A group is one cluster whose autoscaling mode is ``cluster-autoscaler``; its id is the
cluster's id, its bounds the cluster's ``autoscale_min``/``autoscale_max``. CA decides;
gpufleet acts, through the same owner of a cluster's size as every other change
(``services/autoscale.py``), so CA's requests obey gpufleet's rules:

- ``increase_size`` makes the nodes' rows and answers at once; provisioning and
  acceptance run in the background (the instances show ``creating`` until in service);
- ``delete_nodes`` refuses, naming each, a node that runs GPU pods, has an open repair,
  is in acceptance or is not in service (CA has drained it; gpufleet checks anyway);
- a machine the provider refused shows on its instance with the provider's message and
  the class CA backs off on: ``OutOfResources`` for a stockout or quota, else ``Other``.

An instance's id is the node's ``spec.providerID``: ``gpufleet://<cluster id>/<node>``
(``provider_id_of``); a node is also found by its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.autoscaling import AutoscaleMode, AutoscaleSource, AutoscaleStatus
from gpufleet.core.clock import Clock
from gpufleet.core.enums import ClusterStatus, NodeState
from gpufleet.core.errors import Conflict, DriverError, InvalidInput, NotFound, OutOfCapacity
from gpufleet.schedulers.base import jobs_on_nodes
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import (
    AutoscaleActionRow,
    AutoscalePolicyRow,
    ClusterRow,
    NodeRow,
)
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.externalgrpc.backend import (
    ErrorClass,
    GroupInfo,
    GroupInstance,
    GroupOptions,
    InstanceError,
    InstanceState,
    NodeRef,
)
from gpufleet.server.services.autoscale import (
    live_node_count,
    provider_id_of,
    start_scale_down,
    start_scale_up,
)
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.schedulers import scheduler_for

ACTOR = "system:cluster-autoscaler"
GPU_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery's label of the GPU model
_GONE = (ClusterStatus.DELETING.value, ClusterStatus.DELETED.value)
_CREATING = frozenset({NodeState.PROVISIONING, NodeState.ACCEPTANCE})
# GPU bare metal takes longer than CA's 15 min default to come up and pass acceptance.
MAX_NODE_PROVISION_S = 3600.0


class ClusterNodeGroups:
    """``NodeGroupBackend`` over the store. Each call is one short transaction: a call
    CA's deadline cancels leaves all of its change or none."""

    gpu_label = GPU_LABEL

    def __init__(self, *, db: Database, clock: Clock, drivers: DriverRegistry) -> None:
        self._db = db
        self._clock = clock
        self._drivers = drivers

    async def gpu_types(self) -> list[str]:
        async with self._db.session() as session:
            clusters = await self._groups(session)
        return sorted({c.gpu_model for c in clusters})

    async def refresh(self) -> None:
        """Nothing is cached between calls: every answer is read from the store."""

    async def node_groups(self) -> list[GroupInfo]:
        async with self._db.session() as session:
            return [_info(c) for c in await self._groups(session)]

    async def group_for_node(self, node: NodeRef) -> GroupInfo | None:
        async with self._db.session() as session:
            clusters = {c.id: c for c in await self._groups(session)}
            if not clusters:
                return None
            found = await _find_node(session, list(clusters), node)
            return None if found is None else _info(clusters[found.cluster_id])

    async def target_size(self, group_id: str) -> int:
        async with self._db.session() as session:
            cluster = await self._group(session, group_id)
            return await live_node_count(session, cluster.id)

    async def increase_size(self, group_id: str, delta: int) -> None:
        if delta < 1:
            raise InvalidInput(f"delta must be positive, got {delta}", field="delta")
        async with self._db.transaction() as session:
            cluster = await self._group(session, group_id, lock=True)
            await start_scale_up(
                session, cluster=cluster, count=delta, source=AutoscaleSource.CLUSTER_AUTOSCALER,
                reasons=[f"Cluster Autoscaler asked for {delta} more node(s)"], actor=ACTOR,
                now=self._clock.now(),
            )  # fmt: skip

    async def delete_nodes(self, group_id: str, nodes: Sequence[NodeRef]) -> None:
        if not nodes:
            raise InvalidInput("no node to delete", field="nodes")
        async with self._db.session() as session:
            cluster = await self._group(session, group_id)
            rows = [await _node_in(session, cluster, ref) for ref in nodes]
        # Read the scheduler before the transaction (no network call inside one): a node
        # whose pods cannot be read is never removed. One read for all of them where the
        # scheduler can (Slurm: two commands), else a few nodes at a time: CA's deadline
        # is 5 s, whatever the number of nodes.
        in_scheduler = {row.id: row.scheduler_name or row.name for row in rows}
        jobs = await jobs_on_nodes(
            scheduler_for(self._drivers, cluster), list(in_scheduler.values())
        )
        busy: dict[str, bool | None] = {
            node_id: None if isinstance(found := jobs[name], DriverError) else bool(found)
            for node_id, name in in_scheduler.items()
        }
        names = ", ".join(r.name for r in rows)
        async with self._db.transaction() as session:
            cluster = await self._group(session, group_id, lock=True)
            fresh = [await session.get(NodeRow, r.id, populate_existing=True) for r in rows]
            await start_scale_down(
                session, cluster=cluster, nodes=[r for r in fresh if r is not None], busy=busy,
                source=AutoscaleSource.CLUSTER_AUTOSCALER,
                reasons=[f"Cluster Autoscaler asked to delete {names}"], actor=ACTOR,
                now=self._clock.now(),
            )  # fmt: skip

    async def decrease_target_size(self, group_id: str, delta: int) -> None:
        """Give up ``-delta`` requested nodes that have no machine yet (newest first)."""
        if delta >= 0:
            raise InvalidInput(f"delta must be negative, got {delta}", field="delta")
        async with self._db.transaction() as session:
            cluster = await self._group(session, group_id, lock=True)
            unstarted = list(
                await session.scalars(
                    select(NodeRow)
                    .where(
                        NodeRow.cluster_id == cluster.id,
                        NodeRow.state == NodeState.PROVISIONING.value,
                        NodeRow.provider_instance_id.is_(None),
                    )
                    .order_by(NodeRow.created_at.desc(), NodeRow.name.desc())
                )
            )
            if len(unstarted) < -delta:
                raise Conflict(
                    f"cluster {cluster.name} has {len(unstarted)} requested node(s) without a "
                    f"machine; cannot give up {-delta}"
                )
            now = self._clock.now()
            for node in unstarted[:-delta]:
                for target in (NodeState.REMOVING, NodeState.REMOVED):
                    switch_node_state(
                        session, node=node, project_id=cluster.project_id, target=target,
                        actor=ACTOR, reason="Cluster Autoscaler lowered the target size "
                        "before the machine was made", now=now,
                    )  # fmt: skip
                node.removed_at = now
            cluster.size = await live_node_count(session, cluster.id)
            cluster.updated_at = now

    async def group_nodes(self, group_id: str) -> list[GroupInstance]:
        async with self._db.session() as session:
            cluster = await self._group(session, group_id)
            rows = list(
                await session.scalars(
                    select(NodeRow)
                    .where(
                        NodeRow.cluster_id == cluster.id,
                        NodeRow.state != NodeState.REMOVED.value,
                    )
                    .order_by(NodeRow.name)
                )
            )
            leaving = {
                str(node_id)
                for action in await session.scalars(
                    select(AutoscaleActionRow).where(
                        AutoscaleActionRow.cluster_id == cluster.id,
                        AutoscaleActionRow.kind == "scale_down",
                        AutoscaleActionRow.status == AutoscaleStatus.ACTING.value,
                    )
                )
                for node_id, where in action.progress.items()
                if where != "kept"
            }
        return [_instance(cluster, row, leaving=row.id in leaving) for row in rows]

    async def group_options(self, group_id: str) -> GroupOptions | None:
        async with self._db.session() as session:
            cluster = await self._group(session, group_id)
            policy = await session.get(AutoscalePolicyRow, cluster.id)
        return GroupOptions(
            scale_down_unneeded_s=policy.scale_down_after_s if policy is not None else None,
            max_node_provision_s=MAX_NODE_PROVISION_S,
        )

    # -- lookups --------------------------------------------------------------------------

    @staticmethod
    async def _groups(session: AsyncSession) -> list[ClusterRow]:
        return list(
            await session.scalars(
                select(ClusterRow)
                .join(AutoscalePolicyRow, AutoscalePolicyRow.cluster_id == ClusterRow.id)
                .where(
                    AutoscalePolicyRow.mode == AutoscaleMode.CLUSTER_AUTOSCALER.value,
                    ClusterRow.status.not_in(_GONE),
                    ClusterRow.autoscale_min.is_not(None),
                    ClusterRow.autoscale_max.is_not(None),
                )
                .order_by(ClusterRow.id)
            )
        )

    @staticmethod
    async def _group(session: AsyncSession, group_id: str, *, lock: bool = False) -> ClusterRow:
        cluster = await session.get(ClusterRow, group_id, with_for_update=lock)
        policy = await session.get(AutoscalePolicyRow, group_id) if cluster else None
        if (
            cluster is None
            or policy is None
            or policy.mode != AutoscaleMode.CLUSTER_AUTOSCALER.value
            or cluster.status in _GONE
        ):
            raise NotFound(f"node group {group_id!r} not found", field="id")
        return cluster


def _info(cluster: ClusterRow) -> GroupInfo:
    assert cluster.autoscale_min is not None and cluster.autoscale_max is not None
    return GroupInfo(
        id=cluster.id,
        min_size=cluster.autoscale_min,
        max_size=cluster.autoscale_max,
        debug=f"gpufleet cluster {cluster.name}: {cluster.gpus_per_node} × {cluster.gpu_model}",
    )


async def _find_node(session: AsyncSession, cluster_ids: list[str], ref: NodeRef) -> NodeRow | None:
    live = [
        n
        for n in await session.scalars(
            select(NodeRow).where(
                NodeRow.cluster_id.in_(cluster_ids), NodeRow.state != NodeState.REMOVED.value
            )
        )
    ]
    for node in live:
        if ref.provider_id and ref.provider_id == provider_id_of(node.cluster_id, node.name):
            return node
    for node in live:
        if ref.name and ref.name in (node.scheduler_name, node.name):
            return node
    return None


async def _node_in(session: AsyncSession, cluster: ClusterRow, ref: NodeRef) -> NodeRow:
    node = await _find_node(session, [cluster.id], ref)
    if node is None:
        raise NotFound(
            f"node {ref.name or ref.provider_id!r} is not in node group {cluster.id}",
            field="nodes",
        )
    return node


def _instance(cluster: ClusterRow, row: NodeRow, *, leaving: bool) -> GroupInstance:
    state = NodeState(row.state)
    if leaving or state is NodeState.REMOVING:
        shown = InstanceState.DELETING
    elif state in _CREATING or state is NodeState.FAILED:
        shown = InstanceState.CREATING
    else:
        shown = InstanceState.RUNNING
    error = None
    if row.provision_error and shown is InstanceState.CREATING:
        error = InstanceError(
            code=row.provision_error_code or "provision_failed",
            message=row.provision_error,
            error_class=(
                ErrorClass.OUT_OF_RESOURCES
                if row.provision_error_code == OutOfCapacity.code
                else ErrorClass.OTHER
            ),
        )
    elif state is NodeState.FAILED:
        error = InstanceError(
            code="provision_failed",
            message=row.state_detail or f"node {row.name} failed to come up",
            error_class=ErrorClass.OTHER,
        )
    return GroupInstance(id=provider_id_of(cluster.id, row.name), state=shown, error=error)
