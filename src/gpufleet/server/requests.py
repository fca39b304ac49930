"""Per-request context: a request id (``X-Request-ID``), the client address, and the
audit row of a refused attempt.

Pure ASGI, so the context variable it sets is the one the route and its services see
(no task hop). A mutation refused after the caller was known (the permission dependency
set ``RequestInfo.target``) gets an audit row here, in its own transaction: the refused
operation's own transaction was rolled back and wrote nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.core.ids import new_id
from gpufleet.server.services.audit import RequestInfo, current_request, record_audit

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Mutating routes whose success writes no audit row, and why. Everything else that
# succeeds with POST/PUT/PATCH/DELETE writes at least one (the test app checks it).
NOT_AUDITED_PREFIXES = {
    # What agents send about their node (metrics, findings, events, command output) is
    # data, not a person's act; the state changes it causes are audited by the one
    # function each entity changes state through (services/transitions.py).
    "/api/v1/agent/": "agent ingest: node data, not a user mutation",
    # Prometheus's query API takes POST for long queries: a read, like its GET.
    "/api/v1/projects/{project_ref}/prometheus/": "a query, sent as a form: changes nothing",
}
NOT_AUDITED_ROUTES = {
    ("POST", "/api/v1/projects/{project_ref}/repair-policy/replay"): "a dry run: changes nothing",
}


def route_template(scope: Scope) -> str | None:
    """The matched route's full path template (``/api/v1/clusters/{cluster_id}``).

    FastAPI keeps included routers as objects, so ``scope["route"]`` holds the path
    relative to its router; the effective route context has the full one."""
    context = scope.get("fastapi", {}).get("effective_route_context")
    path = getattr(context, "path", None) or getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else None


def is_audited_route(method: str, path_template: str) -> bool:
    """Whether a successful ``method`` on this route must leave an audit row."""
    if method not in MUTATING_METHODS:
        return False
    if any(path_template.startswith(prefix) for prefix in NOT_AUDITED_PREFIXES):
        return False
    return (method, path_template) not in NOT_AUDITED_ROUTES


def result_of(status: int) -> str:
    """The audit ``result`` of a refused request."""
    if status in (403, 404):
        return "denied"
    if status in (400, 413, 422):
        return "invalid"
    if status == 409:
        return "conflict"
    if status == 429:
        return "rate_limited"
    return "error"


class RequestContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        info = RequestInfo(
            request_id=new_id(),
            source_ip=client[0] if client else None,
            method=scope["method"],
            path=scope["path"],
        )
        token = current_request.set(info)
        held: list[Message] = []

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.lower().encode(), info.request_id.encode()))
                message = {**message, "headers": headers}
                if self._audits_refusal(info, message["status"]):
                    held.append(message)  # sent once the error body is known
                    return
            if held:
                held.append(message)
                if message.get("more_body", False):
                    return
                await self._record_refusal(scope, info, held)
                for m in held:
                    await send(m)
                held.clear()
                return
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request.reset(token)

    @staticmethod
    def _audits_refusal(info: RequestInfo, status: int) -> bool:
        return info.method in MUTATING_METHODS and info.target is not None and status >= 400

    async def _record_refusal(
        self, scope: Scope, info: RequestInfo, messages: list[Message]
    ) -> None:
        assert info.target is not None
        status = int(messages[0]["status"])
        body = b"".join(m.get("body", b"") for m in messages[1:])
        detail: dict[str, Any] = {"status": status, "method": info.method, "path": info.path}
        template = route_template(scope)
        if template is not None:
            detail["route"] = f"{info.method} {template}"
        try:
            error = json.loads(body).get("error", {})
            # The message of our own error body: it names objects and fields, never a
            # secret (errors never echo credentials; bodies are not recorded).
            detail["code"], detail["error"] = error.get("code"), str(error.get("message"))[:500]
        except (ValueError, AttributeError):
            pass
        target = info.target
        try:
            db = scope["app"].state.ctx.db
            async with db.transaction() as session:
                record_audit(
                    session,
                    actor=target.actor,
                    action=target.permission,
                    object_type=target.object_type or "request",
                    object_id=target.object_id,
                    project_id=target.project_id,
                    result=result_of(status),
                    detail=detail,
                )
        except Exception:
            log.exception("could not write the audit row of a refused request %s", info.request_id)
