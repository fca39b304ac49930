"""Command channel latency: a command queued on the server → its process started on the node.

    python bench/commands.py [--count 50] [--poll-s 5] [--database-url URL]

The real server in a subprocess (SQLite in a temp dir, or ``--database-url``) with a
1-node sim cluster (acceptance off, no simulated agents), and the real agent
(``gpufleet agent``, collectors ``sim``) with the node's token. The bench queues
``--count`` commands one after another through the REST API (``POST
/api/v1/nodes/{id}/commands``, argv ``true``), each once the previous one has its result,
with a random pause of 0–``--pause-s`` in between (default: the poll interval, so a plain
poll is met at a random phase, as commands queued by people and loops are), and
reads for each ``result.started_at - created_at``: both stamped on this machine's clock,
the first by the server as it queues, the second by the agent right after the spawn.

Two runs, one agent each:

* long poll: ``GPUFLEET_AGENT_COMMAND_WAIT_S=20`` (the default);
* plain poll: ``GPUFLEET_AGENT_COMMAND_WAIT_S=0`` and ``COMMAND_POLL_S=--poll-s`` (5 s,
  the setting's default): the agent asks every 5 s.

Prints p50 / p95 / max per run. Nothing is asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ServerProcess, machine_lines, percentile
from detection import Agent


async def create_node(url: str, owner: str, data_dir: Path) -> tuple[str, str, str]:
    """A project and a 1-node cluster without acceptance; (node id, token, hostname)."""
    from gpufleet.sim.world import SimWorld

    headers = {"authorization": f"Bearer {owner}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as api:
        (await api.post("/api/v1/projects", json={"name": "bench"})).raise_for_status()
        created = await api.post(
            "/api/v1/clusters",
            json={"project": "bench", "name": "cmd", "size": 1, "acceptance_tests": False},
        )
        created.raise_for_status()
        cluster_id = str(created.json()["id"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            nodes = (await api.get("/api/v1/nodes", params={"cluster": cluster_id})).json()
            if nodes["items"] and nodes["items"][0]["state"] == "in_service":
                node = nodes["items"][0]
                break
            await asyncio.sleep(0.2)
        else:
            raise RuntimeError("the node never came into service")
    (instance,) = SimWorld(data_dir / "sim-world.json").list_instances(cluster_id=cluster_id)
    return str(node["id"]), instance.user_data["gpufleet_node_token"], instance.hostname


async def measure(
    url: str, owner: str, node_id: str, count: int, pause_s: float
) -> tuple[list[float], list[float]]:
    """Per command, in order: queued → started, and queued → handed out (``sent_at``,
    stamped by the server as the agent's poll takes it), in seconds."""
    rng = random.Random(1)
    latencies: list[float] = []
    handed: list[float] = []
    headers = {"authorization": f"Bearer {owner}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as api:
        for i in range(count + 1):  # the first one waits for the agent's first poll
            response = await api.post(
                f"/api/v1/nodes/{node_id}/commands", json={"argv": ["true"], "timeout_s": 30}
            )
            response.raise_for_status()
            command = response.json()
            deadline = time.monotonic() + 60
            while True:
                record = (await api.get(f"/api/v1/nodes/{node_id}/commands/{command['id']}")).json()
                if record["result"] is not None:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"command {command['id']} never ended: {record}")
                await asyncio.sleep(0.02)
            started = dt.datetime.fromisoformat(record["result"]["started_at"])
            created = dt.datetime.fromisoformat(record["created_at"])
            sent = dt.datetime.fromisoformat(record["sent_at"])
            if i > 0:
                latencies.append((started - created).total_seconds())
                handed.append((sent - created).total_seconds())
            await asyncio.sleep(rng.uniform(0.0, pause_s))
    return latencies, handed


def line(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    ms = [1000 * percentile(ordered, p) for p in (50, 95, 100)]
    return (
        f"{name:<34} n={len(values):>3}  p50 {ms[0]:8.1f} ms  p95 {ms[1]:8.1f} ms  "
        f"max {ms[2]:8.1f} ms"
    )


async def amain(args: argparse.Namespace) -> int:
    for text in machine_lines():
        print(text)
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-commands-"))
    env = {
        "GPUFLEET_SIM_AGENTS": "false",
        "GPUFLEET_SIM_PROVISION_DELAY_S": "[0, 0]",
        "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
        "GPUFLEET_DATABASE_URL": args.database_url or "",
    }
    server = ServerProcess(data_dir=work / "server", env_overrides=env)
    runs = [
        ("long poll (wait_s=20)", {"GPUFLEET_AGENT_COMMAND_WAIT_S": "20"}),
        (
            f"plain poll (every {args.poll_s:g} s)",
            {
                "GPUFLEET_AGENT_COMMAND_WAIT_S": "0",
                "GPUFLEET_AGENT_COMMAND_POLL_S": str(args.poll_s),
            },
        ),
    ]
    results: list[tuple[str, list[float], list[float]]] = []
    try:
        server.start()
        owner = server.wait_ready(timeout_s=60)
        node_id, token, hostname = await create_node(server.url, owner, server.data_dir)
        log = work / "kern.log"
        log.touch()
        for i, (name, extra) in enumerate(runs):
            agent_dir = work / f"agent-{i}"
            agent_dir.mkdir()
            agent = Agent(
                url=server.url,
                token=token,
                hostname=hostname,
                log=log,
                work=agent_dir,
                collectors='["sim"]',
                extra_env=extra,
            )
            try:
                started, handed = await measure(
                    server.url, owner, node_id, args.count, args.pause_s or args.poll_s
                )
                results.append((name, started, handed))
            finally:
                agent.stop()
            print(line(name, started), flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print("enqueue → agent start (server created_at → agent started_at, same clock):")
    for name, started, _ in results:
        print("  " + line(name, started))
    print("of which enqueue → handed out (created_at → sent_at, both server-stamped):")
    for name, _, handed in results:
        print("  " + line(name, handed))
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50, help="commands per run")
    parser.add_argument(
        "--poll-s", type=float, default=5.0, help="the plain-poll run's command_poll_s"
    )
    parser.add_argument(
        "--pause-s",
        type=float,
        default=None,
        help="longest random pause between commands (default: --poll-s)",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="a database URL for the server (default: SQLite in the temp dir)",
    )
    return asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
