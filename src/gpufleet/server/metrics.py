"""The server's in-process Prometheus instruments: what only this process sees.

API latency (the ``HttpMetrics`` middleware), background loop passes (``workers/base.py``)
and time spent in each repair step (``services/repairs.py``, as a step ends) are
observed here, into one process-wide registry with the process collector (CPU, memory,
open files). The fleet's state (nodes, findings, repairs, report ages) is not kept here:
``services/metrics.py`` reads it from the store when Prometheus scrapes, so every
replica reports the same numbers and a restart loses nothing.

Label values are route templates, loop names, repair statuses and actions: bounded sets,
never an id, a path or anything a client sends.
"""

from __future__ import annotations

import time
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.server.requests import route_template

# No ``*_created`` series: a counter's start time doubles the series count for nothing
# Prometheus queries here use (process-wide; nothing else in the server exports).
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in 0.26

# One registry per process: the routes and loops of every app in it share these (tests
# start many apps in one process and read differences, never absolute values).
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

HTTP_REQUEST_SECONDS = Histogram(
    "gpufleet_http_request_duration_seconds",
    "Time to answer an API or console request, by route template, method and status class.",
    ["method", "route", "status_class"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)

LOOP_PASS_SECONDS = Histogram(
    "gpufleet_loop_pass_duration_seconds",
    "How long one pass of a background loop took (passes this replica ran: it held the "
    "loop's lease).",
    ["loop"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    registry=REGISTRY,
)
LOOP_LAG_SECONDS = Histogram(
    "gpufleet_loop_lag_seconds",
    "How late a background loop's pass started after it was due (its interval after the "
    "previous pass ended): a busy event loop or a starved process shows here first.",
    ["loop"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
LOOP_PASSES = Counter(
    "gpufleet_loop_passes",
    "Background loop passes, by result: ok, failed (raised; logged), standby (another "
    "replica holds the loop's lease).",
    ["loop", "result"],
    registry=REGISTRY,
)
LOOP_LAST_PASS = Gauge(
    "gpufleet_loop_last_pass_timestamp_seconds",
    "Unix time the loop's last pass on this replica ended (ok or failed).",
    ["loop"],
    registry=REGISTRY,
)
LOOP_INTERVAL = Gauge(
    "gpufleet_loop_interval_seconds",
    "The loop's configured interval between passes.",
    ["loop"],
    registry=REGISTRY,
)

REPAIR_STEP_SECONDS = Histogram(
    "gpufleet_repair_step_duration_seconds",
    "Time a repair spent in a step (its status), observed when it leaves the step: "
    "proposed is the wait for approval, draining the wait for jobs.",
    ["step", "action"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400),
    registry=REGISTRY,
)


def observe_loop_pass(
    loop: str, *, interval_s: float, lag_s: float, duration_s: float | None, result: str
) -> None:
    """Record one pass of a loop (``duration_s`` None: the pass did not run here)."""
    LOOP_INTERVAL.labels(loop).set(interval_s)
    LOOP_LAG_SECONDS.labels(loop).observe(max(0.0, lag_s))
    LOOP_PASSES.labels(loop, result).inc()
    if duration_s is not None:
        LOOP_PASS_SECONDS.labels(loop).observe(duration_s)
        LOOP_LAST_PASS.labels(loop).set(time.time())


def observe_repair_step(*, step: str, action: str, seconds: float) -> None:
    """A repair left ``step`` after ``seconds`` (by the store's clock)."""
    REPAIR_STEP_SECONDS.labels(step, action).observe(max(0.0, seconds))


class IngestCounts(Protocol):
    """What the agent report ingest has counted since this process started
    (``ingest.IngestStats``)."""

    groups: int
    batches: int
    reports: int
    failures: int


class HttpMetrics:
    """Pure ASGI middleware: the latency of every HTTP request by route template.

    A request no route matched (a 404 for a made-up path) is labelled ``unmatched``, so
    a scanner cannot grow the series count.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before it responds

        async def note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, note)
        finally:
            HTTP_REQUEST_SECONDS.labels(
                scope["method"], route_template(scope) or "unmatched", f"{status // 100}xx"
            ).observe(time.perf_counter() - started)
