"""A cluster's utilization over time read from Prometheus, for the console's Utilization
tab when ``prometheus_url`` is set: the GPU series the agents export under
dcgm-exporter's names, and what the server does not store at all (InfiniBand and NIC
throughput, local disk, NFS and Lustre I/O, under node_exporter's names).

Every query goes through the per-project query proxy (``prometheus_proxy``), so the
viewer's project label is forced into every selector exactly as for a Grafana panel: a
cluster of another project with the same name, or an agent claiming another label,
cannot add a series here. The cluster is selected by the ``cluster`` target label the
HTTP service discovery sets from the store (``prometheus_targets``).

Each chart is one query whose series are named by a ``series`` label
(``label_replace(...) or label_replace(...)``): one proxied read per chart. The first
read is alone; when Prometheus does not answer it, the rest are not tried and the tab
falls back on the telemetry tables with a note.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.core.errors import Unavailable
from gpufleet.server.db.engine import Database
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.prometheus_proxy import ProxiedAnswer, proxy_prometheus

POINTS = 240  # per series and window: a step of 15 s over 1 h, 42 min over 7 d
MIN_STEP_S = 15  # finer than a usual scrape interval shows nothing more
MIN_RATE_S = 60  # rate() needs two samples in its range: 4 scrapes at 15 s
# The tab waits no longer than this, whatever the proxy's own timeout: a slow page is
# worse than the tables' charts with a note.
CONSOLE_TIMEOUT_S = 10.0
SERIES_LABEL = "series"
# Not a NIC's own traffic: loopback, container and bridge ends, bonds (their members
# count), and IPoIB (counted on the IB port).
NIC_SKIP = "lo|veth.*|docker.*|cali.*|cni.*|flannel.*|virbr.*|br-.*|bond.*|ib.*"
# Partitions, RAM/loop disks and device-mapper/md (their member disks count), as
# node_exporter's default diskstats filter.
DISK_SKIP = r"(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+|dm-.*|md.*"


@dataclass(frozen=True)
class Curve:
    """One line: ``points`` at each step (None: no sample there)."""

    label: str
    points: list[tuple[dt.datetime, float | None]]


@dataclass(frozen=True)
class PrometheusUtilization:
    """The window's lines, by chart (as ``chart_queries`` names them); the hosts and
    GPUs reporting at the window's end."""

    curves: dict[str, list[Curve]]
    hosts: list[str]
    gpus: int
    step_s: int


def step_for(window: dt.timedelta) -> int:
    return max(MIN_STEP_S, math.ceil(window.total_seconds() / POINTS))


def _quote(value: str) -> str:
    return json.dumps(value)  # a PromQL double-quoted string takes JSON's escapes


def combined_query(parts: Sequence[tuple[str, str]]) -> str:
    """One expression of several, each series labelled ``series="<name>"``."""
    return " or ".join(
        f'label_replace({expr}, "{SERIES_LABEL}", {_quote(name)}, "", "")' for name, expr in parts
    )


def chart_queries(*, cluster: str, step_s: int) -> dict[str, list[tuple[str, str]]]:
    """Each chart's lines for ``cluster``, (name, PromQL); the proxy adds the project."""
    c = f"cluster={_quote(cluster)}"
    r = f"{max(step_s, MIN_RATE_S)}s"

    def rate(metric: str, extra: str = "") -> str:
        return f"sum(rate({metric}{{{c}{extra}}}[{r}]))"

    nic = f", device!~{_quote(NIC_SKIP)}"
    disk = f", device!~{_quote(DISK_SKIP)}"
    used, free = f"sum(DCGM_FI_DEV_FB_USED{{{c}}})", f"sum(DCGM_FI_DEV_FB_FREE{{{c}}})"
    return {
        "util": [("GPU utilization", f"avg(DCGM_FI_DEV_GPU_UTIL{{{c}}})")],
        "mem": [("memory used", f"100 * {used} / ({used} + {free})")],
        "power": [("power", f"sum(DCGM_FI_DEV_POWER_USAGE{{{c}}}) / 1000")],
        "temp": [
            ("average", f"avg(DCGM_FI_DEV_GPU_TEMP{{{c}}})"),
            ("hottest GPU", f"max(DCGM_FI_DEV_GPU_TEMP{{{c}}})"),
        ],
        "ib": [
            ("receive", rate("node_infiniband_port_data_received_bytes_total")),
            ("transmit", rate("node_infiniband_port_data_transmitted_bytes_total")),
        ],
        "nic": [
            ("receive", rate("node_network_receive_bytes_total", nic)),
            ("transmit", rate("node_network_transmit_bytes_total", nic)),
        ],
        "disk": [
            ("read", rate("node_disk_read_bytes_total", disk)),
            ("write", rate("node_disk_written_bytes_total", disk)),
        ],
        "netfs": [
            ("NFS read", rate("node_mountstats_nfs_total_read_bytes_total")),
            ("NFS write", rate("node_mountstats_nfs_total_write_bytes_total")),
            ("Lustre read", rate("gpufleet_lustre_read_bytes_total")),
            ("Lustre write", rate("gpufleet_lustre_write_bytes_total")),
        ],
    }


def inventory_query(*, cluster: str) -> str:
    return f"count by (hostname) (DCGM_FI_DEV_GPU_UTIL{{cluster={_quote(cluster)}}})"


async def load_prometheus_utilization(
    db: Database,
    *,
    caller: Caller,
    prometheus_url: str,
    timeout_s: float,
    project: str,
    cluster: str,
    start: dt.datetime,
    end: dt.datetime,
) -> PrometheusUtilization:
    """``cluster``'s charts over [start, end], as ``caller`` may read them through
    ``project``'s proxy. Unavailable when Prometheus does not answer or refuses a query
    (its message names which and why)."""
    step_s = step_for(end - start)

    async def read(endpoint: str, query: str, extra: list[tuple[str, str]]) -> list[Any]:
        answer = await proxy_prometheus(
            db,
            caller=caller,
            prometheus_url=prometheus_url,
            timeout_s=min(timeout_s, CONSOLE_TIMEOUT_S),
            project_ref=project,
            endpoint=endpoint,
            params=[("query", query), *extra],
        )
        return result_of(answer, prometheus_url=prometheus_url)

    now = [("time", _unix(end))]
    hosts = await read("query", inventory_query(cluster=cluster), now)
    charts = chart_queries(cluster=cluster, step_s=step_s)
    window = [("start", _unix(start)), ("end", _unix(end)), ("step", f"{step_s}s")]
    # Every read ends (or times out) before the page goes on: none is left running.
    answers = await asyncio.gather(
        *(read("query_range", combined_query(parts), window) for parts in charts.values()),
        return_exceptions=True,
    )
    results: list[list[Any]] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        results.append(answer)
    try:
        curves: dict[str, list[Curve]] = {}
        for (name, parts), result in zip(charts.items(), results, strict=True):
            by_label = {c.label: c for c in map(_curve, result)}
            # In the order the chart names them (``or`` answers in any order).
            curves[name] = [by_label[label] for label, _ in parts if label in by_label]
        return PrometheusUtilization(
            curves=curves,
            hosts=sorted(str(s["metric"].get("hostname", "")) for s in hosts),
            gpus=sum(int(float(s["value"][1])) for s in hosts),
            step_s=step_s,
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise Unavailable(
            f"Prometheus at {prometheus_url} answered what is not a query result: {exc!r}"
        ) from exc


def _unix(ts: dt.datetime) -> str:
    return f"{ts.timestamp():.3f}"


def result_of(answer: ProxiedAnswer, *, prometheus_url: str) -> list[Any]:
    try:
        doc = json.loads(answer.body)
    except ValueError:
        doc = {}
    if answer.status_code != 200 or not isinstance(doc, dict) or doc.get("status") != "success":
        reason = doc.get("error") if isinstance(doc, dict) else None
        raise Unavailable(
            f"Prometheus at {prometheus_url} answered {answer.status_code}: "
            f"{reason or answer.body[:200].decode('utf-8', 'replace')}"
        )
    result = doc.get("data", {}).get("result", [])
    return result if isinstance(result, list) else []


def _value(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _curve(series: dict[str, Any]) -> Curve:
    label = str(series.get("metric", {}).get(SERIES_LABEL, ""))
    points = [
        (dt.datetime.fromtimestamp(float(ts), dt.UTC), _value(v))
        for ts, v in series.get("values", [])
    ]
    return Curve(label=label, points=points)
