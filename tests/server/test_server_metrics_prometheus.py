"""A real Prometheus scrapes a real server's /metrics with the scrape token, and the
series answer PromQL as docs/metrics.md says: the nodes by state add up to the cluster's
size, every node has a fresh report age, the ingest counter grows. The alert rules load
against those series and evaluate cleanly.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from gpufleet.core.enums import NodeState
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port
from gpufleet.testing.prometheus import PrometheusServer, Result, ScrapeJob

pytestmark = pytest.mark.slow

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "gpufleet-alerts.yml"
NODES = 3


def value(result: Result) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_prometheus_scrapes_the_fleet(tmp_path: Path, own_prometheus: PrometheusServer) -> None:
    # Its own Prometheus: it asserts no alert is pending, and on the session's one an
    # earlier test's series still answer the rules' range functions for minutes.
    prometheus = own_prometheus
    port = free_port()
    owner_file, scrape_file = tmp_path / "owner-token", tmp_path / "metrics-token"
    scrape_file.write_text("gpufleet-scrape-" + "0123456789abcdef" * 3 + "\n")
    env = {
        **fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=owner_file),
        "GPUFLEET_METRICS_TOKEN_FILE": str(scrape_file),
    }
    # Prometheus first: its discovery throttle (~5 s) runs while the server starts.
    job = ScrapeJob(name="gpufleet-server", target=f"127.0.0.1:{port}", token_file=scrape_file)
    prometheus.configure([job], rule_files=[RULES])
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(url)
        owner = {"Authorization": f"Bearer {owner_file.read_text().strip()}"}
        with httpx.Client(base_url=url, headers=owner, timeout=10) as api:
            assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
            created = api.post(
                "/api/v1/clusters",
                json={"project": "ml", "name": "c1", "size": NODES, "acceptance_tests": False},
            )
            assert created.status_code == 201, created.text
        me = f'instance="127.0.0.1:{port}"'
        where = f'{{project="ml",cluster="c1",{me}}}'
        in_service = f'sum(gpufleet_nodes_by_state{{cluster="c1",state="in_service",{me}}})'
        prometheus.wait_for(in_service, until=lambda r: bool(r) and value(r) == NODES)
        assert value(prometheus.query(f"sum(gpufleet_nodes_by_state{where})")) == NODES
        assert value(prometheus.query(f"sum(gpufleet_nodes_by_health{where})")) == NODES
        states = len(NodeState) - 1  # every state but removed, zeros too
        assert value(prometheus.query(f"count(gpufleet_nodes_by_state{where})")) == states

        ages = prometheus.wait_for(
            f'gpufleet_node_last_report_age_seconds{{cluster="c1",state="in_service",{me}}} < 10',
            until=lambda r: len(r) == NODES,
        )
        assert {a["metric"]["node"] for a in ages} == {f"c1-{i:03d}" for i in range(NODES)}
        assert all(a["metric"]["job"] == "gpufleet-server" for a in ages)

        accepted = prometheus.wait_for(
            f"increase(gpufleet_agent_reports_accepted_total{{{me}}}[10s]) > 0"
        )
        assert value(accepted) > 0
        assert value(prometheus.query(f'up{{job="gpufleet-server",{me}}}')) == 1
        latency = prometheus.wait_for(
            'sum(gpufleet_http_request_duration_seconds_count{route="/api/v1/agent/reports",'
            f'method="POST",status_class="2xx",{me}}})'
        )
        assert value(latency) > 0
        loops = prometheus.wait_for(f"gpufleet_loop_last_pass_timestamp_seconds{{{me}}}", until=len)
        assert "health" in {s["metric"]["loop"] for s in loops}, loops
        breaker = f'count(gpufleet_repair_breaker_tripped{{cluster="c1",{me}}})'
        assert value(prometheus.query(breaker)) == 1

        # Every rule evaluated against these series without an error, and none is pending
        # or firing on a fleet that is fine.
        deadline = time.monotonic() + 10
        while any(r["lastEvaluation"].startswith("0001") for r in _rules(prometheus)):
            assert time.monotonic() < deadline, _rules(prometheus)
            time.sleep(0.25)
        broken = [r for r in _rules(prometheus) if r["health"] != "ok"]
        assert not broken, broken
        assert prometheus.query("ALERTS") == []
    finally:
        server.stop()


def _rules(prometheus: PrometheusServer) -> Result:
    return [rule for group in prometheus.rules() for rule in group["rules"]]
