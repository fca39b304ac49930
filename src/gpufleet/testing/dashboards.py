"""Reading exported dashboards the way Grafana would run them, for tests.

``panel_queries`` lists every panel target of a dashboard's JSON model;
``variable_queries`` its template variables' ``label_values`` queries; ``instant``
makes a panel expression an instant query Prometheus' ``/api/v1/query`` answers,
substituting the template variables as Grafana does (a regex of the chosen values) and
Grafana's interval variables by a fixed window.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# Grafana's built-in interval variables; 1m covers 4+ samples at the tests' 1 s scrape.
BUILTINS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1m"}
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    def where(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


@dataclass(frozen=True)
class VariableQuery:
    name: str
    selector: str
    label: str


def panel_queries(model: Mapping[str, Any]) -> Iterator[PanelQuery]:
    for panel in model.get("panels") or []:
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets") or []:
            yield PanelQuery(
                model["title"], panel["title"], target.get("refId", ""), target.get("expr", "")
            )


def variable_queries(model: Mapping[str, Any]) -> Iterator[VariableQuery]:
    for variable in model["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable["query"])
        if match is None:
            raise ValueError(f"{variable['name']}: not a label_values() query: {variable['query']}")
        yield VariableQuery(variable["name"], match["selector"] or "", match["label"])


def as_regex(values: list[str]) -> str:
    """What Grafana's Prometheus data source puts for a multi-value variable in ``=~``:
    regex metacharacters escaped, the backslash doubled for the PromQL string."""
    return "(" + "|".join(re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", v) for v in values) + ")"


def instant(expr: str, chosen: Mapping[str, str]) -> str:
    """``expr`` with ``$name`` replaced by ``chosen[name]`` and the built-in intervals;
    raises KeyError for a variable nobody chose."""
    for name, window in BUILTINS.items():
        expr = expr.replace(name, window)

    def value(match: re.Match[str]) -> str:
        return chosen[match["name"]]

    return re.sub(r"\$(?P<name>\w+)", value, expr)
