"""POST /api/v1/agent/events, and the agent's outbox that feeds it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx
from apihelpers import create_project, error_of, node_tokens, nodes_of, ready_cluster

from gpufleet.agent.outbox import Outbox, queue_event
from gpufleet.agent.sender import Sender, SendStatus
from gpufleet.agent.spool import Spool
from gpufleet.client.agent import AgentClient
from gpufleet.core.agent_protocol import AgentEventKind, NodeIdentity
from gpufleet.core.ids import new_id
from gpufleet.testing.app import RunningApp


def event(kind: str = "node.daemon", **extra: Any) -> dict[str, Any]:
    return {
        "id": new_id(),
        "kind": kind,
        "message": "slurmd was dead; restarted (attempt 1)",
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "data": {"daemon": "slurmd", "attempt": 1},
        **extra,
    }


async def post(app: RunningApp, token: str | None, *events: dict[str, Any]) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with app.anonymous() as client:
        return await client.post(
            "/api/v1/agent/events", json={"events": list(events)}, headers=headers
        )


async def one_node(app: RunningApp) -> tuple[dict[str, Any], str]:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    node = (await nodes_of(app, cluster["id"]))[0]
    return node, (await node_tokens(app, cluster["id"]))[node["name"]]


async def node_events(app: RunningApp, node_id: str, kind: str) -> list[dict[str, Any]]:
    response = await app.client.get("/api/v1/events", params={"node": node_id, "kind": kind})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_events_are_stored_once_on_the_node(app: RunningApp) -> None:
    node, token = await one_node(app)
    first, second = event(), event("node.cleanup", message="killed 2 processes of job 7")
    response = await post(app, token, first, second)
    assert response.status_code == 200, response.text
    assert response.json() == {"node_id": node["id"], "accepted": 2, "duplicates": 0}
    again = await post(app, token, first, event())  # a resend after a lost answer, plus one
    assert again.json()["accepted"] == 1 and again.json()["duplicates"] == 1
    daemon = await node_events(app, node["id"], "node.daemon")
    assert len(daemon) == 2
    assert daemon[-1]["id"] == first["id"]
    assert daemon[-1]["data"] == {"daemon": "slurmd", "attempt": 1, "source": "agent"}
    assert daemon[-1]["cluster_id"] == node["cluster_id"]
    [cleanup] = await node_events(app, node["id"], "node.cleanup")
    assert cleanup["message"] == "killed 2 processes of job 7"


async def test_bad_events_are_refused_whole(app: RunningApp) -> None:
    node, token = await one_node(app)
    assert (await post(app, None, event())).status_code == 401
    assert (await post(app, "gfn_not-a-token", event())).status_code == 401
    bad_kind = await post(app, token, event(), event("cluster.created"))
    assert bad_kind.status_code == 422
    assert "kind" in str(error_of(bad_kind))
    bad_id = await post(app, token, event(id="not-a-uuid"))
    assert bad_id.status_code == 422
    same = event()
    twice = await post(app, token, same, same)
    assert twice.status_code == 409
    assert await node_events(app, node["id"], "node.daemon") == []


async def test_outbox_is_sent_and_emptied(app: RunningApp, tmp_path: Path) -> None:
    node, token = await one_node(app)
    queue_event(tmp_path, AgentEventKind.CLEANUP, "killed 1 process", {"job_id": "12"})
    queue_event(tmp_path, AgentEventKind.DAEMON, "munged restarted", {"daemon": "munge"})
    (tmp_path / "outbox" / "junk.json").write_text("{not json", encoding="utf-8")
    outbox = Outbox(tmp_path)
    assert outbox.depth() == 3
    async with app.anonymous() as http:
        client = AgentClient(base_url="http://test", node_token=token, http=http)
        sender = Sender(
            client,
            Spool(tmp_path / "state", metrics_limit_bytes=2**20),
            identity=NodeIdentity(hostname=node["name"]),
            retry_initial_s=0.1,
            retry_max_s=0.2,
            status=SendStatus(),
            outbox=outbox,
        )
        assert await sender.send_events_once() is False
    assert outbox.depth() == 0
    assert (tmp_path / "outbox" / "junk.bad").exists()
    [cleanup] = await node_events(app, node["id"], "node.cleanup")
    assert cleanup["data"] == {"job_id": "12", "source": "agent"}
    assert len(await node_events(app, node["id"], "node.daemon")) == 1
