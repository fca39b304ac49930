"""The parts every dashboard shares: the data source and template variables, selectors,
and panel builders with the defaults gpufleet wants.

Every query reads the data source variable ``$datasource``, so one JSON imports into any
Grafana whatever its Prometheus data source is called. Series are selected by
``hostname`` and ``UUID`` (the agent's and dcgm-exporter's labels), never by
``instance``: one node scraped through two addresses (a DaemonSet pod and its host, a
replaced pod) would otherwise show twice (dcgm-exporter #355). The host list comes from
the server's ``gpufleet_node_last_report_age_seconds``, which carries both ``cluster`` and
the agent's ``hostname``: that is how a cluster narrows the agent's series, which have no
cluster label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Selectors: a regex match, so "All" (the variable's values joined with |) works.
CLUSTER = 'cluster=~"$cluster"'
HOST = 'hostname=~"$hostname"'
GPU = 'hostname=~"$hostname", UUID=~"$gpu"'
RATE = "$__rate_interval"
GPU_LEGEND = "{{hostname}} GPU {{gpu}}"
# The series that names every node with its cluster and the agent's hostname.
NODE_SERIES = "gpufleet_node_last_report_age_seconds"
TAGS = ("gpufleet",)


@dataclass(frozen=True)
class Query:
    """One panel target: PromQL and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    """A panel: ``kind`` is ``timeseries`` or ``stat``; ``unit`` a Grafana unit id."""

    title: str
    queries: Sequence[Query]
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    stacked: bool = False
    width: int = 12
    minimum: float | None = None


@dataclass(frozen=True)
class DashboardSpec:
    """A dashboard: rows of panels, and which template variables it needs."""

    uid: str
    title: str
    description: str
    rows: Sequence[tuple[str, Sequence[PanelSpec]]]
    host_variables: bool = True
    gpu_variable: bool = False
    tags: Sequence[str] = field(default_factory=tuple)


def variables(spec: DashboardSpec) -> list[DatasourceVariable | QueryVariable]:
    out: list[DatasourceVariable | QueryVariable] = [
        DatasourceVariable("datasource").label("Data source").type("prometheus")
    ]
    out.append(_query_variable("cluster", "Cluster", f"label_values({NODE_SERIES}, cluster)"))
    if spec.host_variables:
        out.append(
            _query_variable(
                "hostname", "Host", f"label_values({NODE_SERIES}{{{CLUSTER}}}, hostname)"
            )
        )
    if spec.gpu_variable:
        out.append(
            _query_variable(
                "gpu", "GPU (UUID)", f"label_values(DCGM_FI_DEV_GPU_TEMP{{{HOST}}}, UUID)"
            )
        )
    return out


def _query_variable(name: str, label: str, query: str) -> QueryVariable:
    return (
        QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
    )


def panel(spec: PanelSpec, panel_id: int) -> timeseries.Panel | stat.Panel:
    built: timeseries.Panel | stat.Panel
    if spec.kind == "stat":
        built = stat.Panel().reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
    else:
        legend = (
            VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        tooltip = VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)
        built = timeseries.Panel().legend(legend).tooltip(tooltip).fill_opacity(10)
        if spec.stacked:
            built = built.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    built = (
        built.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .height(8)
        .span(spec.width)
    )
    if spec.minimum is not None:
        built = built.min(spec.minimum)
    for index, query in enumerate(spec.queries):
        target = (
            prometheus.Dataquery()
            .datasource(DATASOURCE)
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + index))
        )
        built = built.with_target(target)
    return built


def build(spec: DashboardSpec) -> Dashboard:
    """The SDK builder for ``spec``: panels numbered from 1 in order, rows included."""
    dashboard = (
        Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags([*TAGS, *spec.tags])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
    )
    for variable in variables(spec):
        dashboard = dashboard.with_variable(variable)
    panel_id = 0
    for title, panels in spec.rows:
        panel_id += 1
        dashboard = dashboard.with_row(Row(title).id(panel_id))
        for p in panels:
            panel_id += 1
            dashboard = dashboard.with_panel(panel(p, panel_id))
    return dashboard
