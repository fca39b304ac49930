"""Three server replicas on one PostgreSQL accept a bare-metal cluster scheduled by the
real Slurm lab and run repairs on it, while one replica at a time is killed (SIGKILL) at
random moments: the acceptance and every repair carried out exactly once, no finding
lost or counted twice (issue 19, item 3).

Real components, on loopback: three ``gpufleet server`` processes on one fresh
PostgreSQL database; the Slurm lab's slurmctld (drains and resumes); sushy-tools' Redfish
emulator as the BMC of the three hosts (``lab-001``...), every reset it is asked for
journaled; three real ``gpufleet agent`` processes given all three URLs, enrolled with
the cluster's enroll token, each following a kernel-log file and running the commands
of checks. The cluster's nodes are the lab's Slurm nodes.

Stand-ins, named as such: ``Room`` plays the machines behind the BMC. When the emulator
journals a reset of a host's system, the machine reboots: its agent is killed, the
machine gets a new kernel boot id (the agent's ``boot_id_file``) and its agent starts
again (its kernel log, a syslog file, persists across the boot). The lab has no GPU:
DCGM's place is taken by a stand-in printing a recorded real ``dcgmi diag`` output.

The chaos starts before the machines boot, so their agents enroll (an answer lost with
a killed replica is asked again) and the cluster's acceptance runs (DCGM on each node,
through its agent: acceptance holds the nodes drained in Slurm) under it.
Once the nodes are in service the test writes an Xid 79 (fatal: reboot) into each
node's kernel log and approves each reboot recommended, through whichever replica
answers; a steady stream of Xid 43 lines (informational: no repair) goes to random
nodes. The chaos lasts until every repair ended and ``MIN_KILLS`` replicas were killed;
a kill takes a serving replica, and only while another one serves. Then:

* per node, exactly one repair ran, and it succeeded, through each step once (one
  event each: approved, cordoning, draining, acting, verifying, succeeded); the BMC was
  asked to reset the host exactly once; the node booted again (a new boot id) and is in
  service, and Slurm has it back (no drain left);
* the cluster is ready; its acceptance and each repair's re-acceptance passed, and DCGM
  ran exactly once per node in each;
* every Xid 43 line counted once: the counts of an address's findings add up to the
  lines written (a repair closes the node's findings when it acts: the next line opens
  a new one), never two open at once, each opened by one event;
* the repair executor's lease changed hands, and no loop's lease stayed expired longer
  than its interval plus ``START_ALLOWANCE_S``.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.databases import PostgresTemplate
from gpufleet.testing.processes import AgentProcess
from gpufleet.testing.replicas import (
    Chaos,
    FailoverApi,
    LeaseWatch,
    Replica,
    chaos_seed,
    loop_intervals,
    make_replicas,
    wait_for,
)
from gpufleet.testing.slurm_lab import SlurmLab
from providers.redfish.redfish_fakes import PASSWORD, USER, Emulator, start_emulator, stop_emulator

pytestmark = [pytest.mark.slow, pytest.mark.long]

SEED = chaos_seed(20261205)
MIN_KILLS = 10  # the chaos stops when every repair ended and this many kills were made,
CHAOS_MAX_S = 180.0  # or after this
REPLICAS = 3
LEASE_TTL_S = 5.0
START_ALLOWANCE_S = 10.0  # a kill comes only while another replica serves: it takes over
NOT_RUN = ("superseded", "rejected", "resolved")  # a recommendation ended unrun
STEPS = ["approved", "cordoning", "draining", "acting", "verifying", "succeeded"]
POLICY = {"verify_settle_s": 1.0, "verify_timeout_s": 120.0, "breaker_max_share": 1.0}

DCGM = Path(__file__).parents[2] / "fixtures" / "checks" / "dcgm3-r1-8gpu-from-dcgm-test.txt"
SUITE = {"checks": [{"kind": "dcgm-diag", "params": {"level": 1}}]}
XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_43 = "NVRM: Xid (PCI:{pci}): 43, pid=2345, name=train, Ch 00000010"
XID_43_PCI = ("0000:28:00", "0000:38:00", "0000:48:00", "0000:58:00")


@dataclass
class Machine:
    """One host behind the BMC: its agent, its boot id and its kernel log."""

    hostname: str
    system: str  # its Redfish system's uuid
    agent: AgentProcess
    boot_id_file: Path
    kernel_log: Path
    uptime_s: float = 5000.0
    boots: int = 0
    powered: bool = False
    xid43: Counter[str] = field(default_factory=Counter)  # lines written, by PCI address
    lock: threading.Lock = field(default_factory=threading.Lock)

    def boot(self) -> None:
        with self.lock:
            self.agent.kill()
            self.boot_id_file.write_text(f"{uuid.uuid4()}\n")
            self.boots += 1
            self.uptime_s = 5.0
            self.powered = True
            self.agent.start()

    def power_off(self) -> None:
        with self.lock:
            self.agent.kill()
            self.powered = False

    def write(self, line: str) -> None:
        with self.lock:
            self.uptime_s += 0.25
            with self.kernel_log.open("a", encoding="utf-8") as fh:
                fh.write(f"[{self.uptime_s:12.6f}] {line}\n")


@dataclass
class Room:
    """The stand-in for the machines behind the BMC (module doc): follows the emulator's
    journal ("<uuid> reset <ResetType>") and reboots the machine of each reset."""

    journal: Path
    machines: dict[str, Machine]  # by system uuid
    resets: list[tuple[float, str, str]] = field(default_factory=list)  # (when, host, type)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        done = 0
        while not self.stop.wait(0.1):
            lines = self.journal.read_text().splitlines() if self.journal.exists() else []
            for line in lines[done:]:
                system, word, value = line.split(" ", 2)
                machine = self.machines.get(system)
                if machine is None or word != "reset":
                    continue
                self.resets.append((time.monotonic(), machine.hostname, value))
                if value in ("GracefulRestart", "ForceRestart", "PowerCycle") or (
                    value in ("On", "ForceOn") and not machine.powered
                ):
                    machine.boot()
                elif value in ("ForceOff", "GracefulShutdown"):
                    machine.power_off()
            done = len(lines)

    def resets_since(self, since: float) -> Counter[str]:
        """Resets asked of each host's BMC since ``since`` (monotonic), by hostname."""
        return Counter(host for when, host, _ in self.resets if when >= since)


@pytest.fixture
def emulator(tmp_path: Path, slurm_lab: SlurmLab) -> Iterator[tuple[Emulator, dict[str, str]]]:
    """sushy-tools' emulator with one system per lab node, all on."""
    systems = {name: str(uuid.uuid4()) for name in slurm_lab.node_names}
    started = start_emulator(
        tmp_path / "redfish",
        systems=[
            {"uuid": system, "name": name, "power_state": "On", "nics": []}
            for name, system in systems.items()
        ],
        users={USER: PASSWORD},
    )
    try:
        yield started, systems
    finally:
        stop_emulator(started)


@dataclass
class Stack:
    replicas: list[Replica]
    owner: str
    machines: list[Machine] = field(default_factory=list)

    @property
    def urls(self) -> str:
        return ",".join(r.url for r in self.replicas)


@pytest.fixture
def stack(tmp_path: Path, pg_template: PostgresTemplate, slurm_lab: SlurmLab) -> Iterator[Stack]:
    database_url = pg_template.clone()
    # The lab has no GPU: DCGM's stand-in prints a recorded real `dcgmi diag -j` (8 GPUs,
    # level 1) and writes a line per invocation (run by the node's agent: acceptance
    # holds the nodes drained in Slurm), so the test counts them.
    calls = tmp_path / "dcgmi-calls"
    stand_in = f'echo "$CHAOS_MACHINE $GPUFLEET_COMMAND_ID" >> {calls}; cat {DCGM}'
    env = {
        "GPUFLEET_SLURM_CONF": str(slurm_lab.slurm_conf),
        "GPUFLEET_CHECKS_STAND_IN": json.dumps({"dcgm-diag": ["sh", "-c", stand_in]}),
        "GPUFLEET_CHECK_INTERVAL_S": "0.5",
        "GPUFLEET_SIM_AGENTS": "false",
        "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
        "GPUFLEET_REPAIR_INTERVAL_S": "0.3",
        "GPUFLEET_REPORT_INTERVAL_S": "1.0",
        "GPUFLEET_LEASE_TTL_S": str(LEASE_TTL_S),
    }
    replicas, token_file = make_replicas(REPLICAS, database_url=database_url, tmp=tmp_path, env=env)
    running = Stack(replicas=replicas, owner="")
    try:
        replicas[0].proc.start()  # the first start creates the owner; the others find it
        replicas[0].proc.wait_ready(replicas[0].url)
        running.owner = token_file.read_text().strip()
        for replica in replicas[1:]:
            replica.proc.start()
        for replica in replicas[1:]:
            replica.proc.wait_ready(replica.url)
        yield running
    finally:
        for machine in running.machines:
            machine.agent.kill()
        for replica in replicas:
            replica.proc.kill()
        pg_template.release(database_url)
        slurm_lab.reset()  # the next test on this lab finds every node idle


def _created(response: httpx.Response | None, *, codes: tuple[int, ...] = (200, 201)) -> Any:
    assert response is not None and response.status_code in codes, (
        response.text if response is not None else "no answer"
    )
    return response.json()


def test_repairs_run_exactly_once_while_replicas_are_killed_at_random(
    stack: Stack,
    emulator: tuple[Emulator, dict[str, str]],
    slurm_lab: SlurmLab,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    print(f"\nchaos seed {SEED}")
    bmc, systems = emulator
    api = FailoverApi(stack.replicas, stack.owner)
    _created(api.post("/api/v1/projects", {"name": "ml"}))
    _created(api.put("/api/v1/projects/ml/repair-policy", POLICY))
    bmc_login = {"kind": "bmc_password", "username": USER, "secret": PASSWORD}
    _created(api.put("/api/v1/projects/ml/credentials/bmc", bmc_login))
    cluster = _created(
        api.post(
            "/api/v1/clusters",
            {
                "project": "ml",
                "name": "metal",
                "scheduler": "slurm",
                "provider": "redfish",
                "size": len(systems),
                "gpus_per_node": slurm_lab.gpus,
                "acceptance_tests": True,
                "acceptance_suite": SUITE,
            },
        )
    )
    cluster_id = cluster["id"]
    rows = [
        {
            "hostname": name,
            "bmc_type": "redfish",
            "bmc_address": f"http://{bmc.address}",
            "credential": "bmc",
            "cluster": "metal",
            "system_id": system,
            "role": "member",
        }
        for name, system in systems.items()
    ]
    _created(api.post("/api/v1/projects/ml/hosts/import", {"hosts": rows}))
    enroll = _created(api.post(f"/api/v1/clusters/{cluster_id}/enroll-token", {"ttl_s": 3600}))
    enroll_file = tmp_path / "enroll-token"
    enroll_file.write_text(enroll["token"] + "\n")
    enroll_file.chmod(0o600)

    machines: dict[str, Machine] = {}
    for name, system in systems.items():
        boot_id_file = tmp_path / f"{name}.boot_id"
        kernel_log = tmp_path / f"{name}.kern.log"
        kernel_log.touch()
        agent = AgentProcess(
            server_url=stack.urls,
            node_token="",  # none yet: it enrolls, and keeps the one it gets
            state_dir=tmp_path / f"agent-{name}",
            kernel_log=kernel_log,
            log_path=tmp_path / f"agent-{name}.log",
            env={
                "GPUFLEET_AGENT_ENROLL_TOKEN_FILE": str(enroll_file),
                "GPUFLEET_AGENT_BOOT_ID_FILE": str(boot_id_file),
                "GPUFLEET_AGENT_HOSTNAME": name,
                "GPUFLEET_AGENT_SIM_GPUS": str(slurm_lab.gpus),
                "CHAOS_MACHINE": name,  # what its commands see of the machine they run on
            },
        )
        machines[system] = Machine(name, system, agent, boot_id_file, kernel_log)
        stack.machines.append(machines[system])
    by_host = {m.hostname: m for m in machines.values()}
    setup_s = time.monotonic() - started

    # Chaos from here, while the hosts are claimed, their agents enroll and the cluster
    # is accepted: kills in a thread; here, Xid 43 lines, then (once in service) an Xid
    # 79 per node, and approvals.
    chaos = Chaos(stack.replicas, random.Random(rng.random()), spare_one=True)
    killer = threading.Thread(target=chaos.run, name="chaos", daemon=True)
    leases = LeaseWatch("postgresql://" + pg_dsn_of(stack))
    watcher = threading.Thread(target=leases.run, name="leases", daemon=True)
    chaos_started = time.monotonic()
    killer.start()
    watcher.start()
    for machine in machines.values():
        machine.boot()  # the install is done: the machine boots and its agent enrolls
    room = Room(bmc.journal, machines)
    room_thread = threading.Thread(target=room.run, name="room", daemon=True)
    room_thread.start()
    nodes: dict[str, dict[str, Any]] = {}
    boot_ids: dict[str, str] = {}
    in_service_s = 0.0
    pending = sorted(by_host)  # hosts whose Xid 79 is not written yet
    approved: dict[str, str] = {}  # hostname -> repair id
    ended: dict[str, dict[str, Any]] = {}
    lost_answers = 0
    try:
        while time.monotonic() - chaos_started < CHAOS_MAX_S:
            host, pci = rng.choice(sorted(by_host)), rng.choice(XID_43_PCI)
            if by_host[host].agent.log_offset() is not None:  # its agent follows the log
                by_host[host].write(XID_43.format(pci=pci))  # (a first start begins at
                by_host[host].xid43[pci] += 1  # the end: older lines are history)
            if not nodes:
                with contextlib.suppress(AssertionError):
                    items = api.get("/api/v1/nodes", cluster=cluster_id)["items"]
                    if sum(n["state"] == "in_service" for n in items) == len(by_host):
                        nodes = {n["hostname"]: n for n in items}
                        boot_ids = {name: n["boot_id"] for name, n in nodes.items()}
                        in_service_s = time.monotonic() - chaos_started
            elif pending:
                elapsed = time.monotonic() - chaos_started - in_service_s
                if elapsed > 2.0 + 6.0 * (len(by_host) - len(pending)):
                    by_host[pending.pop(0)].write(XID_79)
            for name, node in nodes.items():
                if name in approved:
                    continue
                with contextlib.suppress(AssertionError):
                    # The reboot approved (an approval whose answer was lost shows here
                    # on the next round), or else the one proposed, to approve now.
                    reboots = [
                        r
                        for r in api.get("/api/v1/repairs", node=node["id"])["items"]
                        if r["action"] == "reboot" and r["status"] not in NOT_RUN
                    ]
                    taken = [r for r in reboots if r["status"] != "proposed"]
                    if taken:
                        approved[name] = taken[0]["id"]
                    elif reboots:
                        answer = api.post(f"/api/v1/repairs/{reboots[0]['id']}/approve", {})
                        lost_answers += answer is None
            for name, approved_id in approved.items():
                if name not in ended:
                    with contextlib.suppress(AssertionError):
                        repair = api.get(f"/api/v1/repairs/{approved_id}")
                        if repair["status"] in ("succeeded", "failed"):
                            ended[name] = repair
            if nodes and len(ended) == len(nodes) and chaos.total() >= MIN_KILLS:
                break
            time.sleep(1.0)  # real sleep: lines and kills arrive over real time
    finally:
        chaos.stop.set()
        killer.join(timeout=30)
    chaos_s = time.monotonic() - chaos_started
    if not nodes:
        states = [
            (n["name"], n["state"], n["state_detail"])
            for n in api.get("/api/v1/nodes", cluster=cluster_id)["items"]
        ]
        runs = api.get(f"/api/v1/clusters/{cluster_id}/acceptance")["items"]
        raise AssertionError(
            f"the nodes never were all in service: {states}; acceptance "
            f"{[(r['status'], r['stage'], r['detail']) for r in runs]}; Slurm: "
            + slurm_lab.run("sinfo", "-N", "-o", "%N %T %E").stdout
        )
    for replica in stack.replicas:
        if not replica.proc.running:
            replica.proc.start()
    for replica in stack.replicas:
        replica.proc.wait_ready(replica.url, timeout_s=60)
    time.sleep(LEASE_TTL_S)  # real sleep: past the expiry of a lease held at the last kill
    leases.stop.set()
    watcher.join(timeout=10)
    room.stop.set()
    room_thread.join(timeout=10)
    intervals = loop_intervals(stack.replicas[0].url, stack.owner)
    for machine in machines.values():
        machine.agent.wait_caught_up(timeout_s=30)

    # Findings of the Xid 43 lines: one per PCI address written, every line counted.
    def xid43_counts() -> dict[str, Counter[str]]:
        got: dict[str, Counter[str]] = {}
        for name, node in nodes.items():
            items = api.get("/api/v1/findings", node=node["id"], limit=1000)["items"]
            got[name] = Counter()
            for f in items:
                if f["signature_id"] == "xid-43":
                    got[name][f["pci_bus_id"].removesuffix(".0")] += f["count"]
        return got

    with contextlib.suppress(AssertionError):  # the checks below say what differs
        wait_for(
            lambda: xid43_counts() == {m.hostname: m.xid43 for m in machines.values()},
            timeout_s=30,
            what="every Xid 43 line counted",
        )
    findings_wrong: list[str] = []
    for name, node in nodes.items():
        items = [
            f
            for f in api.get("/api/v1/findings", node=node["id"], limit=1000)["items"]
            if f["signature_id"] == "xid-43"
        ]
        open_per_pci = Counter(
            f["pci_bus_id"].removesuffix(".0") for f in items if f["cleared_at"] is None
        )
        counts = Counter[str]()
        for f in items:
            counts[f["pci_bus_id"].removesuffix(".0")] += f["count"]
        if any(n > 1 for n in open_per_pci.values()):
            findings_wrong.append(f"{name}: open twice {dict(open_per_pci)}")
        if counts != by_host[name].xid43:
            written = dict(by_host[name].xid43)
            findings_wrong.append(f"{name}: counted {dict(counts)}, written {written}")
        opened = api.get("/api/v1/events", node=node["id"], kind="finding.opened", limit=1000)
        ids = Counter(e["data"]["finding_id"] for e in opened["items"])
        if any(ids[f["id"]] != 1 for f in items):
            findings_wrong.append(f"{name}: finding.opened events {dict(ids)}")

    # Repairs: one per node, succeeded, each step once; one reset each; back in Slurm.
    resets = room.resets_since(chaos_started)
    repairs_wrong: list[str] = []
    for name, node in nodes.items():
        repair_id = approved.get(name)
        if repair_id is None:
            repairs_wrong.append(f"{name}: no reboot recommended and approved")
            continue
        repair = api.get(f"/api/v1/repairs/{repair_id}")
        if repair["status"] != "succeeded":
            repairs_wrong.append(
                f"{name}: repair {repair_id} {repair['status']}: {repair['detail']}"
            )
        events = api.get("/api/v1/events", node=node["id"], kind="repair.status", limit=500)
        steps = [
            e["data"]["to"]
            for e in sorted(events["items"], key=lambda e: e["id"])
            if repair_id in e["message"]
        ]
        if steps != STEPS:
            repairs_wrong.append(f"{name}: steps {steps}")
        others = [
            r
            for r in api.get("/api/v1/repairs", node=node["id"])["items"]
            if r["id"] != repair_id and r["status"] not in ("proposed", *NOT_RUN)
        ]
        if others:
            repairs_wrong.append(
                f"{name}: other repairs ran {[(r['id'], r['status']) for r in others]}"
            )
        if resets[name] != 1:
            asked = [(host, kind) for _, host, kind in room.resets if host == name]
            repairs_wrong.append(f"{name}: {resets[name]} resets asked of its BMC: {asked}")
        shown = api.get(f"/api/v1/nodes/{node['id']}")
        if shown["state"] != "in_service" or shown["boot_id"] == boot_ids[name]:
            repairs_wrong.append(f"{name}: {shown['state']}, boot id {shown['boot_id']}")
        state = slurm_lab.run("sinfo", "-h", "-n", name, "-o", "%T").stdout.strip()
        if state != "idle":
            repairs_wrong.append(f"{name}: Slurm state {state}")

    # Acceptance: the cluster's run and each repair's re-acceptance passed, and DCGM ran
    # once per node in each (two each: the cluster's run and its node's repair).
    runs = api.get(f"/api/v1/clusters/{cluster_id}/acceptance")["items"]
    acceptance = sorted((r["trigger"], r["status"], len(r["node_ids"])) for r in runs)
    calls = Counter(line.split()[0] for line in (tmp_path / "dcgmi-calls").read_text().splitlines())
    cluster_now = api.get(f"/api/v1/clusters/{cluster_id}")
    enrolled = api.get("/api/v1/events", kind="node.enrolled", cluster=cluster_id)["items"]
    enrolled_again = sum("again" in e["message"] for e in enrolled)

    late = leases.late(intervals, allowance_s=START_ALLOWANCE_S)
    print(
        f"seed {SEED}: {chaos.total()} kills in {chaos_s:.0f} s "
        f"(by replica {dict(sorted(chaos.kills.items()))}, "
        f"{chaos.spared} rounds spared: fewer than two serving); setup {setup_s:.0f} s; "
        f"repairs {[(n, r['status']) for n, r in sorted(ended.items())]}; "
        f"resets asked {dict(resets)}; boots {[m.boots for m in machines.values()]}; "
        f"approvals whose answer was lost {lost_answers}; enrollments "
        f"{len(enrolled)} ({enrolled_again} asked again); in service after {in_service_s:.0f} s; "
        f"acceptance runs {acceptance}, DCGM runs by node {dict(calls)}; "
        f"Xid 43 lines {sum(sum(m.xid43.values()) for m in machines.values())}; "
        f"leases: {sum(leases.handovers.values())} handovers, longest past expiry "
        f"{ {n: round(v, 1) for n, v in sorted(leases.overdue_s.items())} }; "
        f"wall {time.monotonic() - started:.0f} s"
    )
    assert not repairs_wrong, repairs_wrong
    assert cluster_now["status"] == "ready", cluster_now
    assert all(status == "passed" for _, status, _ in acceptance), acceptance
    assert len(acceptance) == 1 + len(nodes), acceptance
    assert calls == dict.fromkeys(nodes, 2), calls
    assert not findings_wrong, findings_wrong
    assert chaos.total() >= MIN_KILLS, chaos.kills
    # The repairs' steps were taken by more than one replica: the executor moved.
    assert leases.handovers["loop:repair-executor"] > 0, leases.handovers
    assert not late, late


def pg_dsn_of(stack: Stack) -> str:
    url = stack.replicas[0].proc.env["GPUFLEET_DATABASE_URL"]
    return url.split("://", 1)[1]
