"""Shared HTTP helpers: turn an error response into ``ApiError``."""

from __future__ import annotations

import httpx

from gpufleet.client.errors import ApiError


def raise_for_error(response: httpx.Response) -> None:
    """Raise ``ApiError`` for a non-2xx response, with the server's code, message, field.

    The server's error body is ``{"error": {"code", "message", "field"}}``.
    """
    if response.is_success:
        return
    code, message, field = "http_error", response.text[:500] or response.reason_phrase, None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = str(err.get("code", code))
        message = str(err.get("message", message))
        field = err.get("field") if isinstance(err.get("field"), str) else None
    raise ApiError(response.status_code, code, message, field=field)
