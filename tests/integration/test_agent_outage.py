"""Nothing lost, nothing twice: the real agent against a server that goes away, and back.

Real components only, on loopback: the ``gpufleet server`` process (sim provider, no
simulated agents), and the ``gpufleet agent`` process for its one node, following a
kernel-log file the test writes NVRM/SXid lines to.

1. Faults before the outage reach the server.
2. The server is SIGKILLed for ``OUTAGE_S`` seconds while the agent keeps finding new
   faults and repeats of open ones (it spools them); after the restart the agent replays
   and every finding is there exactly once, repeats folded into its count.
3. The agent is SIGKILLed (once right after it read a repeat it had not sent yet), lines
   are written while it is down, and it starts again: the new lines become findings, the
   old lines are not reported again, and the finding ``seq`` keeps growing.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gpufleet.agent.main import AGENT_VERSION
from gpufleet.agent.spool import read_records
from gpufleet.sim.world import SimWorld
from gpufleet.testing.processes import AgentProcess, ServerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.long]

OUTAGE_S = 30.0
GPUS = 8  # the agent's sim collector: GPU i at PCI 0000:{0x18 + 0x10 * i:02x}:00.0

# name → (signature, PCI address as the finding carries it, the kernel-log message).
FAULTS: dict[str, tuple[str, str, str]] = {
    "xid79": (
        "xid-79",
        "0000:18:00.0",
        "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    ),
    "xid48": (
        "xid-48",
        "0000:28:00.0",
        "NVRM: Xid (PCI:0000:28:00): 48, pid=1234, name=python, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    ),
    "xid94": (
        "xid-94",
        "0000:38:00.0",
        "NVRM: Xid (PCI:0000:38:00): 94, pid=2345, name=train, Contained: SM (0x1). "
        "RST: No, D-RST: No",
    ),
    "sxid": (
        "sxid-ltssm-fault-up",
        "0000:06:00.0",
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
    ),
    "xid13": (
        "xid-13",
        "0000:48:00.0",
        "NVRM: Xid (PCI:0000:48:00): 13, pid=3456, name=python, Graphics SM Warp Exception "
        "on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    ),
    "fallen": (
        "gpu-fallen-off-bus",
        "0000:88:00.0",
        "NVRM: GPU 0000:88:00.0: GPU has fallen off the bus.",
    ),
    "xid31": (
        "xid-31",
        "0000:58:00.0",
        "NVRM: Xid (PCI:0000:58:00): 31, pid=3456, name=python, Ch 00000008, intr 10000000. "
        "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12345000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    ),
    "xid119": (
        "xid-119",
        "0000:18:00.0",
        "NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=python, Timeout after 6s of waiting "
        "for RPC response from GPU0 GSP!",
    ),
    "xid74": (
        "xid-74",
        "0000:68:00.0",
        "NVRM: Xid (PCI:0000:68:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal "
        "error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    ),
    "xid63": (
        "xid-63",
        "0000:78:00.0",
        "NVRM: Xid (PCI:0000:78:00): 63, pid=1, name=python, Row Remapper: New row marked "
        "for remapping, reboot GPU to activate.",
    ),
    "xid92": (
        "xid-92",
        "0000:88:00.0",
        "NVRM: Xid (PCI:0000:88:00): 92, pid=1, name=python, High single-bit ECC error rate",
    ),
}

# What the server is fed while it is down: (seconds into the outage, faults written).
# Repeats of findings opened before the outage (xid79, xid48, xid94) must fold.
DURING_OUTAGE: list[tuple[float, list[str]]] = [
    (1.0, ["sxid", "xid79", "xid79"]),
    (OUTAGE_S / 3, ["xid13", "xid94", "fallen"]),
    (OUTAGE_S * 2 / 3, ["xid31", "xid119", "xid79", "xid48"]),
]

Key = tuple[str, str]  # (signature, PCI address): one open finding per fold key here
T = TypeVar("T")


def _key(name: str) -> Key:
    signature, pci, _ = FAULTS[name]
    return signature, pci


def _wait(predicate: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@dataclass
class KernelLog:
    """The file the agent follows, written the way the kernel's ring buffer reads."""

    path: Path
    uptime_s: float = 5000.0
    written: Counter[Key] = field(default_factory=Counter)
    first_batch: dict[Key, int] = field(default_factory=dict)
    last_batch: dict[Key, int] = field(default_factory=dict)
    batches: int = 0

    def write(self, *names: str) -> None:
        """One batch of lines, appended and flushed in one write."""
        lines = []
        for name in names:
            self.uptime_s += 0.25
            lines.append(f"[{self.uptime_s:12.6f}] {FAULTS[name][2]}\n")
            self.written[_key(name)] += 1
            self.first_batch.setdefault(_key(name), self.batches)
            self.last_batch[_key(name)] = self.batches
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(lines))
        self.batches += 1


@dataclass
class Stack:
    server: ServerProcess
    url: str
    api: httpx.Client
    data_dir: Path
    tmp: Path
    agent: AgentProcess | None = None


@pytest.fixture
def stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    port = free_port()
    data_dir = tmp_path / "data"
    token_file = tmp_path / "owner-token"
    env = {
        "GPUFLEET_DATA_DIR": str(data_dir),
        "GPUFLEET_DATABASE_URL": database_url,
        "GPUFLEET_PORT": str(port),
        "GPUFLEET_BOOTSTRAP_TOKEN_FILE": str(token_file),
        "GPUFLEET_ANNOUNCE_BOOTSTRAP_TOKEN": "false",
        "GPUFLEET_SIM_AGENTS": "false",  # the real agent below is the node's only agent
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[0.2, 0.5]",
        "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.2",
        # The restarted server takes its dead self's loop leases after 5 s, not 15.
        "GPUFLEET_LEASE_TTL_S": "5",
        "GPUFLEET_REPORT_INTERVAL_S": "1.0",
    }
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    api = httpx.Client(base_url=url, timeout=10)
    running = Stack(server=server, url=url, api=api, data_dir=data_dir, tmp=tmp_path)
    try:
        server.start()
        server.wait_ready(url)
        api.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        yield running
    finally:
        if running.agent is not None:
            running.agent.kill()
        server.kill()
        api.close()


def _findings(api: httpx.Client, node_id: str) -> list[dict[str, Any]]:
    got = api.get("/api/v1/findings", params={"node": node_id, "limit": 1000})
    got.raise_for_status()
    items: list[dict[str, Any]] = got.json()["items"]
    return items


def _server_findings(api: httpx.Client, node_id: str) -> dict[Key, list[dict[str, Any]]] | None:
    """Findings by fold key; None while the server cannot answer."""
    try:
        items = _findings(api, node_id)
    except httpx.HTTPError:
        return None
    by_key: dict[Key, list[dict[str, Any]]] = {}
    for f in items:
        by_key.setdefault((f["signature_id"], f["pci_bus_id"]), []).append(f)
    return by_key


def _counts(api: httpx.Client, node_id: str) -> dict[Key, list[int]] | None:
    by_key = _server_findings(api, node_id)
    if by_key is None:
        return None
    return {k: [f["count"] for f in fs] for k, fs in by_key.items()}


def _expect(log: KernelLog) -> dict[Key, list[int]]:
    """Exactly one finding per key written, counting every line written for it."""
    return {k: [n] for k, n in log.written.items()}


def _wait_counts(api: httpx.Client, node_id: str, log: KernelLog, *, timeout_s: float) -> None:
    """Until the server holds one finding per key with every line counted."""
    deadline = time.monotonic() + timeout_s
    while (got := _counts(api, node_id)) != _expect(log):
        if time.monotonic() > deadline:
            want = _expect(log)
            diff = {k: (got or {}).get(k, []) for k in set(want) | set(got or {})}
            diff = {k: v for k, v in diff.items() if v != want.get(k)}
            raise AssertionError(
                f"after {timeout_s} s the server has (key: counts) {diff}, "
                f"expected {[want.get(k) for k in diff]}"
            )
        time.sleep(0.1)


def _server_last_seq(url: str, node_token: str) -> int:
    """The highest finding seq the server holds for the node, from the protocol itself:
    a change numbered 1 is below it, so the server drops it and answers with its own."""
    now = dt.datetime.now(dt.UTC).isoformat()
    probe = {
        "seq": 1,
        "key": "probe@node",
        "signature_id": "xid-79",
        "state": "open",
        "severity": "fatal",
        "source": "kernel-log",
        "first_seen": now,
        "last_seen": now,
    }
    got = httpx.post(
        f"{url}/api/v1/agent/findings",
        json={"findings": [probe]},
        headers={"Authorization": f"Bearer {node_token}"},
        timeout=10,
    )
    got.raise_for_status()
    ack = got.json()
    assert ack["accepted"] == 0 and ack["duplicates"] == 1, ack
    last: int = ack["last_seq"]
    return last


@dataclass
class SpoolView:
    seqs: list[int]  # every finding change's seq, in the order the agent wrote them
    acked: int

    @property
    def pending(self) -> int:
        return sum(1 for s in self.seqs if s > self.acked)


def _spool(state_dir: Path) -> SpoolView:
    records, _ = read_records(state_dir / "spool" / "findings.log")
    seqs = [int(r["f"]["seq"]) for r in records if "f" in r]
    acked = max((int(r["ack"]) for r in records if "ack" in r), default=0)
    return SpoolView(seqs, acked)


def _check_findings(
    api: httpx.Client, node_id: str, log: KernelLog, *, ids: dict[Key, str] | None = None
) -> dict[Key, str]:
    """Every finding exactly once, with every repeat counted, times in order, each opened
    by one event. Returns finding ids by key (and checks earlier ones did not change)."""
    items = _findings(api, node_id)
    keys = Counter((f["signature_id"], f["pci_bus_id"]) for f in items)
    assert all(n == 1 for n in keys.values()), f"duplicated findings: {keys}"
    assert set(keys) == set(log.written), (sorted(keys), sorted(log.written))
    by_key = {(f["signature_id"], f["pci_bus_id"]): f for f in items}
    for key, f in by_key.items():
        assert f["count"] == log.written[key], (key, f["count"], log.written[key])
        assert f["cleared_at"] is None, f
        first, last = (
            dt.datetime.fromisoformat(f["first_seen"]),
            dt.datetime.fromisoformat(f["last_seen"]),
        )
        assert first <= last, f
        if log.last_batch[key] > log.first_batch[key]:
            assert first < last, f  # repeats came later and moved last_seen
        assert f["source"] == "kernel-log"
        index = (int(key[1].split(":")[1], 16) - 0x18) // 0x10
        if key[0].startswith(("xid-", "gpu-")) and 0 <= index < GPUS:
            assert f["gpu_index"] == index and f["gpu_uuid"], f
    # first_seen follows the order the lines were written in (lines written while the
    # agent was down are read together, so later batches may share a time, never precede).
    seen = {k: dt.datetime.fromisoformat(f["first_seen"]) for k, f in by_key.items()}
    for a in by_key:
        for b in by_key:
            if log.first_batch[a] < log.first_batch[b]:
                assert seen[a] <= seen[b], (a, seen[a], b, seen[b])
    if ids is not None:
        for key, finding_id in ids.items():
            assert by_key[key]["id"] == finding_id, f"{key} was replaced by a new finding"
    events = api.get(
        "/api/v1/events", params={"node": node_id, "kind": "finding.opened", "limit": 1000}
    ).json()["items"]
    opened = Counter(e["data"]["finding_id"] for e in events)
    assert opened == Counter(f["id"] for f in items), opened
    cleared = api.get(
        "/api/v1/events", params={"node": node_id, "kind": "finding.cleared", "limit": 1000}
    ).json()["items"]
    assert cleared == []
    return {k: f["id"] for k, f in by_key.items()}


def test_agent_findings_survive_server_and_agent_restarts(stack: Stack) -> None:
    api, tmp = stack.api, stack.tmp
    assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
    created = api.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "c1", "size": 1, "acceptance_tests": False},
    )
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]

    def the_node() -> dict[str, Any] | None:
        items = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
        return items[0] if items and items[0]["state"] == "in_service" else None

    node = _wait(the_node, timeout_s=30, what="the node in service")
    (instance,) = SimWorld(stack.data_dir / "sim-world.json").list_instances(cluster_id=cluster_id)
    node_token = instance.user_data["gpufleet_node_token"]

    log = KernelLog(tmp / "kern.log")
    log.path.touch()
    agent = stack.agent = AgentProcess(
        server_url=stack.url,
        node_token=node_token,
        state_dir=tmp / "agent-state",
        kernel_log=log.path,
        log_path=tmp / "agent.log",
        env={"GPUFLEET_AGENT_HOSTNAME": instance.hostname or node["name"]},
    )
    agent.start()

    def gpus_reported() -> bool:
        nodes = api.get("/api/v1/nodes", params={"cluster": cluster_id, "gpus": "true"}).json()
        return len(nodes["items"][0].get("gpus") or []) == GPUS

    _wait(gpus_reported, timeout_s=30, what="the agent's first report with its 8 GPUs")
    agent.wait_caught_up()  # following the log from its (empty) end

    # 1. Faults while the server is up.
    log.write("xid79", "xid48", "xid94")
    _wait_counts(api, node["id"], log, timeout_s=10)
    ids = _check_findings(api, node["id"], log)
    seq_before_outage = _server_last_seq(stack.url, node_token)

    # 2. The server is gone for OUTAGE_S; the agent keeps finding faults and spools them.
    stack.server.kill()
    outage_started = time.monotonic()
    for at_s, names in DURING_OUTAGE:
        time.sleep(max(0.0, outage_started + at_s - time.monotonic()))
        log.write(*names)
        agent.wait_caught_up()
    assert agent.running, agent.output()
    spooled = _spool(agent.state_dir)
    new_keys = len(set(log.written)) - 3
    assert spooled.pending >= new_keys, spooled  # at least one unsent change per new finding
    time.sleep(max(0.0, outage_started + OUTAGE_S - time.monotonic()))
    stack.server.start()
    stack.server.wait_ready(stack.url)
    restarted = time.monotonic()
    _wait_counts(api, node["id"], log, timeout_s=30)
    replay_s = time.monotonic() - restarted
    _wait(lambda: _spool(agent.state_dir).pending == 0, timeout_s=15, what="the spool drained")
    ids = _check_findings(api, node["id"], log, ids=ids)
    seq_after_outage = _server_last_seq(stack.url, node_token)
    assert seq_after_outage > seq_before_outage
    assert seq_after_outage == max(_spool(agent.state_dir).seqs)
    outage_findings, outage_lines = len(ids), sum(log.written.values())

    # 3. Agent restarts. First a repeat it sends, then one it has read (and checkpointed)
    # but, folding, not sent yet when it is SIGKILLed: it must not be lost.
    log.write("xid48")
    agent.wait_caught_up()
    _wait_counts(api, node["id"], log, timeout_s=15)
    log.write("xid48")
    agent.wait_caught_up()
    agent.kill()
    seqs_before = _spool(agent.state_dir).seqs
    seq_before_restart = _server_last_seq(stack.url, node_token)
    log.write("xid74", "xid63", "xid79")  # while the agent is down
    log.write("xid92")
    agent.start()
    agent_started = time.monotonic()
    _wait_counts(api, node["id"], log, timeout_s=30)
    rejoin_s = time.monotonic() - agent_started
    agent.wait_caught_up()
    _wait(lambda: _spool(agent.state_dir).pending == 0, timeout_s=15, what="the spool drained")
    ids = _check_findings(api, node["id"], log, ids=ids)
    spool_after = _spool(agent.state_dir)
    assert spool_after.seqs[: len(seqs_before)] == seqs_before  # the file only grew
    assert spool_after.seqs == sorted(set(spool_after.seqs))  # strictly increasing, no reuse
    assert len(spool_after.seqs) > len(seqs_before)
    seq_after_restart = _server_last_seq(stack.url, node_token)
    assert seq_before_outage < seq_after_outage <= seq_before_restart < seq_after_restart
    assert seq_after_restart == spool_after.seqs[-1]
    assert agent.output().count(f"gpufleet agent {AGENT_VERSION} for") == 2, agent.output()

    print(
        f"\noutage {OUTAGE_S:.0f} s: {outage_findings} findings from {outage_lines} lines "
        f"({outage_lines - outage_findings} folded repeats), all in the API {replay_s:.2f} s "
        f"after the server was ready again; agent restart: {len(ids)} findings from "
        f"{sum(log.written.values())} lines, in the API {rejoin_s:.2f} s after the agent "
        f"started; {len(spool_after.seqs)} finding changes, seq "
        f"{spool_after.seqs[0]}..{spool_after.seqs[-1]}"
    )
