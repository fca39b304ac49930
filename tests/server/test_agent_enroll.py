"""The agent's side of enrollment (``agent/enroll.py``) against the real server: it waits
while no node has claimed its host, keeps the node token it gets in a 0600 file that
every later start reads (no second enrollment), and stops at once on a refusal an
operator must fix."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import httpx
import pytest
from apihelpers import create_project
from inventoryhelpers import import_hosts, keyed_app, put_credential
from sqlalchemy import select

from gpufleet.agent.enroll import EnrollmentRefused, obtain_node_token
from gpufleet.agent.settings import AgentSettings
from gpufleet.server.db.tables import EventRow, HostRow, NodeRow
from gpufleet.server.services.enrollment import open_enrollment
from gpufleet.testing.app import RunningApp

URL = "http://gpufleet.test"


def _settings(state_dir: Path, token: str) -> AgentSettings:
    return AgentSettings(
        server_url=URL,
        enroll_token=token,
        hostname="gpu-a",
        state_dir=state_dir,
        retry_initial_s=0.01,
        retry_max_s=0.05,
    )


async def _metal(app: RunningApp) -> tuple[str, str]:
    """An ipmi cluster of one node and its host; returns (cluster id, enroll token)."""
    await create_project(app.client, "ml")
    assert (await put_credential(app.client, "bmc", secret="Bmc-pw-1")).status_code == 200
    created = await app.client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "metal", "size": 1, "provider": "ipmi",
              "acceptance_tests": False},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    row = {"hostname": "gpu-a", "bmc_type": "ipmi", "bmc_address": "10.0.0.1",
           "credential": "bmc", "cluster": "metal"}  # fmt: skip
    assert (await import_hosts(app.client, [row])).status_code == 200
    cid = str(created.json()["id"])
    issued = await app.client.post(f"/api/v1/clusters/{cid}/enroll-token", json={})
    assert issued.status_code == 201, issued.text
    return cid, str(issued.json()["token"])


async def _claim(app: RunningApp, cluster_id: str) -> None:
    """What provisioning does when the ipmi driver claimed the host (tested end to end in
    test_bare_metal_cluster.py): the node runs on it and waits for its agent."""
    async with app.ctx.db.transaction() as session:
        host = await session.scalar(select(HostRow).where(HostRow.hostname == "gpu-a"))
        node = await session.scalar(select(NodeRow).where(NodeRow.cluster_id == cluster_id))
        assert host is not None and node is not None
        node.provider_instance_id = host.id
        open_enrollment(node, now=app.ctx.clock.now())


async def test_the_agent_waits_to_enroll_then_keeps_its_node_token(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        keyed_app(database_url, tmp_path) as app,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app)) as http,
    ):
        cid, token = await _metal(app)
        settings = _settings(tmp_path / "agent", token)
        stop = asyncio.Event()
        waiting = asyncio.create_task(obtain_node_token(settings, stop=stop, http=http))
        await asyncio.sleep(0.2)  # real time: the agent retries every 10-50 ms
        assert not waiting.done()  # no node has claimed gpu-a: it keeps trying
        await _claim(app, cid)
        node_token = await asyncio.wait_for(waiting, timeout=10)
        assert node_token is not None and node_token.startswith("gpfn_")

        kept = tmp_path / "agent" / "node-token"
        assert kept.read_text().strip() == node_token
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        report = await http.post(
            f"{URL}/api/v1/agent/findings", json={"changes": []},
            headers={"Authorization": f"Bearer {node_token}"},
        )  # fmt: skip
        assert report.status_code != 401, report.text

        # A restart (a reboot) reads the file: no second enrollment.
        assert await obtain_node_token(settings, stop=stop, http=http) == node_token
        async with app.ctx.db.session() as session:
            kinds = list(await session.scalars(select(EventRow.kind)))
        assert kinds.count("node.enrolled") == 1


async def test_a_refused_enrollment_stops_the_agent_and_writes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        keyed_app(database_url, tmp_path) as app,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app)) as http,
    ):
        cid, token = await _metal(app)
        await _claim(app, cid)
        wrong = _settings(tmp_path / "a", "gpfe_" + "q" * 43)
        with pytest.raises(EnrollmentRefused, match="refused") as refused:
            await obtain_node_token(wrong, stop=asyncio.Event(), http=http)
        assert "q" * 20 not in str(refused.value)
        assert not (tmp_path / "a" / "node-token").exists()
        elsewhere = _settings(tmp_path / "b", token).model_copy(update={"hostname": "gpu-z"})
        with pytest.raises(EnrollmentRefused, match="gpu-z"):
            await obtain_node_token(elsewhere, stop=asyncio.Event(), http=http)
        # Stopped while waiting: no token, no file.
        stopped = asyncio.Event()
        stopped.set()
        assert await obtain_node_token(_settings(tmp_path / "c", token), stop=stopped) is None
        assert not (tmp_path / "c" / "node-token").exists()
