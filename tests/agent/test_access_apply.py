"""The agent applies its project's admins to a sudoers fragment (checked by the real
visudo), end to end from the server's rendering; bad text never replaces the old file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.access import AccessApplier, AccessError, AccessSync, check_sudoers_text
from gpufleet.agent.outbox import outbox_dir
from gpufleet.client.agent import AgentClient
from gpufleet.core.slurm_admins import AccessConfig, render_access
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.testing.app import RunningApp

OLD = "# gpufleet: sudo for the admins\nold ALL=(ALL:ALL) NOPASSWD: ALL\n"


def config(sudoers: str, *, content_hash: str = "h1") -> AccessConfig:
    return AccessConfig(
        cluster_id="c",
        cluster_name="train",
        project_id="p",
        sudoers=sudoers,
        admin_levels={},
        skipped=[],
        content_hash=content_hash,
    )


def events(state_dir: Path) -> list[dict[str, Any]]:
    folder = outbox_dir(state_dir)
    if not folder.exists():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@pytest.fixture
def applier(tmp_path: Path) -> AccessApplier:
    target = tmp_path / "sudoers.d" / "gpufleet"
    target.parent.mkdir()
    target.write_text(OLD)
    return AccessApplier(state_dir=tmp_path / "state", sudoers_path=target)


def test_a_rendered_fragment_passes_visudo_and_replaces_the_old_one(
    applier: AccessApplier,
) -> None:
    access = render_access(
        cluster_id="c", cluster_name="train", project_id="p", project_name="ml", slurm=False,
        admins=[("alice", "alice"), ("bob", "b_ob-2")], members=[],
    )  # fmt: skip
    done = applier.apply(access)
    assert applier.sudoers_path is not None
    assert applier.sudoers_path.read_text() == access.sudoers
    assert done == [f"wrote {applier.sudoers_path} (2 admin rules)"]
    assert stat.S_IMODE(os.stat(applier.sudoers_path).st_mode) == 0o440
    assert [p.name for p in applier.sudoers_path.parent.iterdir()] == ["gpufleet"]
    assert applier.apply(access) == []  # same hash: nothing to do


@pytest.mark.parametrize(
    "text",
    [
        "alice ALL=(ALL:ALL) NOPASSWD: ALL\nDefaults !authenticate\n",
        "ALL ALL=(ALL:ALL) NOPASSWD: ALL\n",
        "alice ALL=(ALL:ALL) NOPASSWD: ALL, /bin/sh\n",
        "alice ALL=(ALL:ALL) NOPASSWD: ALL\n#include /tmp/evil\n",
        "#includedir /tmp\n",
        "#0 ALL=(ALL:ALL) NOPASSWD: ALL\n",
        " alice ALL=(ALL:ALL) NOPASSWD: ALL\n",
    ],
)
def test_the_agent_writes_nothing_but_admin_rules(applier: AccessApplier, text: str) -> None:
    with pytest.raises(AccessError, match="not an admin rule"):
        applier.apply(config(text))
    assert applier.sudoers_path is not None and applier.sudoers_path.read_text() == OLD


def test_what_visudo_refuses_never_replaces_the_old_file(applier: AccessApplier) -> None:
    refused = AccessApplier(
        state_dir=applier.state_dir, sudoers_path=applier.sudoers_path, visudo=("false",)
    )
    with pytest.raises(AccessError, match="visudo refused"):
        refused.apply(config("alice ALL=(ALL:ALL) NOPASSWD: ALL\n"))
    assert applier.sudoers_path is not None and applier.sudoers_path.read_text() == OLD
    assert [p.name for p in applier.sudoers_path.parent.iterdir()] == ["gpufleet"]


def test_real_visudo_refuses_a_syntax_error(tmp_path: Path) -> None:
    """What the agent relies on: ``visudo -cf`` fails on text sudo cannot parse, and
    passes a fragment the server renders."""
    broken = tmp_path / "broken"
    broken.write_text("alice ALL=(ALL:ALL NOPASSWD: ALL\n")
    fine = tmp_path / "fine"
    fine.write_text(OLD)
    for path, ok in ((broken, False), (fine, True)):
        proc = subprocess.run(
            ["visudo", "-cf", str(path)], capture_output=True, text=True, check=False
        )
        assert (proc.returncode == 0) is ok, proc.stderr


def test_sudoers_line_check() -> None:
    check_sudoers_text("# comment\n\nalice ALL=(ALL:ALL) NOPASSWD: ALL\n")
    with pytest.raises(AccessError):
        check_sudoers_text("alice  ALL=(ALL:ALL) NOPASSWD: ALL\n")


async def test_the_agent_follows_the_project_s_admins_from_the_server(
    app: RunningApp, tmp_path: Path
) -> None:
    """Server renders, agent fetches and applies; a promotion reaches sudoers at the next
    pass; a refused fragment leaves one event, not one per pass."""
    created = await app.client.post("/api/v1/projects", json={"name": "ml"})
    assert created.status_code == 201
    for name, role in (("alice", "admin"), ("bob", "member")):
        await app.client.post("/api/v1/users", json={"name": name, "unix_name": name})
        await app.client.post("/api/v1/projects/ml/members", json={"user": name, "role": role})
    cluster = await app.client.post(
        "/api/v1/clusters", json={"project": "ml", "name": "train", "size": 1}
    )
    cluster_id = cluster.json()["id"]
    token = await _node_token(app, cluster_id)
    target = tmp_path / "sudoers.d" / "gpufleet"
    applier = AccessApplier(state_dir=tmp_path / "state", sudoers_path=target)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app)) as http:
        client = AgentClient(base_url="http://test", node_token=token, http=http)
        sync = AccessSync(client, applier, interval_s=0.01)
        assert await sync.run_once() == [f"wrote {target} (1 admin rule)"]
        assert "alice ALL=(ALL:ALL) NOPASSWD: ALL" in target.read_text()
        assert "bob" not in target.read_text()
        assert await sync.run_once() == []
        promoted = await app.client.patch("/api/v1/projects/ml/members/bob", json={"role": "admin"})
        assert promoted.status_code == 200
        assert await sync.run_once() == [f"wrote {target} (2 admin rules)"]
        assert "bob ALL=(ALL:ALL) NOPASSWD: ALL" in target.read_text()
        good = target.read_text()
        applier.visudo = ("false",)  # visudo now refuses everything
        await app.client.patch("/api/v1/projects/ml/members/bob", json={"role": "member"})
        for _ in range(3):
            assert await sync.run_once() == []
        assert target.read_text() == good
    kinds = [(e["kind"], e["data"]["applied"]) for e in events(applier.state_dir)]
    assert kinds == [("node.access", True), ("node.access", True), ("node.access", False)]


async def _node_token(app: RunningApp, cluster_id: str) -> str:
    """The token the provisioning loop handed the sim machine."""
    for loop in build_loops(app.ctx)[:1]:
        await loop.run_once()
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    (machine,) = provider.world.list_instances(cluster_id=cluster_id)
    token: str = machine.user_data["gpufleet_node_token"]
    return token
