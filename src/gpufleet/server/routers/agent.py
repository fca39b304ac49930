"""Agent endpoints. Only node tokens work here, and only for their own node."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from gpufleet.core.agent_protocol import FindingAck, FindingBatch, ReportAck, ReportBatch
from gpufleet.core.errors import Unauthorized
from gpufleet.server.deps import CtxDep, bearer_token
from gpufleet.server.services.agent_findings import apply_finding_batch
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, hash_token

router = APIRouter(prefix="/agent", tags=["agent"])


def node_token_hash(request: Request) -> str:
    """Checked before the body is parsed, so an anonymous caller learns nothing of it."""
    token = bearer_token(request)
    if not token.startswith(NODE_TOKEN_PREFIX):
        raise Unauthorized("agent endpoints take a node token")
    return hash_token(token)


NodeTokenHash = Annotated[str, Depends(node_token_hash)]


@router.post("/reports")
async def post_reports(token_hash: NodeTokenHash, body: ReportBatch, ctx: CtxDep) -> ReportAck:
    return await ctx.ingest.submit(token_hash=token_hash, batch=body)


@router.post("/findings")
async def post_findings(token_hash: NodeTokenHash, body: FindingBatch, ctx: CtxDep) -> FindingAck:
    """Finding changes, sent by the agent the moment a detector emits them."""
    async with ctx.db.transaction() as session:
        return await apply_finding_batch(
            session,
            token_hash=token_hash,
            batch=body,
            now=ctx.clock.now(),
            staleness_s=ctx.settings.staleness_s,
        )
