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
    """The cluster's scheduler driver, scoped to the cluster where the driver serves many
    (the sim: node names repeat across clusters)."""
    scheduler = drivers.scheduler(str(cluster.scheduler))  # the plain value, also of an enum
    if isinstance(scheduler, _Scoped):
        return scheduler.for_cluster(cluster.id)
    return scheduler
