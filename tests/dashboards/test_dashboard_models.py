"""The dashboards' JSON models, offline: stable uids and titles, every panel queries
the data source variable with PromQL that promtool parses, selects by hostname and UUID
(never instance), and rates its counters."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpufleet.dashboards.export import DASHBOARDS, file_name, render, render_text
from gpufleet.testing.dashboards import as_regex, instant, panel_queries, variable_queries

MODELS = [render(spec) for spec in DASHBOARDS]
# Counters and histogram buckets: only ever read through rate() or increase().
COUNTER = re.compile(r"\b([a-z][a-z0-9_]*(?:_total|_bucket))\b")
RATED = re.compile(r"(?:rate|increase)\(\s*$")


def panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in model["panels"] if p["type"] != "row"]


def test_uids_titles_and_files_are_unique_and_stable() -> None:
    uids = [m["uid"] for m in MODELS]
    assert len(set(uids)) == len(uids) == 5
    assert len({m["title"] for m in MODELS}) == len(MODELS)
    assert uids == [
        "gpufleet-fleet",
        "gpufleet-gpu",
        "gpufleet-network",
        "gpufleet-storage",
        "gpufleet-scheduling",
    ]
    assert all(len(uid) <= 40 for uid in uids)  # Grafana's limit
    assert len({file_name(spec) for spec in DASHBOARDS}) == len(DASHBOARDS)
    assert [render_text(spec) for spec in DASHBOARDS] == [render_text(s) for s in DASHBOARDS]


@pytest.mark.parametrize("model", MODELS, ids=[m["uid"] for m in MODELS])
def test_every_panel_queries_the_datasource_variable(model: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == ref, v["name"]
    ids = [p["id"] for p in model["panels"]]
    assert len(set(ids)) == len(ids)
    assert panels(model)
    for p in panels(model):
        assert p["datasource"] == ref, p["title"]
        assert p["targets"], f"{p['title']}: no target"
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == ref, p["title"]
            assert t["expr"].strip(), p["title"]


@pytest.mark.parametrize("model", MODELS, ids=[m["uid"] for m in MODELS])
def test_queries_select_by_hostname_and_rate_counters(model: dict[str, Any]) -> None:
    defined = {v["name"] for v in model["templating"]["list"]}
    for q in panel_queries(model):
        # The one use of the scrape address: folding the server replicas' copies of a
        # store gauge into one (``max without (instance)``), never to select a node.
        expr = q.expr.replace("max without (instance)", "")
        assert "instance" not in expr, f"{q.where()}: select by hostname, not instance"
        used = set(re.findall(r"\$(\w+)", q.expr)) - {"__rate_interval", "__interval"}
        assert used <= defined, f"{q.where()}: undefined {used - defined}"
        for match in COUNTER.finditer(q.expr):
            assert RATED.search(q.expr[: match.start()]), (
                f"{q.where()}: counter {match[1]} read without rate()/increase()"
            )
    host_vars = [v for v in variable_queries(model) if v.name != "cluster"]
    assert all(v.label in ("hostname", "UUID") for v in host_vars)


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    """Every panel and variable query, variables substituted as Grafana does, is PromQL
    that Prometheus parses (as recording rules: ``promtool check rules``)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    chosen = {"cluster": as_regex(["c1"]), "hostname": as_regex(["node-1.example"]),
              "gpu": as_regex(["GPU-0"]), "datasource": "x"}  # fmt: skip
    rules = [
        {"record": f"gpufleet:check_{i}", "expr": instant(q.expr, chosen)}
        for i, q in enumerate(q for m in MODELS for q in panel_queries(m))
    ]
    rules += [
        {"record": f"gpufleet:var_{i}", "expr": instant(v.selector, chosen)}
        for i, v in enumerate(v for m in MODELS for v in variable_queries(m))
    ]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
