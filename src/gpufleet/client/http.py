"""Shared HTTP helpers: turn an error response into ``ApiError``."""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from gpufleet.client.errors import ApiError
from gpufleet.core.models import ErrorResponse


def raise_for_error(response: httpx.Response) -> None:
    """Raise ``ApiError`` for a non-2xx response, with the server's code, message, field.

    The server's error body is an ``ErrorResponse``; anything else (a proxy's page, an
    empty body) keeps the status, with the text as the message.
    """
    if response.is_success:
        return
    try:
        body = ErrorResponse.model_validate_json(response.content)
    except ValidationError:
        message = response.text[:500] or response.reason_phrase
        raise ApiError(response.status_code, "http_error", message) from None
    err = body.error
    raise ApiError(response.status_code, err.code, err.message, field=err.field)
