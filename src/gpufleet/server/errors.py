"""Domain errors → HTTP, in one place. Every error body is a ``core.models.ErrorResponse``:
``{"error": {"code": ..., "message": ..., "field": ...}}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from gpufleet.core.errors import (
    Conflict,
    DriverError,
    Forbidden,
    GpufleetError,
    InvalidInput,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from gpufleet.core.models import ErrorDetail, ErrorResponse

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[GpufleetError], int]] = [
    (InvalidInput, 422),
    (NotFound, 404),
    (Conflict, 409),
    (Unauthorized, 401),
    (Forbidden, 403),
    (RateLimited, 429),
    (DriverError, 502),
    (Unavailable, 503),
]


# What the OpenAPI document says every /api/v1 route may answer besides its success
# (the handlers below write them all; none is FastAPI's default validation error shape).
# Each operation also lists the 4xx it can answer by code (``document_errors``, from
# what the route takes; a route adds any other with ``responses=``): tests/server/
# test_api_fuzz.py holds the server to those; "4XX" stays for clients that read ranges.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "Refused: what was wrong, and the field"},
    "5XX": {"model": ErrorResponse, "description": "The server or a driver failed"},
}

ERROR_DESCRIPTIONS = {
    400: "The body is not valid JSON",
    401: "No valid credential (Authorization: Bearer <token>)",
    403: "Your role does not allow this (or a console form came without its CSRF token)",
    404: "An object the request names does not exist, or is not yours to see",
    409: "The object's state does not allow this now",
    413: "The body is larger than the server takes",
    422: "A parameter or field is not valid: the error's `field` names it",
    429: "Too many requests: try again after `Retry-After` seconds",
}
_ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """``ErrorResponse`` as JSON, for a ``JSONResponse``."""
    body = ErrorResponse(error=ErrorDetail(code=code, message=message, field=field))
    return body.model_dump(mode="json")


def status_for(exc: GpufleetError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def _loc_to_field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def describe_validation_errors(errors: list[Any]) -> tuple[str, str | None]:
    """One readable message for pydantic's error list, and the first field it names."""
    messages: list[str] = []
    first_field: str | None = None
    for err in errors[:10]:
        loc = tuple(err.get("loc", ()))
        field = _loc_to_field(loc)
        kind = err.get("type", "")
        if kind == "json_invalid":
            ctx = err.get("ctx", {}) or {}
            messages.append(f"body is not valid JSON: {ctx.get('error', 'parse error')}")
            field = "body"
        elif kind == "extra_forbidden":
            messages.append(f"{field}: unknown field")
        elif kind == "missing":
            messages.append(f"{field}: field required")
        else:
            messages.append(f"{field}: {err.get('msg', 'invalid value')}")
        first_field = first_field or field
    if len(errors) > 10:
        messages.append(f"... and {len(errors) - 10} more")
    return "; ".join(messages), first_field


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path. Starlette's own 405 names
    only the first route that matched the path, and FastAPI makes a route per method."""
    methods: set[str] = set()
    path = request.url.path
    for context in iter_route_contexts(request.app.router.routes):
        if context.path_format is None or not context.methods:
            continue
        regex, _, _ = compile_path(context.path_format)
        if regex.match(path):
            methods |= context.methods
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    async def on_domain_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GpufleetError)
        status = status_for(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(
            error_body(exc.code, exc.message, exc.field), status_code=status, headers=headers
        )

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, field = describe_validation_errors(list(exc.errors()))
        code = "invalid_json" if field == "body" and "JSON" in message else "invalid_input"
        status = 400 if code == "invalid_json" else 422
        return JSONResponse(error_body(code, message, field), status_code=status)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
            exc.status_code, "http_error"
        )
        message = str(exc.detail)
        headers = exc.headers
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            message = f"{request.method} is not allowed here; allowed: {', '.join(allowed)}"
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers)

    async def on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(error_body("internal", "internal server error"), status_code=500)

    app.add_exception_handler(GpufleetError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


@dataclass(frozen=True)
class RouteTraits:
    """What about a route decides the 4xx it can answer."""

    user_auth: bool  # a person's credential (403 for a role without the permission)
    agent_auth: bool  # a node's or an enroll token
    has_body: bool
    has_params: bool


def error_statuses(method: str, traits: RouteTraits) -> list[int]:
    """The 4xx an operation can answer. Every authenticated route can 404 (a named
    object, or the caller's own, gone) and 422 (a value its service refuses); a mutation
    can 409 (a state that does not allow it)."""
    codes: set[int] = set()
    if traits.user_auth or traits.agent_auth:
        codes |= {401, 404, 422}
    if traits.user_auth:
        codes.add(403)
    if traits.has_params:
        codes |= {404, 422}
    if traits.has_body:
        codes |= {400, 413, 422}
    if method not in ("GET", "HEAD"):
        codes.add(409)
    return sorted(codes)


def document_errors(operation: dict[str, Any], statuses: list[int]) -> None:
    """Write ``statuses`` into an OpenAPI operation, and make every error answer's content
    the JSON ``ErrorResponse`` it is (FastAPI gives it the route's own media type)."""
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for status in statuses:
        responses.setdefault(str(status), {"description": ERROR_DESCRIPTIONS[status]})
    for key, response in responses.items():
        if key[0] in "45":
            response["content"] = {"application/json": {"schema": _ERROR_SCHEMA}}
            if not response.get("description"):
                response["description"] = ERROR_DESCRIPTIONS.get(int(key), "Refused")
