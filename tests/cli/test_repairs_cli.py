"""``gpufleet repairs``, the node actions and the cluster breaker.

End to end against a real ``gpufleet server`` process with a simulated fleet (its repair
planner and executor run inside it), driven only through the CLI as a person would; and,
for what the sim fleet cannot show on demand (jobs with users, incidents, a forced
drain), the same commands against an ``httpx.MockTransport``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli import config, nodes
from gpufleet.cli.main import app
from gpufleet.client.api import ApiClient
from gpufleet.testing.processes import RUN_CLI, ServerProcess, fast_sim_server_env, free_port

EVIDENCE_LINE = "GPU has fallen off the bus"


@dataclass(frozen=True)
class Fleet:
    url: str
    token: str
    server: ServerProcess

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``gpufleet ARGS`` in a child process; stdin is never a terminal here."""
        env = {**os.environ, "GPUFLEET_URL": self.url, "GPUFLEET_TOKEN": self.token,
               "COLUMNS": "250"}  # fmt: skip
        return subprocess.run(
            [sys.executable, "-c", RUN_CLI, *args],
            env=env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str) -> str:
        done = self.cli(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--output", "json"))


def _wait(predicate: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.3)


def _make_cluster(fleet: Fleet, *, name: str, project: str, size: int) -> None:
    fleet.ok(
        "clusters", "create", name, "--project", project, "--size", str(size),
        "--no-acceptance-tests",
    )  # fmt: skip

    def ready() -> bool:
        nodes = fleet.json("nodes", "list", "--cluster", name)["items"]
        return len(nodes) == size and all(
            n["state"] == "in_service" and n["health"] == "healthy" for n in nodes
        )

    _wait(ready, timeout_s=30, what=f"cluster {name} in service and healthy")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("repairs-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file)
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    server.start()
    try:
        server.wait_ready(url)
        fleet = Fleet(url=url, token=token_file.read_text().strip(), server=server)
        fleet.ok("projects", "create", "ml")
        # Verification needs the node to report clean for verify_settle_s (30 s by
        # default); a share of 1 keeps the breaker out of the tests that are not about it.
        fleet.ok("repairs", "policy", "set", "--project", "ml", "--verify-settle-s", "1",
                 "--breaker-max-share", "1", "--cooldown-s", "0")  # fmt: skip
        _make_cluster(fleet, name="c1", project="ml", size=3)
        yield fleet
    finally:
        server.stop()


def _node_id(fleet: Fleet, name: str, cluster: str = "c1") -> str:
    return str(fleet.json("nodes", "show", name, "--cluster", cluster)["id"])


@pytest.mark.slow
def test_policy_show_and_set(fleet: Fleet, tmp_path: Path) -> None:
    shown = fleet.json("repairs", "policy", "show", "--project", "ml")
    assert shown["verify_settle_s"] == 1.0 and shown["breaker_max_share"] == 1.0
    assert shown["auto_approve"] == []
    table = fleet.ok("repairs", "policy", "show", "--project", "ml")
    assert "verify_settle_s" in table and "every repair waits for an admin" in table

    # A malformed rule is refused before anything is sent.
    bad = fleet.cli("repairs", "policy", "set", "-p", "ml", "--auto-approve", "xid-79")
    assert bad.returncode == 2 and "SIGNATURE:ACTION" in bad.stderr
    # One the server refuses (not in the catalog) is exit 2 with its message.
    unknown = fleet.cli("repairs", "policy", "set", "-p", "ml", "--auto-approve", "nope:reboot")
    assert unknown.returncode == 2 and "unknown signature" in unknown.stderr

    # Flags change the current policy; they do not reset the rest to the defaults.
    changed = fleet.json("repairs", "policy", "set", "-p", "ml",
                         "--auto-approve", "thermal-slowdown:reboot")  # fmt: skip
    assert changed["auto_approve"] == [{"signature_id": "thermal-slowdown", "action": "reboot"}]
    assert changed["verify_settle_s"] == 1.0
    cleared = fleet.json("repairs", "policy", "set", "-p", "ml", "--no-auto-approve")
    assert cleared["auto_approve"] == [] and cleared["breaker_max_share"] == 1.0

    # --file is the whole policy (what `policy show -o json` prints).
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({**cleared, "ttl_s": 120.0}))
    from_file = fleet.json("repairs", "policy", "set", "-p", "ml", "--file", str(policy_file))
    assert from_file == {**cleared, "ttl_s": 120.0}
    policy_file.write_text("[1, 2]")
    not_object = fleet.cli("repairs", "policy", "set", "-p", "ml", "--file", str(policy_file))
    assert not_object.returncode == 2 and "JSON object" in not_object.stderr


@pytest.mark.slow
def test_xid_79_is_proposed_shown_approved_and_carried_out(fleet: Fleet) -> None:
    node_id = _node_id(fleet, "c1-000")
    fleet.ok("inject", "--node", "c1-000", "--cluster", "c1", "--signature", "xid-79")

    def proposed() -> dict[str, Any] | None:
        items = fleet.json("repairs", "list", "--cluster", "c1", "--node", "c1-000")["items"]
        return next((r for r in items if r["status"] == "proposed"), None)

    repair = _wait(proposed, timeout_s=30, what="a proposed repair for c1-000")
    assert repair["action"] == "reboot" and repair["signature_id"] == "xid-79"
    assert repair["node_id"] == node_id and repair["kind"] == "node"

    listed = fleet.ok("repairs", "list")
    header = listed.splitlines()[0].split()
    assert header == ["ID", "NODE", "ACTION", "STATUS", "SIGNATURE", "AGE", "DETAIL"]
    row = next(line for line in listed.splitlines() if repair["id"] in line)
    assert "c1-000" in row and "reboot" in row and "proposed" in row and "xid-79" in row

    shown = fleet.ok("repairs", "show", repair["id"])
    assert EVIDENCE_LINE in shown and "fatal" in shown
    assert repair["reason"] in shown and repair["rule"] in shown
    assert "Jobs on the node now: none" in shown
    as_json = fleet.json("repairs", "show", repair["id"])
    assert as_json["id"] == repair["id"] and as_json["jobs"] == []
    assert as_json["evidence"]["findings"][0]["signature_id"] == "xid-79"

    # Dismissing needs a reason; without one nothing changes.
    no_reason = fleet.cli("repairs", "dismiss", repair["id"])
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    blank = fleet.cli("repairs", "dismiss", repair["id"], "--reason", "  ")
    assert blank.returncode == 2
    assert fleet.json("repairs", "show", repair["id"])["status"] == "proposed"

    approved = fleet.json("repairs", "approve", repair["id"], "--reason", "it fell off the bus")
    assert approved["status"] == "approved" and approved["decision_reason"]
    again = fleet.cli("repairs", "approve", repair["id"])
    assert again.returncode == 2 and again.stderr.startswith("error: ")

    def ended() -> dict[str, Any] | None:
        shown = fleet.json("repairs", "show", repair["id"])
        return shown if shown["status"] in ("succeeded", "failed") else None

    done = _wait(ended, timeout_s=30, what="the reboot to be carried out and verified")
    assert done["status"] == "succeeded", done
    node = fleet.json("nodes", "show", node_id)
    assert node["state"] == "in_service"

    open_ids = [r["id"] for r in fleet.json("repairs", "list", "--node", node_id)["items"]]
    assert repair["id"] not in open_ids
    every = fleet.json("repairs", "list", "--node", node_id, "--all")["items"]
    assert repair["id"] in [r["id"] for r in every]
    succeeded = fleet.json("repairs", "list", "--status", "succeeded", "--status", "failed")
    assert repair["id"] in [r["id"] for r in succeeded["items"]]

    # The dry run over the same history proposes the same reboot.
    replay = fleet.json("repairs", "replay", "--project", "ml", "--cluster", "c1", "--days", "1")
    assert {"entries", "summary"} <= replay.keys()
    assert any(
        e["subject"] == "c1-000" and e["kind"] == "propose" and e["action"] == "reboot"
        for e in replay["entries"]
    ), replay
    assert replay["summary"]["propose"] >= 1
    table = fleet.ok("repairs", "replay", "--project", "ml")
    assert "c1-000" in table and "propose" in table and "Summary" in table


@pytest.mark.slow
def test_cordon_uncordon_round_trip(fleet: Fleet) -> None:
    no_reason = fleet.cli("nodes", "cordon", "c1-001", "--cluster", "c1")
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr

    cordoned = fleet.ok("nodes", "cordon", "c1-001", "--cluster", "c1", "--reason", "flaky")
    assert "is cordoned" in cordoned
    assert fleet.json("nodes", "show", "c1-001", "--cluster", "c1")["state"] == "cordoned"

    back = fleet.json("nodes", "uncordon", "c1-001", "--cluster", "c1", "--reason", "fine")
    assert back["node"]["state"] == "in_service" and back["repair"] is None
    assert fleet.json("nodes", "show", "c1-001", "--cluster", "c1")["state"] == "in_service"

    # A name no other node the caller sees has needs no --cluster.
    name_only = fleet.json("nodes", "cordon", "c1-001", "--reason", "x")
    assert name_only["node"]["state"] == "cordoned"
    fleet.ok("nodes", "uncordon", "c1-001", "--reason", "fine")


@pytest.mark.slow
def test_destructive_actions_need_yes_without_a_terminal(fleet: Fleet) -> None:
    node_id = _node_id(fleet, "c1-001")
    for args in (
        ["nodes", "reboot", "c1-001", "--cluster", "c1", "--reason", "x"],
        ["nodes", "reset-gpu", node_id, "--gpu", "0", "--reason", "x"],
        ["nodes", "remove", node_id, "--reason", "x"],
    ):
        refused = fleet.cli(*args)
        assert refused.returncode == 2, refused
        assert "--yes" in refused.stderr and "stdin is not a terminal" in refused.stderr
        # A "y" piped in is not consent either.
        piped = fleet.cli(*args, stdin="y\n")
        assert piped.returncode == 2, piped
    assert fleet.json("repairs", "list", "--node", node_id, "--all")["items"] == []
    assert fleet.json("nodes", "show", node_id)["state"] == "in_service"


@pytest.mark.slow
def test_reset_gpu_with_yes_prints_the_repair(fleet: Fleet) -> None:
    done = fleet.ok("nodes", "reset-gpu", "c1-002", "--cluster", "c1", "--gpu", "3",
                    "--reason", "xid 48 storm", "--yes")  # fmt: skip
    assert "reset_gpu of node c1-002: repair" in done
    repair_id = done.split("repair ", 1)[1].split()[0]
    shown = fleet.json("repairs", "show", repair_id)
    assert shown["action"] == "reset_gpu" and shown["gpu_index"] == 3
    assert shown["source"] == "manual" and shown["status"] != "proposed"
    # The sim keeps a reset GPU off the bus for 5-15 s (not a server setting), so wait
    # for the reset to be done and verifying rather than for the verdict.
    _wait(
        lambda: fleet.json("repairs", "show", repair_id)["status"] in ("verifying", "succeeded"),
        timeout_s=30, what="the GPU reset to be carried out",
    )  # fmt: skip
    table = fleet.ok("repairs", "show", repair_id)
    assert "reset_gpu gpu 3" in table and "xid 48 storm" in table


@pytest.mark.slow
def test_unknown_repair_is_a_clear_error(fleet: Fleet) -> None:
    missing = "0190a1b2-c3d4-7e5f-8a9b-00000000dead"
    shown = fleet.cli("repairs", "show", missing)
    assert shown.returncode == 2
    assert f"error: repair '{missing}' not found" in shown.stderr and shown.stdout == ""
    approved = fleet.cli("repairs", "approve", missing)
    assert approved.returncode == 2 and "not found" in approved.stderr
    not_an_id = fleet.cli("repairs", "dismiss", "nope", "--reason", "x")
    assert not_an_id.returncode == 2 and "not a repair id" in not_an_id.stderr


@pytest.mark.slow
def test_breaker_trips_refuses_and_resets(fleet: Fleet) -> None:
    fleet.ok("projects", "create", "ops")
    fleet.ok("repairs", "policy", "set", "-p", "ops", "--verify-settle-s", "1",
             "--breaker-max-share", "0.5")  # fmt: skip
    _make_cluster(fleet, name="b1", project="ops", size=2)
    closed = fleet.json("clusters", "breaker", "b1")
    assert closed["tripped"] is False and closed["total_nodes"] == 2
    assert closed["max_share"] == 0.5

    first = fleet.json("nodes", "reboot", "b1-000", "--cluster", "b1", "-r", "test", "--yes")
    assert first["repair"]["status"] == "approved"
    # A second node out would be 2 of 2 > 50%: the breaker refuses, and trips.
    second = fleet.cli("nodes", "reboot", "b1-001", "--cluster", "b1", "-r", "test", "--yes")
    assert second.returncode == 2, second
    assert "breaker" in second.stderr and second.stdout == ""
    tripped = fleet.json("clusters", "breaker", "b1")
    assert tripped["tripped"] is True and tripped["reason"]
    table = fleet.ok("clusters", "breaker", "b1")
    assert "tripped" in table and "50%" in table

    no_reason = fleet.cli("clusters", "breaker-reset", "b1")
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    reset = fleet.json("clusters", "breaker-reset", "b1", "--reason", "one at a time")
    assert reset["tripped"] is False and reset["tripped_at"] is None
    _wait(
        lambda: fleet.json("repairs", "show", first["repair"]["id"])["status"] == "succeeded",
        timeout_s=30, what="the first reboot to finish",
    )  # fmt: skip


# -- against a fake API: what the sim fleet does not show on demand ---------------------

URL = "http://gpufleet.test"
T0 = "2026-01-01T00:00:00Z"
CLUSTER_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
NODE_ID = "0190a1b2-c3d4-7e5f-8a9b-00000000a001"
REPAIR_ID = "0190a1b2-c3d4-7e5f-8a9b-0000000e0001"
INCIDENT_ID = "0190a1b2-c3d4-7e5f-8a9b-0000000e0002"
POLICY = {
    "ttl_s": 300.0, "cooldown_s": 1800.0, "ladder_window_s": 604800.0,
    "breaker_max_share": 0.1, "incident_min_nodes": 3, "incident_window_s": 300.0,
    "drain_timeout_s": 3600.0, "drain_timeout_action": "wait", "verify_settle_s": 30.0,
    "verify_timeout_s": 900.0, "auto_approve": [],
}  # fmt: skip
FINDING = {
    "id": "f1", "signature_id": "xid-79", "title": "GPU has fallen off the bus",
    "severity": "fatal", "evidence": "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has "
    "fallen off the bus.", "gpu_index": 0, "first_seen": T0, "last_seen": T0, "count": 1,
}  # fmt: skip
JOB = {"job_id": "4711", "name": "llm-pretrain", "user": "alice", "account": "nlp",
       "state": "RUNNING", "gpus": 8, "started_at": T0}  # fmt: skip
REPAIR: dict[str, Any] = {
    "id": REPAIR_ID, "cluster_id": CLUSTER_ID, "node_id": NODE_ID, "node_name": "node-1",
    "kind": "node", "source": "policy", "action": "reprovision", "status": "draining",
    "signature_id": "xid-79", "host": "SIM1", "gpu_index": None,
    "reason": "node-1: GPU has fallen off the bus (xid-79) → reprovision",
    "rule": "catalog xid-79 → reboot; ladder: host had reboot (succeeded) 2h ago",
    "evidence": {
        "findings": [FINDING],
        "history": [{"repair_id": "r0", "action": "reboot", "status": "succeeded",
                     "finished_at": T0}],
        "topology": {"leaf_switch": "leaf-00", "pdu": None, "rack": "r1"},
        "rule": "catalog xid-79 → reboot",
    },
    "finding_ids": ["f1"], "incident_key": None, "node_ids": [],
    "escalated_from": "reboot", "auto_approved": False, "forced": False,
    "requested_by": None, "decided_by": "ada", "decision_reason": "go",
    "detail": "waiting for job 4711 (alice) to end",
    "jobs": [JOB, {"error": "job state unreadable: slurmctld timed out"}],
    "created_at": T0, "updated_at": T0, "approved_at": T0, "finished_at": None,
}  # fmt: skip
INCIDENT: dict[str, Any] = {
    **REPAIR, "id": INCIDENT_ID, "node_id": None, "node_name": None, "kind": "incident",
    "action": "none", "status": "proposed", "signature_id": "ib-link-down",
    "incident_key": "leaf_switch=leaf-07", "node_ids": ["n1", "n2", "n3"], "jobs": None,
    "escalated_from": None, "detail": "",
    "evidence": {"label": "leaf_switch", "value": "leaf-07", "history": [],
                 "nodes": [{"node_id": f"n{i}", "name": f"node-{i}",
                            "findings": [{**FINDING, "signature_id": "ib-link-down"}]}
                           for i in (1, 2, 3)],
                 "findings": [{**FINDING, "signature_id": "ib-link-down"}],
                 "topology": {"leaf_switch": "leaf-07", "pdu": None, "rack": None}},
}  # fmt: skip


class FakeApi:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.routes: dict[tuple[str, str], Callable[[httpx.Request], Any]] = {
            ("GET", "/api/v1/repairs"): lambda _: {"items": [REPAIR, INCIDENT],
                                                   "next_cursor": None},
            ("GET", f"/api/v1/repairs/{REPAIR_ID}"): lambda _: REPAIR,
            ("GET", f"/api/v1/repairs/{INCIDENT_ID}"): lambda _: INCIDENT,
            ("POST", f"/api/v1/repairs/{REPAIR_ID}/force"): lambda _: {**REPAIR, "forced": True},
            ("GET", "/api/v1/projects/ml/repair-policy"): lambda _: POLICY,
            ("PUT", "/api/v1/projects/ml/repair-policy"): lambda r: json.loads(r.content),
        }  # fmt: skip

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "nope"}})
        return httpx.Response(200, json=route(request))

    def make_client(self, creds: config.Credentials) -> ApiClient:
        return ApiClient(
            base_url=creds.url, token=creds.token, transport=httpx.MockTransport(self.handle)
        )

    def sent(self, method: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeApi:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("COLUMNS", "250")
    fake = FakeApi()
    monkeypatch.setattr(config, "make_client", fake.make_client)
    return fake


def _invoke(*args: str, **kwargs: Any) -> Any:
    env = {"GPUFLEET_URL": URL, "GPUFLEET_TOKEN": "tok"}
    return CliRunner().invoke(app, list(args), env=env, **kwargs)


def test_list_sends_repeated_statuses_and_open_only_by_default(api: FakeApi) -> None:
    result = _invoke("repairs", "list")
    assert result.exit_code == 0, result.output
    params = api.requests[-1].url.params
    assert params["open"] == "true" and "status" not in params
    assert "incident leaf_switch=leaf-07 (3 nodes)" in result.stdout
    assert "reprovision (from reboot)" in result.stdout

    result = _invoke("repairs", "list", "--status", "failed", "--status", "succeeded",
                     "--kind", "node")  # fmt: skip
    assert result.exit_code == 0, result.output
    params = api.requests[-1].url.params
    assert params.get_list("status") == ["failed", "succeeded"] and "open" not in params
    assert params["kind"] == "node"

    assert _invoke("repairs", "list", "--all").exit_code == 0
    assert "open" not in api.requests[-1].url.params
    assert _invoke("repairs", "list", "--status", "done").exit_code == 2


def test_show_names_the_jobs_users_and_accounts_on_the_node(api: FakeApi) -> None:
    result = _invoke("repairs", "show", REPAIR_ID)
    assert result.exit_code == 0, result.output
    out = result.stdout
    row = next(line for line in out.splitlines() if line.startswith("4711"))
    assert row.split()[:5] == ["4711", "llm-pretrain", "alice", "nlp", "RUNNING"]
    assert "job state unreadable: slurmctld timed out" in out
    assert FINDING["evidence"] in out and "Host history" in out
    assert "leaf_switch leaf-00, rack r1" in out and "ada: go" in out
    assert "waiting for job 4711 (alice) to end" in out


def test_show_an_incident_lists_its_nodes(api: FakeApi) -> None:
    result = _invoke("repairs", "show", INCIDENT_ID)
    assert result.exit_code == 0, result.output
    assert "Nodes in the incident" in result.stdout
    for i in (1, 2, 3):
        assert f"node-{i}" in result.stdout
    assert "ib-link-down" in result.stdout and "Jobs on the node" not in result.stdout


def test_force_asks_first_and_names_whose_jobs_die(api: FakeApi) -> None:
    refused = _invoke("repairs", "force", REPAIR_ID, "--reason", "deadline")
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    assert api.sent("POST") == []
    missing = _invoke("repairs", "force", REPAIR_ID, "--yes")
    assert missing.exit_code == 2 and api.sent("POST") == []

    forced = _invoke("repairs", "force", REPAIR_ID, "--reason", "deadline", "--yes", "-o", "json")
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["forced"] is True
    assert json.loads(api.sent("POST")[-1].content) == {"reason": "deadline"}


def test_confirmation_on_a_terminal(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "stdin_is_terminal", lambda: True)
    result = _invoke("repairs", "force", REPAIR_ID, "--reason", "deadline", input="n\n")
    assert result.exit_code == 1
    assert "4711 (alice)" in result.stderr and api.sent("POST") == []


def test_policy_flags_change_the_current_policy(api: FakeApi) -> None:
    result = _invoke("repairs", "policy", "set", "--project", "ml", "--auto-approve",
                     "xid-79:reboot", "--auto-approve", "xid-48:reset_gpu",
                     "--drain-timeout-action", "requeue", "-o", "json")  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(api.sent("PUT")[-1].content)
    assert body == {
        **POLICY,
        "drain_timeout_action": "requeue",
        "auto_approve": [
            {"signature_id": "xid-79", "action": "reboot"},
            {"signature_id": "xid-48", "action": "reset_gpu"},
        ],
    }
    nothing = _invoke("repairs", "policy", "set", "--project", "ml")
    assert nothing.exit_code == 2 and "nothing to set" in nothing.stderr
    wrong = _invoke("repairs", "policy", "set", "-p", "ml", "--auto-approve", "xid-79:restart")
    assert wrong.exit_code == 2 and len(api.sent("PUT")) == 1
