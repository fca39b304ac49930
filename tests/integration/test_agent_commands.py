"""The command channel between real processes: ``gpufleet server`` and ``gpufleet agent``.

An admin queues commands for the node over the REST API; the agent takes them through
its long poll, runs them and reports back:

1. ``echo`` succeeds with its output; a failing script fails with its exit code and
   stderr; a ``sleep`` past its timeout is SIGTERMed and ends ``timed_out``; a command
   that prints 100 kB keeps only its last ``max_output_bytes``, cut on the left.
2. The agent is SIGKILLed while a command runs. The command's process (its own session)
   outlives it. Started again, the agent kills that leftover and reports the command
   failed, "agent restarted while it ran"; it is never run again, and new commands run.
3. The server stops on SIGINT while the agent holds a long poll open.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gpufleet.core.agent_protocol import AGENT_RESTARTED, script_argv
from gpufleet.sim.world import SimWorld
from gpufleet.testing.processes import AgentProcess, ServerProcess, free_port

pytestmark = pytest.mark.slow

T = TypeVar("T")


def _wait(predicate: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Node:
    server: ServerProcess
    api: httpx.Client
    node_id: str
    token: str
    hostname: str


@pytest.fixture
def node(database_url: str, tmp_path: Path) -> Iterator[Node]:
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
    }
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    api = httpx.Client(base_url=url, timeout=10)
    try:
        server.start()
        server.wait_ready(url)
        api.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        created = api.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "c1", "size": 1, "acceptance_tests": False},
        )
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]

        def in_service() -> dict[str, Any] | None:
            items = api.get("/api/v1/nodes", params={"cluster": cluster_id}).json()["items"]
            return items[0] if items and items[0]["state"] == "in_service" else None

        found = _wait(in_service, timeout_s=60, what="the node in service")
        (instance,) = SimWorld(data_dir / "sim-world.json").list_instances(cluster_id=cluster_id)
        yield Node(
            server=server,
            api=api,
            node_id=found["id"],
            token=instance.user_data["gpufleet_node_token"],
            hostname=instance.hostname,
        )
    finally:
        server.kill()
        api.close()


def _agent(node: Node, tmp: Path) -> AgentProcess:
    log = tmp / "kern.log"
    log.touch()
    return AgentProcess(
        server_url=str(node.api.base_url).rstrip("/"),
        node_token=node.token,
        state_dir=tmp / "agent-state",
        kernel_log=log,
        log_path=tmp / "agent.log",
        env={
            "GPUFLEET_AGENT_HOSTNAME": node.hostname,
            "GPUFLEET_AGENT_COLLECTORS": '["sim"]',
            "GPUFLEET_AGENT_COMMAND_KILL_GRACE_S": "1",
        },
    )


def _run(node: Node, argv: list[str], **body: Any) -> str:
    response = node.api.post(
        f"/api/v1/nodes/{node.node_id}/commands", json={"argv": argv, "timeout_s": 30, **body}
    )
    assert response.status_code == 201, response.text
    command_id: str = response.json()["id"]
    return command_id


def _record(node: Node, command_id: str) -> dict[str, Any]:
    response = node.api.get(f"/api/v1/nodes/{node.node_id}/commands/{command_id}")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def _ended(node: Node, command_id: str, *, timeout_s: float = 30) -> dict[str, Any]:
    def result() -> dict[str, Any] | None:
        record = _record(node, command_id)
        return record if record["result"] is not None else None

    return _wait(result, timeout_s=timeout_s, what=f"the result of {command_id}")


def test_the_real_agent_runs_commands_and_survives_a_crash_mid_command(
    node: Node, tmp_path: Path
) -> None:
    agent = _agent(node, tmp_path)
    agent.start()
    try:
        echo = _ended(node, _run(node, ["echo", "hello from", "the node"]))
        assert echo["status"] == "succeeded", echo
        assert echo["result"]["stdout"] == "hello from the node\n"
        assert echo["result"]["exit_code"] == 0 and echo["deliveries"] == 1

        failing = _ended(node, _run(node, script_argv("echo out; echo err >&2; exit 3")))
        assert failing["status"] == "failed" and failing["result"]["exit_code"] == 3
        assert (failing["result"]["stdout"], failing["result"]["stderr"]) == ("out\n", "err\n")

        slow = _ended(node, _run(node, ["sleep", "30"], timeout_s=1))
        assert slow["status"] == "timed_out", slow
        assert slow["result"]["signal"] == signal.SIGTERM and slow["result"]["exit_code"] is None

        loud = _ended(
            node,
            _run(
                node,
                script_argv("head -c 100000 /dev/zero | tr '\\0' x; printf END"),
                max_output_bytes=1000,
            ),
        )
        out = loud["result"]
        assert out["stdout_truncated"] and out["stdout_bytes"] == 100_003
        assert len(out["stdout"]) == 1000 and out["stdout"] == "x" * 997 + "END"

        # 2. SIGKILL the agent while a command runs.
        pidfile = tmp_path / "victim.pid"
        victim = _run(
            node,
            script_argv(f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300"),
            timeout_s=600,
        )
        _wait(lambda: pidfile.exists(), timeout_s=30, what="the command to start")
        pid = int(pidfile.read_text())
        assert _record(node, victim)["status"] == "sent"
        agent.kill()
        assert _alive(pid), "the command's process outlives the agent (its own session)"
        agent.start()
        crashed = _ended(node, victim)
        assert crashed["status"] == "failed", crashed
        assert crashed["result"]["error"].startswith(AGENT_RESTARTED), crashed["result"]
        assert f"killed process group {pid}" in crashed["result"]["error"]
        assert _wait(lambda: not _alive(pid), timeout_s=10, what="the leftover killed")
        assert crashed["deliveries"] == 1  # reported, never handed out or run again

        after = _ended(node, _run(node, ["echo", "again"]))
        assert after["status"] == "succeeded" and after["result"]["stdout"] == "again\n"
        assert after["agent_boot_id"] != echo["agent_boot_id"]  # a new agent run
        # The agent forgets an entry once the server has answered its result, a moment
        # after the server shows the command ended.
        journal = tmp_path / "agent-state" / "commands"
        _wait(lambda: not list(journal.glob("*.json")), timeout_s=10, what="an empty journal")

        # 3. The server stops cleanly although the agent holds a poll open (it cancels
        # what is left after its graceful-shutdown timeout; the stop helper would SIGKILL
        # a server still running after 15 s).
        node.server.stop()
        assert node.server.proc is not None
        assert node.server.proc.returncode != -signal.SIGKILL, node.server.output()[-2000:]
    finally:
        agent.kill()
        if (tmp_path / "victim.pid").exists():
            victim_pid = int((tmp_path / "victim.pid").read_text())
            if _alive(victim_pid):
                os.kill(victim_pid, signal.SIGKILL)
