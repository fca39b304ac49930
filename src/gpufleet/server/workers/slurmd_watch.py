"""The slurmd watch: the slurmd pods of each kubernetes cluster with Slurm on its nodes
(``scheduler_config.slurm``, Slinky), read every ``slurmd_watch_interval_s``; a pod its
controller restarted or replaced becomes an event (``services/kube_daemons.py``). A
cluster whose API server does not answer is tried again next pass."""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from sqlalchemy import select

from gpufleet.core.enums import ClusterStatus, SchedulerKind
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.kubernetes.parsing import KubePod
from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.kube_daemons import SlurmdPod, record_slurmd_pods
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)

_LIVE = [ClusterStatus.READY.value, ClusterStatus.DEGRADED.value, ClusterStatus.PROVISIONING.value]


@runtime_checkable
class _SlurmdPods(Protocol):
    async def slurmd_pods(self) -> list[KubePod]: ...


class SlurmdWatchLoop(LoopService):
    name = "slurmd-watch"

    def __init__(self, deps: LoopDeps, *, interval_s: float, drivers: DriverRegistry) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers

    async def run_once(self) -> None:
        async with self.db.session() as session:
            clusters = list(
                await session.scalars(
                    select(ClusterRow).where(
                        ClusterRow.scheduler == SchedulerKind.KUBERNETES.value,
                        ClusterRow.status.in_(_LIVE),
                    )
                )
            )
        for cluster in clusters:
            if not (cluster.scheduler_config or {}).get("slurm"):
                continue  # no Slurm on its nodes: no slurmd pods to list
            scheduler = scheduler_for(self.drivers, cluster)
            if not isinstance(scheduler, _SlurmdPods):
                continue
            try:
                pods = await scheduler.slurmd_pods()
            except DriverError as exc:
                log.warning("slurmd watch: cluster %s: %s", cluster.name, exc.message)
                continue
            seen = [
                SlurmdPod(
                    kube_node=p.node or "",
                    pod=p.key,
                    uid=p.uid,
                    restarts=p.restarts,
                    slurm_node=p.slurm_node or "",
                    last_termination=p.last_termination,
                )
                for p in pods
            ]
            async with self.db.transaction() as session:
                nodes = list(
                    await session.scalars(
                        select(NodeRow).where(
                            NodeRow.cluster_id == cluster.id, NodeRow.removed_at.is_(None)
                        )
                    )
                )
                await record_slurmd_pods(
                    session, cluster=cluster, nodes=nodes, pods=seen, now=self.clock.now()
                )
