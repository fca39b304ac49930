"""The Reliability tab: where the cluster's GPU-hours went over a window — lost per day
(outages and jobs thrown away), by signature and by host with MTTR and MTBF, and the
latest outages with the repair behind each (``services/reliability.py``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gpufleet.core.errors import InvalidInput
from gpufleet.core.reliability import ReliabilityReport
from gpufleet.server.deps import CtxDep
from gpufleet.server.services.reliability import reliability
from gpufleet.server.web.charts import Chart, Series, line_chart
from gpufleet.server.web.context import load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, render_page
from gpufleet.server.web.session import WebUserDep

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

WINDOWS = {"7d": dt.timedelta(days=7), "30d": dt.timedelta(days=30), "90d": dt.timedelta(days=90)}
LISTED = 25  # outages and hosts shown


@router.get("/clusters/{cluster_id}/reliability")
async def reliability_tab(
    cluster_id: str,
    request: Request,
    ctx: CtxDep,
    user: WebUserDep,
    window: Annotated[str, Query(max_length=4)] = "30d",
) -> Response:
    if window not in WINDOWS:
        raise InvalidInput(f"window must be one of {', '.join(WINDOWS)}", field="window")
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        report = await reliability(
            session,
            caller=user.caller,
            since=now - WINDOWS[window],
            until=now,
            cluster_id=page.cluster.id,
        )
    return render_page(
        request,
        "tab_reliability.html",
        page.context(
            user,
            "reliability",
            report=report,
            charts=[_lost_per_day(report)],
            hosts=report.by_host[:LISTED],
            outages=report.outages[:LISTED],
            window=window,
            windows=list(WINDOWS),
        ),
    )


def _lost_per_day(report: ReliabilityReport) -> Chart:
    """GPU-hours lost each day (UTC): to outages, and with jobs that failed as a node
    broke; a day with nothing lost is a zero, not a gap."""
    start = dt.datetime.combine(report.since.date(), dt.time(), dt.UTC)
    days = [start + dt.timedelta(days=i) for i in range((report.until - start).days + 1)]
    lost = {row.key: row for row in report.by_day}
    outages: list[tuple[dt.datetime, float | None]] = []
    jobs: list[tuple[dt.datetime, float | None]] = []
    for day in days:
        row = lost.get(day.date().isoformat())
        outages.append((day, row.gpu_hours_lost if row else 0.0))
        jobs.append((day, row.job_gpu_hours_lost if row else 0.0))
    return line_chart(
        [Series("outages", outages), Series("failed jobs", jobs)],
        title="GPU-hours lost per day",
        unit="GPU-h",
        start=days[0],
        end=days[-1],
        gap_s=2 * 86400,
        empty_title="Nothing in this window.",
        empty_text="The cluster has no history in this window yet.",
    )
