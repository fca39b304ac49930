"""Domain errors → HTTP, in one place. Every error body is a ``core.models.ErrorResponse``:
``{"error": {"code": ..., "message": ..., "field": ...}}``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "Refused: what was wrong, and the field"},
    "5XX": {"model": ErrorResponse, "description": "The server or a driver failed"},
}


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

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    async def on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(error_body("internal", "internal server error"), status_code=500)

    app.add_exception_handler(GpufleetError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
