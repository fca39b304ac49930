"""Every alert of deploy/prometheus/gpufleet-alerts.yml fires on a real Prometheus when
the fault it is for is injected into a real fleet.

Real components on loopback: the ``gpufleet server`` on PostgreSQL (a sim cluster of four
nodes, no simulated agents, scraped with the scrape token); three real ``gpufleet agent``
processes reporting for three of the nodes (sim GPUs; the kernel log each follows; each
its own copy of the recorded sysfs/proc trees of tests/fixtures/hostio, for the IB
ports); and for the fourth node its GPU exporter: the agent's exporter (``render``) over
the samples a real H200 gave (tests/fixtures/nvml), since no sim or recorded source here
sets the clock-event bits or loses a GPU. The session's Prometheus loads the rules and
scrapes them all.

Then the faults, as a fleet produces them, all at once where they are independent:
an Xid 79 and a storm of Xid 13 written to two agents' kernel logs; port 1 of the HCA
taken down, left in INIT, and trained down to 2X NDR in three agents' sysfs copies; the
H200's clock-event reasons set to HW + SW thermal slowdown (0x60), then the GPU gone
from its exporter; a reboot of the agentless node, which never reports again (stuck
verifying); the Xid 79's repair left proposed, and its approval tripping the repair
breaker; one agent stopped (not reporting, scrape down); in the database, one loop's
lease row held locked by another session (that loop hangs, the server runs on) and
another loop's lease writes failing as on a full disk (a trigger raising disk_full);
the server stopped. Each alert must show firing in /api/v1/alerts with the labels of the
node, GPU, port, cluster or loop it is about, active since its fault was injected (so
one the fleet's start left does not count).

THE RULES ARE CHANGED FOR THIS TEST, by ``fast_rules`` below and never in the file: every
``for:`` becomes 1 s, and the thresholds that compare an age against minutes or hours
(NodeNotReporting 300 s, RepairStuck 7200 s, RepairAwaitingApproval 14400 s, the 120 s
slack of LoopStalled) become a few seconds (FAST_THRESHOLDS). Each rewrite must match
the file exactly once, so a changed rule fails here rather than being tested unchanged.
Range windows ([10m], [1h], [1d], [15m]) and counts are left as they are.

PostgreSQL, not SQLite: on SQLite every transaction begins IMMEDIATE, so a held lock
stops /metrics too and shows as GpufleetServerDown, never as one stalled loop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from gpufleet.agent.collectors.base import Sample
from gpufleet.agent.exporter import last_xid_from, render
from gpufleet.agent.main import build_agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.clock import FakeClock
from gpufleet.sim.world import SimWorld
from gpufleet.testing.databases import PostgresTemplate
from gpufleet.testing.processes import AgentProcess, ServerProcess, fast_sim_server_env, free_port
from gpufleet.testing.prometheus import PrometheusServer, ScrapeJob

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gpufleet-alerts.yml"
FIXTURES = ROOT / "tests" / "fixtures"
HOSTIO = FIXTURES / "hostio"
PROJECT, CLUSTER = "alertfire", "af"
NODES = 4  # three with a real agent; the fourth with the recorded H200's exporter only
PORT1 = Path("class/infiniband/mlx5_0/ports/1")

# The duration thresholds scaled down for a test of seconds: alert -> (in the file, here).
FAST_THRESHOLDS: dict[str, tuple[str, str]] = {
    "GpufleetNodeNotReporting": (") > 300", ") > 6"),
    "GpufleetRepairStuck": (") > 7200", ") > 4"),
    "GpufleetRepairAwaitingApproval": (") > 14400", ") > 4"),
    "GpufleetLoopStalled": ("+ 120", "+ 2"),
}
# Two 0.3 s loops the database faults hit (the rest of the server runs on).
STALLED, FAILING = "check-runner", "autoscaler"
NO_HANG = "-c lock_timeout=10s"  # the test's own sessions never wait for long
DISK_FULL = """
CREATE FUNCTION alert_test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
END $$;
CREATE TRIGGER alert_test_disk_full BEFORE UPDATE ON lease FOR EACH ROW
  WHEN (NEW.name = 'loop:{loop}') EXECUTE FUNCTION alert_test_disk_full();
"""
XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_13 = (
    "NVRM: Xid (PCI:0000:18:00): 13, pid={pid}, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


def fast_rules(out: Path) -> list[str]:
    """The rules file with ``for:`` at 1 s and FAST_THRESHOLDS applied; returns the
    alert names."""
    document = yaml.safe_load(RULES.read_text())
    names: list[str] = []
    for group in document["groups"]:
        for rule in group["rules"]:
            names.append(rule["alert"])
            if rule.get("for", "0m") not in ("0m", "0s"):
                rule["for"] = "1s"
            if rule["alert"] in FAST_THRESHOLDS:
                old, new = FAST_THRESHOLDS[rule["alert"]]
                assert rule["expr"].count(old) == 1, f"{rule['alert']}: {old!r} not once"
                rule["expr"] = rule["expr"].replace(old, new)
    assert set(FAST_THRESHOLDS) <= set(names)
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return names


def h200_metrics(tmp: Path, *, hostname: str, reasons: float | None) -> bytes:
    """The agent's exporter over a real H200's samples (bench/nvml_real.py), its clock
    event reasons set to ``reasons``; None: the GPU is gone from NVML."""
    settings = AgentSettings(state_dir=tmp, node_token="t", metrics_listen=None)  # type: ignore[arg-type]
    client = AgentClient(base_url="http://127.0.0.1:1", node_token="t")
    agent = build_agent(settings, client=client, collectors=[], sources=[], clock=FakeClock())
    try:
        if reasons is not None:
            s = json.loads((FIXTURES / "nvml" / "nvml-sample-h200-load.json").read_text())
            s = s["sample"]
            values = {**s["values"], "clocks_event_reasons": reasons}
            agent.latest[s["gpu_uuid"]] = Sample(
                "gpu", values, s["gpu_index"], s["gpu_uuid"], s["pci_bus_id"],
                serial=s["serial"], model=s["model"], minor_number=0,
            )  # fmt: skip
        return render(agent, hostname=hostname, last_xid=last_xid_from(agent)).encode()
    finally:
        agent.spool.close()


class _Exporter(BaseHTTPRequestHandler):
    body: list[bytes]  # one cell, replaced to inject a fault

    def do_GET(self) -> None:
        body = self.body[0]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(body: list[bytes]) -> Iterator[int]:
    handler = type("H200", (_Exporter,), {"body": body})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def wait(what: str, ok: Callable[[], Any], *, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = ok()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # real sleep: real processes moving


class Alerts:
    """Every alert seen firing so far, polled from Prometheus; ``shown``: the names
    ``wait`` found firing as asked."""

    def __init__(self, prometheus: PrometheusServer) -> None:
        self.prometheus = prometheus
        self.shown: set[str] = set()
        self._seen: dict[tuple[tuple[tuple[str, str], ...], str], dict[str, Any]] = {}

    @property
    def seen(self) -> list[dict[str, Any]]:
        return list(self._seen.values())

    def poll(self) -> None:
        for alert in self.prometheus.alerts():
            if alert["state"] == "firing":  # one entry per alert and activation
                self._seen[tuple(sorted(alert["labels"].items())), alert["activeAt"]] = alert

    def find(self, name: str, labels: Mapping[str, str], *, since: float) -> dict[str, Any] | None:
        self.poll()
        for alert in self.seen:
            got = alert["labels"]
            if got["alertname"] == name and all(got.get(k) == v for k, v in labels.items()):
                active = alert["activeAt"]
                if _unix(active) >= since - 1:  # Prometheus stamps its eval time
                    return alert
        return None

    def wait(
        self, name: str, labels: Mapping[str, str], *, since: float, timeout_s: float = 30
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.find(name, labels, since=since)
            if found is not None:
                self.shown.add(name)
                return found
            if time.monotonic() > deadline:
                mine = [a["labels"] for a in self.seen if a["labels"]["alertname"] == name]
                raise AssertionError(f"{name} {dict(labels)} not firing; seen {mine}")
            time.sleep(0.3)  # real sleep: Prometheus evaluates every second


def _unix(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def set_port(sys_root: Path, *, state: str, phys: str, rate: str) -> None:
    port = sys_root / PORT1
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate)):
        tmp = port / f".{name}.new"
        tmp.write_text(text + "\n")
        tmp.replace(port / name)  # the agent never reads half a file


def test_every_alert_fires_on_its_fault(
    tmp_path: Path, own_prometheus: PrometheusServer, pg_template: PostgresTemplate
) -> None:
    prometheus = own_prometheus
    rules_path = tmp_path / "gpufleet-alerts-fast.yml"
    names = fast_rules(rules_path)
    port = free_port()
    owner_file, scrape_file = tmp_path / "owner-token", tmp_path / "metrics-token"
    scrape_file.write_text("gpufleet-scrape-" + "0123456789abcdef" * 3 + "\n")
    data_dir = tmp_path / "data"
    database_url = pg_template.clone()
    pg_url = database_url.replace("postgresql+asyncpg://", "postgresql://")
    env = {
        **fast_sim_server_env(data_dir=data_dir, port=port, token_file=owner_file),
        "GPUFLEET_METRICS_TOKEN_FILE": str(scrape_file),
        "GPUFLEET_SIM_AGENTS": "false",  # the real agents below are the nodes' only agents
        "GPUFLEET_DATABASE_URL": database_url,
    }
    agent_ports = [free_port() for _ in range(NODES - 1)]
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    agents: list[AgentProcess] = []
    h200_body: list[bytes] = [b""]
    stack = contextlib.ExitStack()
    stuck: psycopg.Connection[Any] | None = None
    alerts = Alerts(prometheus)
    try:
        # Prometheus first: its discovery throttle (~5 s) runs while the fleet starts.
        h200_port = stack.enter_context(serve(h200_body))
        me_server, me_h200 = f"127.0.0.1:{port}", f"127.0.0.1:{h200_port}"
        me_agents = [f"127.0.0.1:{p}" for p in agent_ports]
        jobs = [
            ScrapeJob("gpufleet-server", me_server, token_file=scrape_file),
            ScrapeJob("gpufleet-agent", me_agents[0], more_targets=tuple(me_agents[1:])),
            ScrapeJob("dcgm-exporter", me_h200),
        ]
        prometheus.configure(jobs, rule_files=[rules_path])
        server.start()
        server.wait_ready(url)
        owner = {"Authorization": f"Bearer {owner_file.read_text().strip()}"}
        api = stack.enter_context(httpx.Client(base_url=url, headers=owner, timeout=10))
        assert api.post("/api/v1/projects", json={"name": PROJECT}).status_code == 201
        cluster = api.post(
            "/api/v1/clusters",
            json={"project": PROJECT, "name": CLUSTER, "size": NODES, "acceptance_tests": False},
        ).json()
        nodes = wait(
            "every node in service",
            lambda: (
                items
                if len(items := api.get(f"/api/v1/nodes?cluster={cluster['id']}").json()["items"])
                == NODES
                and all(n["state"] == "in_service" for n in items)
                else None
            ),
        )
        nodes.sort(key=lambda n: n["name"])
        world = SimWorld(data_dir / "sim-world.json")
        instances = {i.instance_id: i for i in world.list_instances(cluster_id=cluster["id"])}
        machines = [instances[n["provider_instance_id"]] for n in nodes]
        hosts = [m.hostname for m in machines]

        # Three real agents, each on its own copy of the recorded sysfs tree.
        sys_roots = []
        for i in range(NODES - 1):
            sys_root = tmp_path / f"sys{i}"
            shutil.copytree(HOSTIO / "sys", sys_root)
            sys_roots.append(sys_root)
            agent = AgentProcess(
                server_url=url,
                node_token=machines[i].user_data["gpufleet_node_token"],
                state_dir=tmp_path / f"agent{i}",
                kernel_log=tmp_path / f"kmsg{i}",
                log_path=tmp_path / f"agent{i}.log",
                env={
                    "GPUFLEET_AGENT_HOSTNAME": hosts[i],
                    "GPUFLEET_AGENT_SIM_GPUS": "2",
                    "GPUFLEET_AGENT_METRICS_LISTEN": f"127.0.0.1:{agent_ports[i]}",
                    "GPUFLEET_AGENT_SYS_ROOT": str(sys_root),
                    "GPUFLEET_AGENT_PROC_ROOT": str(HOSTIO / "proc"),
                },
            )
            agent.kernel_log.write_text("")
            agent.start()
            agents.append(agent)
        h200_body[0] = h200_metrics(tmp_path / "h200", hostname=hosts[3], reasons=4.0)

        # Baselines the faults are measured against: an Xid 13 counter that exists before
        # its storm, the port's full rate, the H200 with its temperature series.
        for agent in agents:
            wait("the agent's /metrics", lambda a=agent: _serving(a))  # type: ignore[misc]
        with agents[1].kernel_log.open("a", encoding="utf-8") as log:
            log.write(f"[   10.000000] {XID_13.format(pid=100)}\n")
        agents[1].wait_caught_up()
        mine = "|".join([me_server, me_h200, *me_agents])
        prometheus.wait_for(f'count(up{{instance=~"{mine}"}} == 1) == 5', timeout_s=40)
        prometheus.wait_for(
            f'gpufleet_gpu_xid_errors_total{{xid="13",instance="{me_agents[1]}"}}', timeout_s=20
        )
        prometheus.wait_for(
            f'node_infiniband_rate_bytes_per_second{{port="1",instance="{me_agents[2]}"}}'
        )
        prometheus.wait_for(f'DCGM_FI_DEV_GPU_TEMP{{instance="{me_h200}"}}')
        reported = wait(
            "reports from the agents",
            lambda: all(
                api.get(f"/api/v1/nodes/{n['id']}").json().get("last_report_at") for n in nodes[:3]
            ),
        )
        assert reported

        # The faults that do not depend on each other, all at once.
        t_fault = time.time()
        # Faults in the database (PostgreSQL): another session holds one loop's lease
        # row locked (that loop's pass waits on it; the rest of the server runs), and
        # writes of another loop's lease fail as on a full disk.
        # The trigger first: CREATE TRIGGER waits for every writer of the table, and the
        # stalled loop's UPDATE would wait for the row lock below forever.
        with psycopg.connect(pg_url, autocommit=True, options=NO_HANG) as admin:
            admin.execute(DISK_FULL.format(loop=FAILING))
        stuck = psycopg.connect(pg_url, options=NO_HANG)
        stuck.execute("SELECT 1 FROM lease WHERE name = %s FOR UPDATE", (f"loop:{STALLED}",))
        with agents[0].kernel_log.open("a", encoding="utf-8") as log:
            log.write(f"[   20.000000] {XID_79}\n")
        with agents[1].kernel_log.open("a", encoding="utf-8") as log:
            for k in range(12):
                log.write(f"[   {21 + k:2d}.000000] {XID_13.format(pid=200 + k)}\n")
        set_port(sys_roots[0], state="1: DOWN", phys="2: Polling", rate="10 Gb/sec (4X SDR)")
        set_port(sys_roots[1], state="2: INIT", phys="5: LinkUp", rate="400 Gb/sec (4X NDR)")
        set_port(sys_roots[2], state="4: ACTIVE", phys="5: LinkUp", rate="200 Gb/sec (2X NDR)")
        h200_body[0] = h200_metrics(tmp_path / "h200", hostname=hosts[3], reasons=float(0x60))
        rebooted = api.post(
            f"/api/v1/nodes/{nodes[3]['id']}/actions",
            json={"action": "reboot", "reason": "alert test: never reports again"},
        )
        assert rebooted.status_code == 200, rebooted.text

        gpu = {"hostname": hosts[3], "gpu": "0", "instance": me_h200}
        alerts.wait("GpufleetGpuHwSlowdown", gpu, since=t_fault)
        alerts.wait("GpufleetGpuThermalSlowdown", gpu, since=t_fault)
        t_gone = time.time()
        h200_body[0] = h200_metrics(tmp_path / "h200", hostname=hosts[3], reasons=None)

        ib = {"device": "mlx5_0", "port": "1"}
        alerts.wait("GpufleetIbLinkDegraded", {**ib, "hostname": hosts[2]}, since=t_fault)
        t_stop = time.time()
        agents[2].stop()  # the host goes away: no reports, no scrapes

        alerts.wait(
            "GpufleetGpuFellOffTheBus", {"hostname": hosts[0], "signature": "xid-79"}, since=t_fault
        )
        alerts.wait(
            "GpufleetXidStorm", {"hostname": hosts[1], "gpu": "0", "xid": "13"}, since=t_fault
        )
        alerts.wait("GpufleetIbLinkDown", {**ib, "hostname": hosts[0]}, since=t_fault)
        alerts.wait("GpufleetIbPortNotActive", {**ib, "hostname": hosts[1]}, since=t_fault)
        alerts.wait("GpufleetGpuDisappeared", {"hostname": hosts[3], "gpu": "0"}, since=t_gone)
        where = {"project": PROJECT, "cluster": CLUSTER}
        alerts.wait("GpufleetRepairStuck", {**where, "action": "reboot"}, since=t_fault)

        # The Xid 79's repair waits for an admin; approving it would take a second node
        # of four out of service, which trips the breaker (default share 10%).
        proposed = wait(
            "the Xid 79 repair proposed",
            lambda: [
                r
                for r in api.get(f"/api/v1/repairs?node={nodes[0]['id']}").json()["items"]
                if r["status"] == "proposed"
            ],
        )[0]
        refused = api.post(f"/api/v1/repairs/{proposed['id']}/approve", json={"reason": "test"})
        assert refused.status_code == 409, refused.text
        alerts.wait(
            "GpufleetRepairAwaitingApproval",
            {**where, "status": "proposed", "action": proposed["action"]},
            since=t_fault,
        )
        alerts.wait("GpufleetRepairBreakerTripped", where, since=t_fault)
        alerts.wait(
            "GpufleetNodeNotReporting",
            {**where, "node": nodes[2]["name"], "hostname": hosts[2]},
            since=t_stop,
        )
        alerts.wait(
            "GpufleetAgentScrapeDown",
            {"instance": me_agents[2], "job": "gpufleet-agent"},
            since=t_stop,
        )

        alerts.wait("GpufleetLoopStalled", {"loop": STALLED}, since=t_fault)
        alerts.wait("GpufleetLoopFailing", {"loop": FAILING}, since=t_fault)
        stuck.rollback()
        stuck.close()
        stuck = None

        t_down = time.time()
        server.stop()
        alerts.wait("GpufleetServerDown", {"instance": me_server}, since=t_down)

        # Only where the faults were: not on the nodes and ports left healthy.
        for name, labels in (
            *(("GpufleetIbLinkDown", {**ib, "hostname": h}) for h in hosts[1:3]),
            *(("GpufleetIbPortNotActive", {**ib, "hostname": h}) for h in (hosts[0], hosts[2])),
            *(("GpufleetGpuFellOffTheBus", {"hostname": h}) for h in hosts[1:]),
            *(("GpufleetXidStorm", {"hostname": h}) for h in (hosts[0], hosts[2])),
            ("GpufleetGpuDisappeared", {"instance": me_agents[0]}),
        ):
            assert alerts.find(name, labels, since=t_fault) is None, (name, labels)

        # Every rule evaluated cleanly, and every alert fired.
        broken = [r for g in prometheus.rules() for r in g["rules"] if r["health"] != "ok"]
        assert not broken, broken
        assert alerts.shown == set(names), set(names) ^ alerts.shown
    finally:
        if stuck is not None:
            stuck.close()
        for agent in agents:
            agent.stop()
        server.stop()
        stack.close()
        prometheus.configure([])
        pg_template.release(database_url)


def _serving(agent: AgentProcess) -> bool:
    listen = agent.env["GPUFLEET_AGENT_METRICS_LISTEN"]
    try:
        return httpx.get(f"http://{listen}/metrics", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
