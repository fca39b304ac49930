"""Every command that takes a node takes its id or its name (unique among the caller's
nodes, or with ``--cluster``), through one helper; an ambiguous name is exit 2 naming the
candidates. And no input shows a traceback: bad input anywhere is exit 2 with a message.
Against the real app, in process (the CLI in a worker thread, its requests to the app on
the test's loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from gpufleet.cli import config
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.cli_app import InProcessCli, ready_cluster

UNKNOWN_ID = "0190a1b2-c3d4-7e5f-8a9b-00000000dead"


@dataclass
class Fleet:
    app: RunningApp
    cli: InProcessCli
    clusters: dict[str, dict[str, Any]]
    nodes: dict[tuple[str, str], str]  # (cluster, node name) -> node id

    async def run(self, *args: str) -> Result:
        return await self.cli.run(*args)


@pytest.fixture
async def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Fleet]:
    # SQLite only: what is tested is the CLI's lookups, not the store.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("COLUMNS", "200")  # rich would otherwise wrap at 80
    settings = make_settings(
        data_dir=tmp_path / "data", database_url=f"sqlite+aiosqlite:///{tmp_path / 'db'}"
    )
    async with running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        # Two clusters whose nodes share names (gpu-000, gpu-001), one with its own.
        clusters = {
            name: await ready_cluster(app, project="ml", name=name, size=2, node_prefix=prefix)
            for name, prefix in (("a", "gpu-"), ("b", "gpu-"), ("c", None))
        }
        listed = (await app.client.get("/api/v1/nodes", params={"limit": 100})).json()
        by_id = {c["id"]: name for name, c in clusters.items()}
        nodes = {(by_id[n["cluster_id"]], n["name"]): n["id"] for n in listed["items"]}
        cli = InProcessCli(app, asyncio.get_running_loop())
        monkeypatch.setattr(config, "make_client", cli.make_client)
        yield Fleet(app, cli, clusters, nodes)


def _flat(text: str) -> str:
    return " ".join(text.split())


# Each command that takes a node, with the rest of what it needs; NODE is where it goes.
NODE_COMMANDS = [
    ("nodes", "show", "NODE"),
    ("nodes", "token", "NODE"),
    ("nodes", "cordon", "NODE", "-r", "testing"),
    ("nodes", "drain", "NODE", "-r", "testing"),
    ("events", "--node", "NODE"),
    ("findings", "--node", "NODE"),
    ("repairs", "list", "--node", "NODE"),
    ("inject", "--signature", "xid-79", "--node", "NODE"),
    ("hosts", "bind", "no-such-host", "NODE", "-p", "ml"),
]


def _with(command: tuple[str, ...], node: str) -> list[str]:
    return [node if part == "NODE" else part for part in command]


@pytest.mark.parametrize("command", NODE_COMMANDS, ids=lambda c: " ".join(c[:2]))
async def test_every_node_command_takes_a_name_an_id_or_a_name_with_cluster(
    fleet: Fleet, command: tuple[str, ...]
) -> None:
    ambiguous = await fleet.run(*_with(command, "gpu-000"))
    assert ambiguous.exit_code == 2, ambiguous.output
    said = _flat(ambiguous.stderr)
    assert "2 nodes are named 'gpu-000'" in said and "--cluster" in said
    for cluster in ("a", "b"):
        assert f"in cluster {cluster} ({fleet.nodes[(cluster, 'gpu-000')]})" in said

    # The hosts inventory has no such host: the node is found, then the server says so.
    found = 2 if command[0] == "hosts" else 0
    for ref in (
        ["c-001"],  # unique among the caller's nodes
        ["gpu-000", "--cluster", "b"],
        ["gpu-001", "--project", "ml", "--cluster", "a"],
        [fleet.nodes[("b", "gpu-001")]],
    ):
        done = await fleet.run(*_with(command, ref[0]), *ref[1:])
        assert done.exit_code == found, done.output
        if found:
            assert "no-such-host" in done.stderr, done.stderr

    missing = await fleet.run(*_with(command, "gpu-999"))
    assert missing.exit_code == 2
    assert "no node named 'gpu-999'" in missing.stderr


async def test_the_node_found_is_the_one_in_the_cluster_named(fleet: Fleet) -> None:
    shown = await fleet.run("nodes", "show", "gpu-000", "-c", "b", "-o", "json")
    assert shown.exit_code == 0
    assert fleet.nodes[("b", "gpu-000")] in shown.stdout
    assert fleet.nodes[("a", "gpu-000")] not in shown.stdout


async def test_the_events_table_names_nodes_not_ids(fleet: Fleet) -> None:
    cordoned = await fleet.run("nodes", "cordon", "gpu-001", "-c", "a", "-r", "testing")
    assert cordoned.exit_code == 0
    for args in (("events", "--cluster", "a"), ("events", "--node", "c-000"), ("events",)):
        listed = await fleet.run(*args, "--limit", "200")
        assert listed.exit_code == 0
        assert not any(node_id in listed.stdout for node_id in fleet.nodes.values()), args
    shown = await fleet.run("events", "--node", "gpu-001", "-c", "a")
    assert "gpu-001" in shown.stdout and "cordon" in shown.stdout


BAD_INPUTS = [
    ("events", "--since", "99999999999999d"),
    ("events", "--since", "yesterday"),
    ("events", "--since", ""),
    ("events", "--limit", "0"),
    ("events", "--limit", "many"),
    ("events", "--node", ""),
    ("events", "--node", "   "),
    ("events", "--node", "gpu-000"),
    ("events", "--node", UNKNOWN_ID),
    ("events", "--cluster", "nope"),
    ("events", "--cluster", "nope", "--node", "gpu-000"),
    ("events", "--project", "nope", "--node", "gpu-000"),
    ("nodes", "list", "--state", "bogus"),
    ("nodes", "list", "--health", "bogus"),
    ("nodes", "list", "--limit", "-1"),
    ("nodes", "list", "--cluster", "nope"),
    ("nodes", "list", "--bogus"),
    ("nodes", "show"),
    ("nodes", "show", "nope"),
    ("nodes", "show", ""),
    ("nodes", "show", UNKNOWN_ID),
    ("nodes", "show", "gpu-000", "--cluster", UNKNOWN_ID),
    ("nodes", "cordon", "c-000"),
    ("nodes", "cordon", "c-000", "-r", "  "),
    ("nodes", "reboot", "c-000", "-r", "why"),  # no terminal to ask on, no --yes
    ("nodes", "reset-gpu", "c-000", "-r", "why", "--gpu", "99", "--yes"),
    ("nodes", "reset-gpu", "c-000", "-r", "why", "--gpu", "-1", "--yes"),
    ("nodes", "bogus"),
    ("findings", "--node", "gpu-000"),
    ("findings", "--limit", "0"),
    ("repairs", "list", "--status", "bogus"),
    ("repairs", "list", "--node", "nope"),
    ("repairs", "show", "not-an-id"),
    ("repairs", "show", UNKNOWN_ID),
    ("inject", "--signature", "xid-79"),
    ("inject", "--signature", "no-such-signature", "--node", "c-000"),
    ("inject", "--signature", "xid-79", "--node", "c-000", "--gpu", "99"),
    ("inject", "--signature", "xid-79", "--node", "gpu-000"),
    ("hosts", "bind", "no-such-host", "c-000", "-p", "nope"),
    ("checks", "parse", "no-such-tool", "-"),
    ("checks", "parse", "dcgmi", "/no/such/file"),
    ("checks", "show", "not-an-id"),
    ("checks", "run", "--cluster", "c", "--check", "bogus"),
    ("acceptance", "show", "not-an-id"),
    ("clusters", "show", "nope"),
    ("clusters", "create", "x", "--project", "ml", "--size", "-1"),
    ("projects", "show", "nope"),
    ("usage", "gpu-hours", "--days", "-1"),
    ("bogus",),
]


async def test_bad_input_is_exit_2_with_a_message_never_a_traceback(fleet: Fleet) -> None:
    failed: list[str] = []
    for args in BAD_INPUTS:
        result = await fleet.run(*args)
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        if crashed or result.exit_code != 2 or "Traceback" in result.output:
            failed.append(
                f"gpufleet {' '.join(args)}: exit {result.exit_code}, {result.exception!r}"
            )
        elif not result.stderr.strip():
            failed.append(f"gpufleet {' '.join(args)}: exit 2 but says nothing")
    assert not failed, "\n".join(failed)
