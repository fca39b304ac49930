"""The Utilization tab: GPU utilization, memory, power and temperature over time for the
cluster, and each node now, busiest and idlest first; a node's own charts are on its page.

With ``prometheus_url`` set the charts over time come from Prometheus, read through the
project's query proxy (``services/utilization_prometheus.py``), with InfiniBand, NIC and
storage throughput besides, which the server does not store. Without it, or when
Prometheus does not answer (said on the page), they come from the server's own tables
(per-minute sums, ``cluster_telemetry``), and the I/O charts say they need Prometheus.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.server.deps import CtxDep
from gpufleet.server.services.telemetry_history import (
    HISTORY_WINDOWS,
    load_cluster_history,
    nodes_now,
)
from gpufleet.server.services.utilization_prometheus import (
    PrometheusUtilization,
    load_prometheus_utilization,
)
from gpufleet.server.web.charts import Chart, cluster_charts, prometheus_charts
from gpufleet.server.web.context import load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, render_page
from gpufleet.server.web.session import WebUserDep

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

RANKED = 10  # busiest and idlest nodes listed


@router.get("/clusters/{cluster_id}/utilization")
async def utilization_tab(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    window: Annotated[str, Query(max_length=4)] = "1h",
) -> Response:
    if window not in HISTORY_WINDOWS:
        raise InvalidInput(f"window must be one of {', '.join(HISTORY_WINDOWS)}", field="window")
    now = ctx.clock.now()
    span = HISTORY_WINDOWS[window]
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        nodes = await nodes_now(session, cluster_id=page.cluster.id)
    prometheus_url = ctx.settings.prometheus_url
    from_prometheus: PrometheusUtilization | None = None
    prometheus_error: str | None = None
    if prometheus_url is not None:  # read outside the DB session: no network call in one
        try:
            from_prometheus = await load_prometheus_utilization(
                ctx.db,
                caller=user.caller,
                prometheus_url=prometheus_url,
                timeout_s=ctx.settings.prometheus_timeout_s,
                project=page.project.name,
                cluster=page.cluster.name,
                start=now - span,
                end=now,
            )
        except Unavailable as exc:
            prometheus_error = str(exc)
    io_charts: list[Chart] = []
    if from_prometheus is not None:
        charts, io_charts = prometheus_charts(from_prometheus, now=now, window=span)
    else:
        async with ctx.db.reader() as session:
            history = await load_cluster_history(
                session, cluster_id=page.cluster.id, since=now - span, until=now
            )
        charts = cluster_charts(history, now=now, window=span)
    reporting = [n for n in nodes if n.util_avg is not None]
    ranked = sorted(reporting, key=lambda n: n.util_avg or 0.0, reverse=True)
    gpus = sum(n.gpus for n in reporting)
    totals = {
        "util": sum((n.util_avg or 0.0) * n.gpus for n in reporting) / gpus if gpus else None,
        "mem": (
            100.0 * sum(n.mem_used_mib for n in reporting) / sum(n.mem_total_mib for n in reporting)
            if sum(n.mem_total_mib for n in reporting)
            else None
        ),
        "power_kw": sum(n.power_w for n in reporting) / 1000.0,
        "temp_max": max((n.temp_max for n in reporting if n.temp_max is not None), default=None),
        "gpus": gpus,
        "idle": sum(1 for n in reporting if (n.util_avg or 0.0) < 5.0),
    }
    return render_page(
        request,
        "tab_utilization.html",
        page.context(
            user,
            "utilization",
            charts=charts,
            io_charts=io_charts,
            from_prometheus=from_prometheus,
            prometheus_configured=prometheus_url is not None,
            prometheus_error=prometheus_error,
            window=window,
            windows=list(HISTORY_WINDOWS),
            busiest=ranked[:RANKED],
            idlest=list(reversed(ranked[-RANKED:])) if len(ranked) > RANKED else [],
            totals=totals,
            reporting=len(reporting),
            retention_h=ctx.settings.telemetry_history_s / 3600,
            cluster_retention_d=ctx.settings.cluster_telemetry_history_s / 86400,
        ),
    )
