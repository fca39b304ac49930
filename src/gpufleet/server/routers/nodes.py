from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

import gpufleet.server.services.nodes as nodes_services
from gpufleet.core.enums import Health, NodeState
from gpufleet.core.models import IssuedNodeToken, Node, Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.node_tokens import issue_node_token

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("")
async def list_nodes(
    caller: Annotated[Caller, Allow(Permission.NODE_READ)],
    ctx: CtxDep,
    cluster: str | None = Query(default=None, max_length=36),
    state: NodeState | None = None,
    health: Health | None = None,
    gpus: bool = Query(default=False, description="Include each node's GPUs."),
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Page[Node]:
    async with ctx.db.reader() as session:
        page = await nodes_services.list_nodes(
            session,
            caller=caller,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
            cluster_id=cluster,
            state=state,
            health=health,
            cursor=cursor,
            limit=limit,
            with_gpus=gpus,
        )
        # A page with nodes shows the cluster is there and visible (the list is limited to
        # the caller's projects); an empty one may be an unknown cluster: 404 then.
        if cluster is not None and not page.items:
            await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster)
        return page


@router.get("/{node_id}")
async def get_node(
    node_id: str, caller: Annotated[Caller, Allow(Permission.NODE_READ)], ctx: CtxDep
) -> Node:
    async with ctx.db.reader() as session:
        return await nodes_services.get_node(
            session,
            caller=caller,
            node_id=node_id,
            staleness_s=ctx.settings.staleness_s,
            now=ctx.clock.now(),
        )


@router.post("/{node_id}/token", status_code=status.HTTP_201_CREATED)
async def issue_token(
    node_id: str, caller: Annotated[Caller, Allow(Permission.HOST_MANAGE)], ctx: CtxDep
) -> IssuedNodeToken:
    """A new node token for the node's agent, shown once; the previous one is refused from
    now on. For machines that take no user data (bare metal) and reinstalled agents."""
    return await issue_node_token(ctx.db, caller=caller, node_id=node_id, now=ctx.clock.now())
