"""Agent endpoints. Only node tokens work here, and only for their own node."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from gpufleet.core.agent_protocol import (
    EventAck,
    EventBatch,
    FindingAck,
    FindingBatch,
    ReportAck,
    ReportBatch,
)
from gpufleet.server.deps import CtxDep, NodeCallerDep, NodeToken
from gpufleet.server.services.agent_events import apply_event_batch
from gpufleet.server.services.agent_findings import apply_finding_batch
from gpufleet.server.services.command_signals import signals_for

router = APIRouter(prefix="/agent", tags=["agent"])


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself (see ``post_reports``)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")
                }
            },
        }
    }


@router.post("/reports", response_model=ReportAck, openapi_extra=body_schema(ReportBatch))
async def post_reports(token_hash: NodeToken, request: Request, ctx: CtxDep) -> Response:
    """The hottest route: it parses the body straight from bytes with pydantic (one pass,
    no intermediate dict) and returns the ack's JSON as is, skipping FastAPI's generic
    request and response validation, which cost more than the store write. The token is
    resolved by the ingest's group commit, one query for the whole group."""
    try:
        batch = ReportBatch.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None
    ack = await ctx.ingest.submit(token_hash=token_hash, batch=batch)
    # A set lookup (the store is read at most once a second per replica): agents that do
    # not hold a command poll open learn here that commands wait for them.
    if await signals_for(ctx.db, clock=ctx.clock).has_waiting(ack.node_id):
        ack = ack.model_copy(update={"commands_waiting": True})
    return Response(content=ack.model_dump_json(), media_type="application/json")


@router.post("/findings")
async def post_findings(caller: NodeCallerDep, body: FindingBatch, ctx: CtxDep) -> FindingAck:
    """Finding changes, sent by the agent the moment a detector emits them."""
    async with ctx.db.transaction() as session:
        return await apply_finding_batch(
            session,
            caller=caller,
            batch=body,
            now=ctx.clock.now(),
            staleness_s=ctx.settings.staleness_s,
        )


@router.post("/events")
async def post_events(caller: NodeCallerDep, body: EventBatch, ctx: CtxDep) -> EventAck:
    """Timeline events from the node: a daemon restarted, a job's leftovers killed."""
    async with ctx.db.transaction() as session:
        return await apply_event_batch(session, caller=caller, batch=body)
