"""Every panel of every exported dashboard shows data from a real Prometheus.

Real components on loopback: the ``gpufleet server`` (sim cluster of three nodes, scraped
with the scrape token); two ``gpufleet agent`` processes for two of its nodes (sim GPUs,
and the recorded sysfs/proc trees of tests/fixtures/hostio for IB, NICs, disks, NFS and
Lustre), one with an Xid written to the kernel log it follows; and, for the third node,
the agent's exporter rendering what a real H200 reported (tests/fixtures/nvml): the sim
GPUs have no PCIe counters or row remapping, the recorded part has. A fault and an
approved repair give the findings, repair and step-time series. Then, as Grafana would:
each template variable's ``label_values`` query is run, and every panel target runs with
``$cluster``, ``$hostname`` and ``$gpu`` set to all the values found; each must answer a
non-empty vector.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.collectors.base import Sample
from gpufleet.agent.exporter import last_xid_from, render
from gpufleet.agent.main import build_agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.clock import FakeClock
from gpufleet.dashboards.export import export_all
from gpufleet.testing.dashboards import as_regex, instant, panel_queries, variable_queries
from gpufleet.testing.processes import AgentProcess, ServerProcess, fast_sim_server_env, free_port
from gpufleet.testing.prometheus import PrometheusServer, ScrapeJob

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTIO = FIXTURES / "hostio"
# Panels no source here can feed (checked for a valid query only): none. NVLink counters
# come from the sim's SXM GPUs (the recorded H200, a PCIe card, has none).
NO_SOURCE_HERE: set[str] = set()
SIM_GPUS = 2


def recorded_h200_metrics(tmp: Path, hostname: str) -> bytes:
    """The agent's exporter over the samples a real H200 gave (bench/nvml_real.py)."""
    settings = AgentSettings(state_dir=tmp, node_token="t", metrics_listen=None)  # type: ignore[arg-type]
    client = AgentClient(base_url="http://127.0.0.1:1", node_token="t")
    agent = build_agent(settings, client=client, collectors=[], sources=[], clock=FakeClock())
    try:
        s = json.loads((FIXTURES / "nvml" / "nvml-sample-h200-load.json").read_text())["sample"]
        agent.latest[s["gpu_uuid"]] = Sample(
            "gpu", s["values"], s["gpu_index"], s["gpu_uuid"], s["pci_bus_id"],
            serial=s["serial"], model=s["model"], minor_number=0,
        )  # fmt: skip
        return render(agent, hostname=hostname, last_xid=last_xid_from(agent)).encode()
    finally:
        agent.spool.close()


class _Static(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_static(body: bytes) -> Iterator[int]:
    handler = type("Recorded", (_Static,), {"body": body})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def wait_serving(port: int, *, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"no agent on port {port}"
        time.sleep(0.1)  # real sleep: a real agent process starting


def wait(api: httpx.Client, path: str, ok: Any, *, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        body = api.get(path).json()
        if ok(body):
            return body
        assert time.monotonic() < deadline, f"{path}: {json.dumps(body)[:2000]}"
        time.sleep(0.2)  # real sleep: a real server process moving


def test_every_panel_has_data(tmp_path: Path, prometheus: PrometheusServer) -> None:
    port = free_port()
    owner_file, scrape_file = tmp_path / "owner-token", tmp_path / "metrics-token"
    scrape_file.write_text("gpufleet-scrape-" + "0123456789abcdef" * 3 + "\n")
    env = {
        **fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=owner_file),
        # The scheduling dashboard's pending demand is read by the accounting loop.
        "GPUFLEET_ACCOUNTING_INTERVAL_S": "1",
        "GPUFLEET_METRICS_TOKEN_FILE": str(scrape_file),
    }
    agent_ports = [free_port() for _ in range(2)]
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    agents: list[AgentProcess] = []
    stack = contextlib.ExitStack()
    url = f"http://127.0.0.1:{port}"
    try:
        server.start()
        server.wait_ready(url)
        owner = {"Authorization": f"Bearer {owner_file.read_text().strip()}"}
        with httpx.Client(base_url=url, headers=owner, timeout=10) as api:
            assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
            # A repaired node must look healthy for 1 s, not the default 30, to succeed.
            policy = {"verify_settle_s": 1.0, "verify_timeout_s": 60.0, "breaker_max_share": 0.5}
            assert api.put("/api/v1/projects/ml/repair-policy", json=policy).status_code == 200
            cluster = api.post(
                "/api/v1/clusters",
                json={"project": "ml", "name": "c1", "size": 3, "acceptance_tests": False},
            ).json()
            nodes = wait(
                api,
                f"/api/v1/nodes?cluster={cluster['id']}",
                lambda b: (
                    len(b["items"]) == 3
                    and all(n["state"] == "in_service" and n["hostname"] for n in b["items"])
                ),
            )["items"]
            hosts = sorted(n["hostname"] for n in nodes)

            # The node agents: two real processes, and a recorded H200 for the third.
            for i, hostname in enumerate(hosts[:2]):
                agent = AgentProcess(
                    server_url="http://127.0.0.1:1",  # their reports are not what is tested
                    node_token="unused",
                    state_dir=tmp_path / f"agent{i}",
                    kernel_log=tmp_path / f"kmsg{i}",
                    log_path=tmp_path / f"agent{i}.log",
                    env={
                        "GPUFLEET_AGENT_HOSTNAME": hostname,
                        "GPUFLEET_AGENT_SIM_GPUS": str(SIM_GPUS),
                        "GPUFLEET_AGENT_METRICS_LISTEN": f"127.0.0.1:{agent_ports[i]}",
                        "GPUFLEET_AGENT_SYS_ROOT": str(HOSTIO / "sys"),
                        "GPUFLEET_AGENT_PROC_ROOT": str(HOSTIO / "proc"),
                    },
                )
                agent.kernel_log.write_text("")
                agent.start()
                agents.append(agent)
            recorded_port = stack.enter_context(
                serve_static(recorded_h200_metrics(tmp_path / "h200", hosts[2]))
            )
            jobs = [
                ScrapeJob("gpufleet-server", f"127.0.0.1:{port}", token_file=scrape_file),
                *(
                    ScrapeJob(f"gpufleet-agent-{i}", f"127.0.0.1:{p}")
                    for i, p in enumerate(agent_ports)
                ),
                ScrapeJob("gpufleet-agent-recorded", f"127.0.0.1:{recorded_port}"),
            ]
            prometheus.configure(jobs)

            # Events some series exist only after: an Xid, a finding, a repair that ends.
            # The agent reads a followed log from where it was when it started: write
            # once it serves /metrics, then wait until it has read the line.
            wait_serving(agent_ports[0])
            with agents[0].kernel_log.open("a", encoding="utf-8") as log:
                log.write(
                    "[   12.250000] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, "
                    "GPU has fallen off the bus.\n"
                )
            agents[0].wait_caught_up()
            sick, lingering = nodes[0], nodes[1]  # repaired; a warning that stays open
            for node, signature in ((sick, "xid-79"), (lingering, "thermal-slowdown")):
                made = api.post(f"/api/v1/nodes/{node['id']}/faults", json={"signature": signature})
                assert made.status_code == 202, made.text
            repair = wait(
                api,
                f"/api/v1/repairs?node={sick['id']}",
                lambda b: any(r["status"] == "proposed" for r in b["items"]),
            )["items"][0]
            approved = api.post(f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "test"})
            assert approved.status_code == 200, approved.text
            # And one left waiting for an admin: the open-repair series.
            waiting = nodes[2]
            made = api.post(f"/api/v1/nodes/{waiting['id']}/faults", json={"signature": "xid-79"})
            assert made.status_code == 202, made.text
            wait(
                api,
                f"/api/v1/repairs?node={waiting['id']}",
                lambda b: any(r["status"] == "proposed" for r in b["items"]),
            )

        for series in (
            "gpufleet_repair_mttr_seconds",
            "gpufleet_repair_oldest_step_age_seconds",
            'gpufleet_repair_step_duration_seconds_count{step="draining"}',
            "gpufleet_gpu_xid_errors_total",
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "node_infiniband_state_id",
        ):
            prometheus.wait_for(series, timeout_s=40)
        prometheus.wait_for("count(up == 1) == 4", timeout_s=20)
        time.sleep(2)  # real sleep: a second scrape of each new counter, for rate()

        failures: list[str] = []
        exempt_seen: set[str] = set()
        models = [json.loads(p.read_text()) for p in export_all(tmp_path / "dashboards")]
        for model in models:
            chosen: dict[str, str] = {}
            for var in variable_queries(model):
                selector = instant(var.selector, chosen) if var.selector else "{__name__=~'.+'}"
                found = prometheus.query(f"group by ({var.label}) ({selector})")
                values = sorted(r["metric"][var.label] for r in found if var.label in r["metric"])
                if not values:
                    failures.append(f"{model['title']}: variable ${var.name} has no values")
                    values = ["none"]
                chosen[var.name] = as_regex(values)
            if "hostname" in chosen:
                assert all(h in chosen["hostname"] for h in hosts), chosen
            for query in panel_queries(model):
                result = prometheus.query(instant(query.expr, chosen))
                panel = query.where().rsplit(" / ", 1)[0]
                if panel in NO_SOURCE_HERE:
                    exempt_seen.add(panel)
                elif not result:
                    failures.append(f"{query.where()}: no data for {query.expr}")
        assert exempt_seen == NO_SOURCE_HERE, "a panel exempted above no longer exists"
        assert not failures, "\n".join(failures)
    finally:
        for agent in agents:
            agent.stop()
        stack.close()
        server.stop()
        prometheus.configure([])
