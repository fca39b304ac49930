"""Agent endpoints. Only node tokens work here, and only for their own node."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError

from gpufleet.core.agent_protocol import (
    EventAck,
    EventBatch,
    FindingAck,
    FindingBatch,
    ReportAck,
    ReportBatch,
)
from gpufleet.server.deps import (
    CtxDep,
    JsonBody,
    NodeCallerDep,
    NodeToken,
    body_schema,
    parse_json_body,
)
from gpufleet.server.services.agent_events import apply_event_batch
from gpufleet.server.services.agent_findings import apply_finding_batch
from gpufleet.server.services.command_signals import signals_for
from gpufleet.server.services.node_callers import resolve_node_caller

router = APIRouter(prefix="/agent", tags=["agent"])


@router.post("/reports", response_model=ReportAck, openapi_extra=body_schema(ReportBatch))
async def post_reports(token_hash: NodeToken, request: Request, ctx: CtxDep) -> Response:
    """The hottest route: it parses the body straight from bytes with pydantic (one pass,
    no intermediate dict) and returns the ack's JSON as is, skipping FastAPI's generic
    request and response validation, which cost more than the store write. The token is
    resolved by the ingest's group commit, one query for the whole group."""
    try:
        batch = parse_json_body(ReportBatch, await request.body())
    except RequestValidationError:
        # A forged token is a 401 whatever the body: look it up before saying what is
        # wrong with the body (only on this path: the group commit looks it up otherwise).
        async with ctx.db.session() as session:
            await resolve_node_caller(session, token_hash=token_hash)
        raise
    ack = await ctx.ingest.submit(token_hash=token_hash, batch=batch)
    # A set lookup (the store is read at most once a second per replica): agents that do
    # not hold a command poll open learn here that commands wait for them.
    if await signals_for(ctx.db, clock=ctx.clock).has_waiting(ack.node_id):
        ack = ack.model_copy(update={"commands_waiting": True})
    return Response(content=ack.model_dump_json(), media_type="application/json")


@router.post("/findings", openapi_extra=body_schema(FindingBatch))
async def post_findings(
    caller: NodeCallerDep,
    body: Annotated[FindingBatch, Depends(JsonBody(FindingBatch))],
    ctx: CtxDep,
) -> FindingAck:
    """Finding changes, sent by the agent the moment a detector emits them."""
    async with ctx.db.transaction() as session:
        return await apply_finding_batch(
            session,
            caller=caller,
            batch=body,
            now=ctx.clock.now(),
            staleness_s=ctx.settings.staleness_s,
        )


@router.post("/events", openapi_extra=body_schema(EventBatch))
async def post_events(
    caller: NodeCallerDep,
    body: Annotated[EventBatch, Depends(JsonBody(EventBatch))],
    ctx: CtxDep,
) -> EventAck:
    """Timeline events from the node: a daemon restarted, a job's leftovers killed."""
    async with ctx.db.transaction() as session:
        return await apply_event_batch(session, caller=caller, batch=body)
