"""Enrollment of bare-metal agents (``services/enrollment.py``): a cluster's enroll token,
and the agent's trade of it for its node's token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status

from gpufleet.core.agent_protocol import EnrollAck, EnrollRequest
from gpufleet.core.models import EnrollTokenRequest, IssuedEnrollToken
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep, EnrollToken, JsonBody, body_schema, client_ip
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.enrollment import check_enroll_token, enroll, issue_enroll_token

router = APIRouter(tags=["enrollment"])


@router.post("/clusters/{cluster_id}/enroll-token", status_code=status.HTTP_201_CREATED)
async def issue_token(
    cluster_id: str,
    body: EnrollTokenRequest,
    caller: Annotated[Caller, Allow(Permission.HOST_MANAGE)],
    ctx: CtxDep,
) -> IssuedEnrollToken:
    """A new enroll token for the cluster's bare-metal installs, shown once; the previous
    one is refused from now on."""
    return await issue_enroll_token(
        ctx.db, caller=caller, cluster_id=cluster_id, request=body, now=ctx.clock.now()
    )


async def _checked_enroll_token(token_hash: EnrollToken, ctx: CtxDep) -> str:
    await check_enroll_token(ctx.db, token_hash=token_hash, now=ctx.clock.now())
    return token_hash


@router.post(
    "/agent/enroll",
    status_code=status.HTTP_201_CREATED,
    openapi_extra=body_schema(EnrollRequest),
)
async def enroll_agent(
    token_hash: Annotated[str, Depends(_checked_enroll_token)],
    body: Annotated[EnrollRequest, Depends(JsonBody(EnrollRequest))],
    request: Request,
    ctx: CtxDep,
) -> EnrollAck:
    """A bare-metal machine's agent, with its cluster's enroll token as the bearer, gets
    the token of the node waiting for its host (shown once). The token is checked before
    the body is read: a forged one is a 401 whatever the body."""
    return await enroll(
        ctx.db,
        token_hash=token_hash,
        request=body,
        source_ip=client_ip(request),
        now=ctx.clock.now(),
    )
