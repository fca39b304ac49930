from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

import gpufleet.server.services.cluster_provider_config as provider_config_services
import gpufleet.server.services.clusters as clusters_services
from gpufleet.core.enums import ClusterStatus
from gpufleet.core.models import Cluster, ClusterStatusReport, Page
from gpufleet.core.providers import ClusterProviderConfig
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.clusters import (
    CreateClusterRequest,
    SetProviderConfigRequest,
    UpdateClusterRequest,
)
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/clusters", tags=["clusters"])


@router.get("")
async def list_clusters(
    caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)],
    ctx: CtxDep,
    project: str | None = Query(default=None, max_length=63),
    name: str | None = Query(default=None, max_length=63),
    status: ClusterStatus | None = None,
) -> Page[Cluster]:
    async with ctx.db.reader() as session:
        return await clusters_services.list_clusters(
            session,
            caller=caller,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
            project_ref=project,
            name=name,
            status=status,
        )


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_cluster(
    body: CreateClusterRequest,
    caller: Annotated[Caller, Allow(Permission.CLUSTER_CREATE)],
    ctx: CtxDep,
) -> Cluster:
    """Create a cluster. A kubernetes one's API server is asked first, with the
    kubeconfig given (outside the transaction: it waits on the network); the kubeconfig
    is then stored sealed with the cluster, or nothing is."""
    kube = await clusters_services.check_cluster_access(
        ctx.db, caller=caller, request=body, drivers=ctx.drivers, keyring=ctx.keyring
    )
    async with ctx.db.transaction() as session:
        return await clusters_services.create_cluster(
            session, caller=caller, request=body, drivers=ctx.drivers, keyring=ctx.keyring,
            kube=kube,
        )  # fmt: skip


@router.get("/{cluster_id}")
async def get_cluster(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)], ctx: CtxDep
) -> Cluster:
    async with ctx.db.reader() as session:
        return await clusters_services.get_cluster(
            session,
            caller=caller,
            cluster_id=cluster_id,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
        )


@router.get("/{cluster_id}/status")
async def get_cluster_status(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)], ctx: CtxDep
) -> ClusterStatusReport:
    async with ctx.db.reader() as session:
        cluster = await clusters_services.get_cluster(
            session,
            caller=caller,
            cluster_id=cluster_id,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
        )
    assert cluster.nodes is not None  # get_cluster always counts the nodes
    return ClusterStatusReport(
        id=cluster.id,
        name=cluster.name,
        status=cluster.status,
        status_detail=cluster.status_detail,
        health=cluster.health,
        size=cluster.size,
        nodes=cluster.nodes,
    )


@router.patch("/{cluster_id}")
async def update_cluster(
    cluster_id: str,
    body: UpdateClusterRequest,
    caller: Annotated[Caller, Allow(Permission.CLUSTER_CREATE)],
    ctx: CtxDep,
) -> Cluster:
    """Acceptance opt-out and suite, startup scripts, autoscaling bounds (admins)."""
    async with ctx.db.transaction() as session:
        return await clusters_services.update_cluster(
            session,
            caller=caller,
            cluster_id=cluster_id,
            request=body,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
        )


@router.get("/{cluster_id}/provider-config")
async def get_provider_config(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.CLUSTER_READ)], ctx: CtxDep
) -> ClusterProviderConfig:
    """The cluster's provider and its configuration (a credential by name only)."""
    async with ctx.db.reader() as session:
        return await provider_config_services.get_provider_config(
            session, caller=caller, cluster_id=cluster_id
        )


@router.put("/{cluster_id}/provider-config")
async def set_provider_config(
    cluster_id: str,
    body: SetProviderConfigRequest,
    caller: Annotated[Caller, Allow(Permission.CLUSTER_CREATE)],
    ctx: CtxDep,
) -> ClusterProviderConfig:
    """Replace the configuration of the cluster's provider (admins); checked against the
    provider, its credential a stored aws_key of the project."""
    async with ctx.db.transaction() as session:
        return await provider_config_services.set_provider_config(
            session,
            caller=caller,
            cluster_id=cluster_id,
            raw=body.config,
            reason=body.reason,
            now=ctx.clock.now(),
        )


@router.delete("/{cluster_id}", status_code=status.HTTP_202_ACCEPTED)
async def delete_cluster(
    cluster_id: str, caller: Annotated[Caller, Allow(Permission.CLUSTER_DELETE)], ctx: CtxDep
) -> Cluster:
    async with ctx.db.transaction() as session:
        return await clusters_services.delete_cluster(
            session, caller=caller, cluster_id=cluster_id, now=ctx.clock.now()
        )
