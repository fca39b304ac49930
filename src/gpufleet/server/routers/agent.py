"""Agent endpoints. Only node tokens work here, and only for their own node."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpufleet.core.agent_protocol import ReportAck, ReportBatch
from gpufleet.core.errors import Unauthorized
from gpufleet.server.deps import CtxDep, bearer_token
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, hash_token

router = APIRouter(prefix="/agent", tags=["agent"])


@router.post("/reports")
async def post_reports(body: ReportBatch, request: Request, ctx: CtxDep) -> ReportAck:
    token = bearer_token(request)
    if not token.startswith(NODE_TOKEN_PREFIX):
        raise Unauthorized("agent endpoints take a node token")
    return await ctx.ingest.submit(token_hash=hash_token(token), batch=body)
