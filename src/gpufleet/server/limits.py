"""Request limits: a body-size limit applied before any parsing (pure ASGI, so
streaming bodies count), and a per-client rate limiter for the login endpoints."""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.core.errors import RateLimited


class BodySizeLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._reject(send)
                    return
        # Read the whole body before the app sees it (it is at most max_bytes), so a
        # streamed body that grows too large is refused with 413 before any parsing.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            seen += len(body)
            if seen > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "too_large",
                    "message": f"request body exceeds {self.max_bytes} bytes",
                    "field": "body",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key (the client IP): ``per_minute`` requests, refilled evenly.

    In memory, per replica: behind N replicas a client gets at most N times the rate,
    which is still far below what guessing needs. The number of keys is bounded, so a
    flood of spoofed sources costs memory only up to ``max_keys``.
    """

    def __init__(
        self,
        *,
        per_minute: int,
        max_keys: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = float(per_minute)
        self.refill_per_s = per_minute / 60.0
        self.max_keys = max_keys
        self._monotonic = monotonic
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def check(self, key: str, *, what: str) -> None:
        """Take one request from ``key``'s bucket, or raise ``RateLimited``."""
        now = self._monotonic()
        bucket = self._buckets.pop(key, None) or _Bucket(tokens=self.capacity, updated=now)
        refill = (now - bucket.updated) * self.refill_per_s
        bucket.tokens = min(self.capacity, bucket.tokens + refill)
        bucket.updated = now
        self._buckets[key] = bucket
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0:
            wait = math.ceil((1.0 - bucket.tokens) / self.refill_per_s)
            raise RateLimited(
                f"too many {what} requests from {key}; retry in {wait} s", retry_after_s=wait
            )
        bucket.tokens -= 1.0
