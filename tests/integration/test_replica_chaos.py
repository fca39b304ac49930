"""Three server replicas on one PostgreSQL, one killed (SIGKILL) at random every few
seconds while real agents report: nothing lost, nothing twice (issue 19, item 3).

Real components only, on loopback: three ``gpufleet server`` processes on one fresh
PostgreSQL database, each with its own data dir (the embedded simulator's world lives in
memory and in a file of the data dir, so replicas cannot share one: replica 0 provisions
the three nodes, then every replica serves them from the store); three ``gpufleet agent``
processes given all three URLs, each following a kernel-log file the test appends Xid
lines to at known times. A chaos thread kills a random replica at random moments and
starts it again, for ``CHAOS_S``. Then every replica is up and, per node:

* exactly one finding per fault written (every repeat folded into its count), each
  opened by exactly one event: none lost, none duplicated;
* the agent's spools are empty and it dropped no report; the node's report sequence,
  as PostgreSQL saw each commit move it (a trigger this test adds), moved only forward,
  each commit starting where the last one ended (no report applied twice or out of
  order), and reached reports made after the chaos;
* exactly its GPUs in the store, once each (a report applied by two replicas at once
  would insert them twice).

And every loop's lease (``lease`` rows, sampled through the chaos by PostgreSQL's clock)
changed hands, and none stayed expired longer than its loop's interval plus a replica's
start (the time it may take until some replica is up to take it): a killed replica's
loops move to another one.

And the CLI, given four URLs of which the first is dead, lists the nodes.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.sim.world import SimWorld
from gpufleet.testing.databases import PostgresTemplate
from gpufleet.testing.processes import AgentProcess, free_port, run_cli
from gpufleet.testing.replicas import (
    KILL_EVERY_S,
    Chaos,
    LeaseWatch,
    Replica,
    chaos_seed,
    loop_intervals,
    make_replicas,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.long]

SEED = chaos_seed(20261204)
CHAOS_S = 24.0
WRITE_EVERY_S = 1.0  # a kernel-log line to one agent's log
REPLICAS, NODES, GPUS = 3, 3, 8
LEASE_TTL_S = 5.0
# How long a lease may stay expired past its loop's interval: until some replica serves
# (all but the one killed may be starting again: a start takes seconds on 2 shared cores).
START_ALLOWANCE_S = 15.0

# name → (signature, PCI address as the finding carries it, the kernel-log message).
FAULTS: dict[str, tuple[str, str, str]] = {
    "xid79": ("xid-79", "0000:18:00.0",
              "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
    "xid48": ("xid-48", "0000:28:00.0",
              "NVRM: Xid (PCI:0000:28:00): 48, pid=1234, name=python, An uncorrectable double "
              "bit error (DBE) has been detected on GPU in the framebuffer at partition 6."),
    "xid94": ("xid-94", "0000:38:00.0",
              "NVRM: Xid (PCI:0000:38:00): 94, pid=2345, name=train, Contained: SM (0x1). "
              "RST: No, D-RST: No"),
    "xid13": ("xid-13", "0000:48:00.0",
              "NVRM: Xid (PCI:0000:48:00): 13, pid=3456, name=python, Graphics SM Warp "
              "Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
    "xid31": ("xid-31", "0000:58:00.0",
              "NVRM: Xid (PCI:0000:58:00): 31, pid=3456, name=python, Ch 00000008, intr "
              "10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12345000. "
              "Fault is of type FAULT_PDE ACCESS_TYPE_READ"),
    "xid74": ("xid-74", "0000:68:00.0",
              "NVRM: Xid (PCI:0000:68:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal "
              "error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    "xid63": ("xid-63", "0000:78:00.0",
              "NVRM: Xid (PCI:0000:78:00): 63, pid=1, name=python, Row Remapper: New row "
              "marked for remapping, reboot GPU to activate."),
    "xid92": ("xid-92", "0000:88:00.0",
              "NVRM: Xid (PCI:0000:88:00): 92, pid=1, name=python, High single-bit ECC error "
              "rate"),
}  # fmt: skip

Key = tuple[str, str]  # (signature, PCI address): one open finding per fold key

# Every commit that moves a node's report sequence, as PostgreSQL applied it.
REPORT_LOG_SQL = """
CREATE TABLE chaos_report_log (
    id bigserial PRIMARY KEY, node_id text NOT NULL, old_seq bigint NOT NULL,
    new_seq bigint NOT NULL);
CREATE FUNCTION chaos_report_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_report_log (node_id, old_seq, new_seq)
        VALUES (NEW.id, OLD.last_report_seq, NEW.last_report_seq);
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_report_log AFTER UPDATE OF last_report_seq ON node FOR EACH ROW
    WHEN (OLD.last_report_seq IS DISTINCT FROM NEW.last_report_seq)
    EXECUTE FUNCTION chaos_report_logged();
"""


@dataclass
class KernelLog:
    """One node's followed log, written the way the kernel's ring buffer reads."""

    path: Path
    uptime_s: float = 5000.0
    written: Counter[Key] = field(default_factory=Counter)

    def write(self, name: str) -> None:
        signature, pci, message = FAULTS[name]
        self.uptime_s += 0.25
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(f"[{self.uptime_s:12.6f}] {message}\n")
        self.written[(signature, pci)] += 1


@dataclass
class Stack:
    replicas: list[Replica]
    owner: str
    pg_dsn: str
    tmp: Path
    agents: list[AgentProcess] = field(default_factory=list)

    @property
    def urls(self) -> str:
        return ",".join(r.url for r in self.replicas)


@pytest.fixture
def stack(tmp_path: Path, pg_template: PostgresTemplate) -> Iterator[Stack]:
    database_url = pg_template.clone()
    env = {
        "GPUFLEET_SIM_AGENTS": "false",  # the real agents below are the nodes' agents
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[0.2, 0.5]",
        "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
        "GPUFLEET_SIM_BUSY_SHARE": "[0.0, 0.0]",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
        "GPUFLEET_REPORT_INTERVAL_S": "1.0",
        "GPUFLEET_LEASE_TTL_S": str(LEASE_TTL_S),
    }
    replicas, token_file = make_replicas(REPLICAS, database_url=database_url, tmp=tmp_path, env=env)
    running = Stack(
        replicas=replicas,
        owner="",
        pg_dsn="postgresql://" + database_url.split("://", 1)[1],
        tmp=tmp_path,
    )
    try:
        # The first start creates the owner; the others find it (started together, two
        # could each try: tests/server covers bootstrap, this test covers ingestion).
        replicas[0].proc.start()
        replicas[0].proc.wait_ready(replicas[0].url)
        running.owner = token_file.read_text().strip()
        yield running
    finally:
        for agent in running.agents:
            agent.kill()
        for replica in replicas:
            replica.proc.kill()
        pg_template.release(database_url)


def _agent_metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r"^(gpufleet_agent_spool_\w+)(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE
        )
    }


def test_replicas_killed_at_random_lose_and_duplicate_nothing(stack: Stack) -> None:
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started - sum(phases.values()), 1)

    rng = random.Random(SEED)
    print(f"\nchaos seed {SEED}")
    first = stack.replicas[0]
    api = httpx.Client(
        base_url=first.url, headers={"Authorization": f"Bearer {stack.owner}"}, timeout=10
    )
    assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
    created = api.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "c1", "size": NODES, "acceptance_tests": False},
    )
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]

    def in_service() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = api.get(
            "/api/v1/nodes", params={"cluster": cluster_id}
        ).json()["items"]
        return items if sum(n["state"] == "in_service" for n in items) == NODES else None

    nodes = sorted(
        wait_for(in_service, timeout_s=30, what="the nodes in service"), key=lambda n: n["name"]
    )
    world = SimWorld(stack.tmp / "data0" / "sim-world.json")
    instances = {i.instance_id: i for i in world.list_instances(cluster_id=cluster_id)}
    with psycopg.connect(stack.pg_dsn, autocommit=True) as conn:
        conn.execute(REPORT_LOG_SQL)
    phase("nodes")
    # The other replicas start now the nodes exist (their sim worlds are empty: they must
    # not provision), the agents with them: until they serve, the agents fail over to 0.
    for replica in stack.replicas[1:]:
        replica.proc.start()

    logs: list[KernelLog] = []
    metrics_ports: list[int] = []
    for i, node in enumerate(nodes):
        instance = instances[node["provider_instance_id"]]
        log = KernelLog(stack.tmp / f"kern{i}.log")
        log.path.touch()
        metrics_ports.append(free_port())
        agent = AgentProcess(
            server_url=stack.urls,
            node_token=instance.user_data["gpufleet_node_token"],
            state_dir=stack.tmp / f"agent{i}",
            kernel_log=log.path,
            log_path=stack.tmp / f"agent{i}.log",
            env={
                "GPUFLEET_AGENT_HOSTNAME": instance.hostname or node["name"],
                "GPUFLEET_AGENT_SIM_GPUS": str(GPUS),
                "GPUFLEET_AGENT_METRICS_LISTEN": f"127.0.0.1:{metrics_ports[-1]}",
            },
        )
        agent.start()
        stack.agents.append(agent)
        logs.append(log)

    def gpus_reported() -> bool:
        listed = api.get("/api/v1/nodes", params={"cluster": cluster_id, "gpus": "true"})
        return all(len(n.get("gpus") or []) == GPUS for n in listed.json()["items"])

    wait_for(gpus_reported, timeout_s=40, what="every agent's first report")
    for replica in stack.replicas[1:]:
        replica.proc.wait_ready(replica.url)
    for agent in stack.agents:
        agent.wait_caught_up(timeout_s=20)  # following its (empty) log from the end
    phase("replicas and agents")

    # Chaos: kills in a thread; kernel-log lines from here at a steady pace.
    chaos = Chaos(stack.replicas, random.Random(rng.random()), KILL_EVERY_S)
    killer = threading.Thread(target=chaos.run, name="chaos", daemon=True)
    leases = LeaseWatch(stack.pg_dsn)
    watcher = threading.Thread(target=leases.run, name="leases", daemon=True)
    chaos_started = time.monotonic()
    killer.start()
    watcher.start()
    lines = 0
    try:
        while time.monotonic() - chaos_started < CHAOS_S:
            i = rng.randrange(NODES)
            logs[i].write(rng.choice(list(FAULTS)))
            lines += 1
            time.sleep(WRITE_EVERY_S)  # real sleep: faults arrive over real time
    finally:
        chaos.stop.set()
        killer.join(timeout=30)
    chaos_ended_us = time.time_ns() // 1000  # report seqs are the agent's wall clock in µs
    phase("chaos")
    for replica in stack.replicas:
        if not replica.proc.running:
            replica.proc.start()
    for replica in stack.replicas:
        replica.proc.wait_ready(replica.url, timeout_s=60)
    assert all(r.ready() for r in stack.replicas)
    # Every lease renewed or taken over since (one interval of each loop, at most a few s).
    time.sleep(LEASE_TTL_S)  # real sleep: past the expiry of a lease held at the last kill
    leases.stop.set()
    watcher.join(timeout=10)
    intervals = loop_intervals(stack.replicas[0].url, stack.owner)
    phase("replicas back")

    # Everything delivered: the agents' spools empty, nothing dropped.
    for agent in stack.agents:
        agent.wait_caught_up(timeout_s=20)
        assert agent.running, agent.output()[-3000:]

    def spools_empty() -> bool:
        for port in metrics_ports:
            m = _agent_metrics(port)
            if m["gpufleet_agent_spool_findings"] or m["gpufleet_agent_spool_reports"]:
                return False
        return True

    wait_for(spools_empty, timeout_s=30, what="the agents' spools drained")
    dropped = sum(
        _agent_metrics(p)["gpufleet_agent_spool_reports_dropped_total"] for p in metrics_ports
    )
    assert dropped == 0

    def reported_after_chaos() -> bool:
        listed = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        return all(n["last_report_seq"] > chaos_ended_us for n in listed)

    wait_for(reported_after_chaos, timeout_s=20, what="a report made after the chaos, per node")
    phase("spools drained")

    # Findings: exactly one per key written, every line counted, one opening event each.
    lost: list[str] = []
    duplicated: list[str] = []
    miscounted: list[str] = []

    def findings_of(node_id: str) -> list[dict[str, Any]]:
        got = api.get("/api/v1/findings", params={"node": node_id, "limit": 1000})
        got.raise_for_status()
        items: list[dict[str, Any]] = got.json()["items"]
        return items

    def counts_match() -> bool:
        for node, log in zip(nodes, logs, strict=True):
            got = Counter[Key]()
            for f in findings_of(node["id"]):
                got[(f["signature_id"], f["pci_bus_id"])] += f["count"]
            if got != log.written:
                return False
        return True

    with contextlib.suppress(AssertionError):  # the checks below say what differs
        wait_for(counts_match, timeout_s=20, what="every line counted in a finding")
    phase("findings counted")
    findings_total = 0
    for node, log in zip(nodes, logs, strict=True):
        items = findings_of(node["id"])
        findings_total += len(items)
        by_key: dict[Key, list[dict[str, Any]]] = {}
        for f in items:
            by_key.setdefault((f["signature_id"], f["pci_bus_id"]), []).append(f)
        for key, n in log.written.items():
            got = by_key.get(key, [])
            if not got:
                lost.append(f"{node['name']} {key}")
            elif len(got) > 1:
                duplicated.append(f"{node['name']} {key} x{len(got)}")
            elif got[0]["count"] != n:
                miscounted.append(f"{node['name']} {key}: count {got[0]['count']}, lines {n}")
        extra = set(by_key) - set(log.written)
        duplicated.extend(f"{node['name']} {key} (never written)" for key in extra)
        events = api.get(
            "/api/v1/events",
            params={"node": node["id"], "kind": "finding.opened", "limit": 1000},
        ).json()["items"]
        opened = Counter(e["data"]["finding_id"] for e in events)
        if opened != Counter(f["id"] for f in items):
            duplicated.append(f"{node['name']} finding.opened events {dict(opened)}")

    # Reports: each commit moved the sequence forward from where the last one ended.
    with psycopg.connect(stack.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT node_id, old_seq, new_seq FROM chaos_report_log ORDER BY id"
        ).fetchall()
        gpu_rows = conn.execute(
            "SELECT node_id, count(*), count(DISTINCT uuid) FROM gpu "
            "WHERE removed_at IS NULL GROUP BY node_id"
        ).fetchall()
    chains: dict[str, list[tuple[int, int]]] = {}
    for node_id, old, new in rows:
        chains.setdefault(node_id, []).append((old, new))
    backwards, broken = 0, 0
    for chain in chains.values():
        backwards += sum(new <= old for old, new in chain)
        broken += sum(a[1] != b[0] for a, b in itertools.pairwise(chain))
    gpus = {node_id: (n, distinct) for node_id, n, distinct in gpu_rows}

    # The CLI with four URLs, the first one dead, lists the nodes.
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    phase("checks")
    listed = run_cli(
        "nodes", "list", "--cluster", cluster_id, url=f"{dead},{stack.urls}", token=stack.owner
    )
    phase("cli")

    print(
        f"seed {SEED}: {sum(chaos.kills.values())} kills in {CHAOS_S:.0f} s "
        f"(by replica {dict(sorted(chaos.kills.items()))}, "
        f"{chaos.left_none_serving} leaving none serving); "
        f"{lines} kernel-log lines → {findings_total} findings; "
        f"{len(rows)} report commits ({broken} not starting where the last ended, "
        f"{backwards} backwards); lost {lost}, duplicated {duplicated}, "
        f"miscounted {miscounted}; wall {time.monotonic() - started:.1f} s "
        f"(after the first replica was up; s by phase: {phases})"
    )
    late = leases.late(intervals, allowance_s=START_ALLOWANCE_S)
    print(
        f"leases: {sum(leases.handovers.values())} handovers "
        f"({dict(sorted(leases.handovers.items()))}); longest past expiry, s: "
        f"{ {n: round(v, 1) for n, v in sorted(leases.overdue_s.items())} }"
    )
    assert sum(chaos.kills.values()) >= CHAOS_S / KILL_EVERY_S[1] / 2  # "many", on a slow day
    assert set(leases.overdue_s) == set(intervals), (set(leases.overdue_s), set(intervals))
    assert sum(leases.handovers.values()) > 0 and not late, (leases.handovers, late)
    assert not lost and not duplicated and not miscounted
    assert len(chains) == NODES and backwards == 0 and broken == 0, chains
    assert all(gpus.get(n["id"]) == (GPUS, GPUS) for n in nodes), gpus
    assert listed.returncode == 0, listed.stderr
    assert all(n["name"] in listed.stdout for n in nodes), listed.stdout
