"""Agent endpoints. Only node tokens work here, and only for their own node."""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.core.agent_protocol import (
    EventAck,
    EventBatch,
    FindingAck,
    FindingBatch,
    ReportAck,
    ReportBatch,
)
from gpufleet.core.errors import GpufleetError
from gpufleet.core.ids import new_id
from gpufleet.server.context import AppContext
from gpufleet.server.deps import (
    CtxDep,
    JsonBody,
    NodeCallerDep,
    NodeToken,
    body_schema,
    parse_json_body,
)
from gpufleet.server.errors import error_body, status_for
from gpufleet.server.metrics import HTTP_REQUEST_SECONDS
from gpufleet.server.requests import REQUEST_ID_HEADER
from gpufleet.server.services.agent_events import apply_event_batch
from gpufleet.server.services.agent_findings import apply_finding_batch
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX
from gpufleet.server.services.command_signals import signals_for
from gpufleet.server.services.node_callers import node_token_hash, resolve_node_caller

log = logging.getLogger(__name__)

router = APIRouter(prefix="/agent", tags=["agent"])


@router.post("/reports", response_model=ReportAck, openapi_extra=body_schema(ReportBatch))
async def post_reports(token_hash: NodeToken, request: Request, ctx: CtxDep) -> Response:
    """The hottest route: it parses the body straight from bytes with pydantic (one pass,
    no intermediate dict) and returns the ack's JSON as is, skipping FastAPI's generic
    request and response validation, which cost more than the store write. The token is
    resolved by the ingest's group commit, one query for the whole group. A server
    started by ``main`` answers the happy path in ``ReportsFastPath`` in front of the app;
    this route answers the rest (and documents the API)."""
    try:
        batch = parse_json_body(ReportBatch, await request.body())
    except RequestValidationError:
        # A forged token is a 401 whatever the body: look it up before saying what is
        # wrong with the body (only on this path: the group commit looks it up otherwise).
        async with ctx.db.session() as session:
            await resolve_node_caller(session, token_hash=token_hash)
        raise
    ack = await store_reports(ctx, token_hash=token_hash, batch=batch)
    return Response(content=ack, media_type="application/json")


async def store_reports(ctx: AppContext, *, token_hash: str, batch: ReportBatch) -> bytes:
    """The ack's JSON once the batch is stored (the route's and the fast path's work)."""
    ack = await ctx.ingest.submit(token_hash=token_hash, batch=batch)
    # A set lookup (the store is read at most once a second per replica): agents that do
    # not hold a command poll open learn here that commands wait for them.
    if await signals_for(ctx.db, clock=ctx.clock).has_waiting(ack.node_id):
        ack = ack.model_copy(update={"commands_waiting": True})
    return ack.model_dump_json().encode()


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


# -- the lean path for POST /agent/reports ------------------------------------------------

REPORTS_PATH = "/api/v1/agent/reports"
_ACK_HEADERS = [(b"content-type", b"application/json")]
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()


class ReportsFastPath:
    """Pure ASGI, outside the app (``main`` serves ``ReportsFastPath(app)``): answers a
    well-formed ``POST /api/v1/agent/reports`` without the app's middleware, router and
    FastAPI's request handling, which cost a report more CPU than storing it.

    It keeps what those layers give this route: an ``X-Request-ID`` on the answer, the
    request's latency in ``gpufleet_http_request_duration_seconds`` under the route's
    template, the body-size limit, the ``ErrorResponse`` bodies. Only a request with a
    node token, a ``Content-Length`` within the limit and a body that parses is answered
    here; anything else goes on to the app, the body replayed, and gets the route's
    answers (a forged token is a 401 whatever the body, a bad body a 400/422). A domain
    error from the store (unknown token, repeated seq, ingest unavailable) is answered
    here as the app's handler would."""

    def __init__(self, app: ASGIApp, *, ctx: AppContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != REPORTS_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        token_hash, length = _token_hash_and_length(scope)
        if token_hash is None or length is None or length > self.ctx.settings.max_body_bytes:
            await self.app(scope, receive, send)
            return
        body, ended = await _read_body(receive)
        batch = None
        if body is not None and len(body) <= self.ctx.settings.max_body_bytes:
            try:
                batch = ReportBatch.model_validate_json(body)
            except ValidationError:
                batch = None
        if batch is None:
            await self.app(scope, _replay(body, ended, receive), send)
            return
        status, content, headers = await self._answer(token_hash, batch)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *headers,
                    (b"content-length", str(len(content)).encode()),
                    (_REQUEST_ID, new_id().encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})
        HTTP_REQUEST_SECONDS.labels("POST", REPORTS_PATH, f"{status // 100}xx").observe(
            time.perf_counter() - started
        )

    async def _answer(
        self, token_hash: str, batch: ReportBatch
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        try:
            return (
                200,
                await store_reports(self.ctx, token_hash=token_hash, batch=batch),
                _ACK_HEADERS,
            )
        except GpufleetError as exc:
            status = status_for(exc)
            headers = _ACK_HEADERS
            if status == 401:
                headers = [*headers, (b"www-authenticate", b"Bearer")]
            return status, _json(error_body(exc.code, exc.message, exc.field)), headers
        except Exception:  # the app's handler for the unexpected answers the same
            log.exception("unhandled error")
            return 500, _json(error_body("internal", "internal server error")), _ACK_HEADERS


def with_reports_fast_path(app: Starlette) -> ReportsFastPath:
    """``app`` behind ``ReportsFastPath``: what a server process serves."""
    ctx: AppContext = app.state.ctx
    return ReportsFastPath(app, ctx=ctx)


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _token_hash_and_length(scope: Scope) -> tuple[str | None, int | None]:
    """The node token's hash (None: no node token) and the declared body length."""
    token_hash: str | None = None
    length: int | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token.startswith(NODE_TOKEN_PREFIX):
                token_hash = node_token_hash(token)
        elif name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None, None
    return token_hash, length


async def _read_body(receive: Receive) -> tuple[bytes | None, Message | None]:
    """The whole body, or ``None`` and the message that ended the read (a disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes | None, ended: Message | None, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if body is None and ended is not None:
                return ended
            return {"type": "http.request", "body": body or b"", "more_body": False}
        return await receive()

    return replayed
