"""Shared HTTP helpers: turn an error response into ``ApiError``; send to one of the
server's replicas, failing over to the next when one is down (docs/high-availability.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import ValidationError

from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.models import ErrorResponse

# Answers that mean "this replica cannot serve now" (a proxy without its upstream, a
# server shutting down or without its database, a gateway timeout): the next one may.
# Any other answer, a 4xx above all, is the server's word and is never retried elsewhere.
FAILOVER_STATUSES = frozenset({502, 503, 504})
# A 504 may come after the upstream acted: only a request safe to repeat moves on.
_UNSAFE_FAILOVER_STATUSES = frozenset({502, 503})
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


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


def parse_server_urls(value: str | Sequence[str]) -> list[str]:
    """``"http://a:8080, http://b:8080/"`` (or a list) → the URLs, without a trailing ``/``.

    One URL is a list of one. Raises ``ValueError`` naming what is accepted when nothing
    is left, or an entry is not an http(s) URL.
    """
    parts = value.split(",") if isinstance(value, str) else list(value)
    urls = [p.strip().rstrip("/") for p in parts if p.strip()]
    if not urls:
        raise ValueError("no server URL: give one, or several separated by commas")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not a server URL: http(s)://host[:port], comma-separated")
    if len(set(urls)) != len(urls):
        raise ValueError(f"a server URL is given twice in {', '.join(urls)}")
    return urls


class ServerUrls:
    """The replicas of one gpufleet server, and the one to ask first.

    Sticky: the replica that answered last is asked first next time, so a client settles
    on a working replica instead of paying for a dead one on every request. On failure
    the others are tried in the configured order after it, wrapping around.
    """

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.all: tuple[str, ...] = tuple(parse_server_urls(urls))
        self._current = 0

    @property
    def current(self) -> str:
        return self.all[self._current]

    def in_order(self) -> list[str]:
        """Every URL once: the current one first, then the ones after it."""
        n = len(self.all)
        return [self.all[(self._current + i) % n] for i in range(n)]

    def settle(self, url: str) -> None:
        self._current = self.all.index(url)

    def __str__(self) -> str:
        return ", ".join(self.all)


def _can_fail_over(exc: httpx.TransportError, *, idempotent: bool) -> bool:
    """Whether a request that failed this way may go to another replica. One that never
    reached a server always may; one that may have been acted on (the connection dropped
    or timed out after it was sent) only if it is safe to repeat."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    return idempotent


def _moves_on(response: httpx.Response, *, idempotent: bool) -> bool:
    statuses = FAILOVER_STATUSES if idempotent else _UNSAFE_FAILOVER_STATUSES
    return response.status_code in statuses


def _why(exc: Exception) -> str:
    return str(exc) or repr(exc)  # a dropped connection's error can have no message


def _unreachable(failures: list[tuple[str, Exception]]) -> ServerUnreachable:
    if len(failures) == 1:
        url, exc = failures[0]
        return ServerUnreachable(f"cannot reach the gpufleet server at {url}: {_why(exc)}")
    tried = "; ".join(f"{url}: {_why(exc)}" for url, exc in failures)
    return ServerUnreachable(f"cannot reach any gpufleet server replica ({tried})")


def is_idempotent(method: str) -> bool:
    """HTTP's own rule: POST and PATCH may act twice if repeated."""
    return method.upper() in _IDEMPOTENT_METHODS


def send_with_failover(
    http: httpx.Client,
    urls: ServerUrls,
    method: str,
    path: str,
    *,
    idempotent: bool,
    **kwargs: Any,
) -> httpx.Response:
    """Send ``method path`` to the current replica, then to the next while one is down.

    ``kwargs`` go to ``httpx.Client.request``. Returns the first answer that is not a
    failover status (or the last replica's answer, whatever it is). Raises
    ``ServerUnreachable`` naming each replica tried when none answered, or when a request
    not ``idempotent`` may have reached one (it is not sent twice).
    """
    failures: list[tuple[str, Exception]] = []
    order = urls.in_order()
    for i, url in enumerate(order):
        last = i == len(order) - 1
        try:
            response = http.request(method, url + path, **kwargs)
        except httpx.TransportError as exc:
            failures.append((url, exc))
            if last or not _can_fail_over(exc, idempotent=idempotent):
                raise _unreachable(failures) from exc
            continue
        if last or not _moves_on(response, idempotent=idempotent):
            urls.settle(url)
            return response
        response.close()
    raise AssertionError("unreachable: the last replica's outcome is returned or raised")


async def asend_with_failover(
    http: httpx.AsyncClient,
    urls: ServerUrls,
    method: str,
    path: str,
    *,
    idempotent: bool,
    **kwargs: Any,
) -> httpx.Response:
    """``send_with_failover`` for an ``httpx.AsyncClient`` (the agent's)."""
    failures: list[tuple[str, Exception]] = []
    order = urls.in_order()
    for i, url in enumerate(order):
        last = i == len(order) - 1
        try:
            response = await http.request(method, url + path, **kwargs)
        except httpx.TransportError as exc:
            failures.append((url, exc))
            if last or not _can_fail_over(exc, idempotent=idempotent):
                raise _unreachable(failures) from exc
            continue
        if last or not _moves_on(response, idempotent=idempotent):
            urls.settle(url)
            return response
        await response.aclose()
    raise AssertionError("unreachable: the last replica's outcome is returned or raised")
