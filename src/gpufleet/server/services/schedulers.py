"""The scheduler of one cluster."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gpufleet.core.models import Cluster
from gpufleet.schedulers.base import Scheduler
from gpufleet.server.db.tables import ClusterRow
from gpufleet.server.drivers import DriverRegistry


@runtime_checkable
class _Scoped(Protocol):
    def for_cluster(self, cluster_id: str) -> Scheduler: ...


def scheduler_for(drivers: DriverRegistry, cluster: Cluster | ClusterRow) -> Scheduler:
    """The cluster's scheduler driver: the cluster's own where the driver is per cluster
    (kubernetes: its API server and kubeconfig; building it does no I/O), else the
    server's, scoped to the cluster where the driver serves many (the sim: node names
    repeat across clusters)."""
    kind = str(cluster.scheduler)  # the plain value, also of an enum
    per_cluster = drivers.per_cluster_schedulers.get(kind)
    if per_cluster is not None:
        return per_cluster.for_cluster(cluster)
    scheduler = drivers.scheduler(kind)
    if isinstance(scheduler, _Scoped):
        return scheduler.for_cluster(cluster.id)
    return scheduler
