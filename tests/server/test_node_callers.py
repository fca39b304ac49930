"""Node callers: every agent route asks ``services.node_callers`` which node calls and
whether its token still works, and gets the same answer."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from apihelpers import create_project, node_tokens, nodes_of, ready_cluster, report_batch
from sqlalchemy import update

from gpufleet.core.clock import utcnow
from gpufleet.core.enums import NodeState
from gpufleet.core.errors import Unauthorized
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import NodeRow
from gpufleet.server.services.agent_commands import claim_commands
from gpufleet.server.services.auth import hash_token
from gpufleet.server.services.node_callers import (
    REFUSED_NODE_STATES,
    NodeCaller,
    node_of_caller,
    nodes_by_token_hash,
    resolve_node_caller,
)
from gpufleet.testing.app import RunningApp

Node = tuple[dict[str, Any], str]  # the node as listed, its token


async def _nodes(app: RunningApp, size: int) -> list[Node]:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=size)
    tokens = await node_tokens(app, cluster["id"])
    listed = sorted(await nodes_of(app, cluster["id"]), key=lambda n: n["name"])
    return [(n, tokens[n["name"]]) for n in listed]


async def _set_node(app: RunningApp, node_id: str, **values: Any) -> None:
    async with app.ctx.db.transaction() as session:
        await session.execute(update(NodeRow).where(NodeRow.id == node_id).values(**values))


def _now() -> str:
    return utcnow().isoformat()


async def _call_every_agent_route(app: RunningApp, token: str) -> dict[str, httpx.Response]:
    """One well-formed request to each agent route."""
    finding = {
        "seq": 1,
        "key": "thermal/GPU-0",
        "signature_id": "thermal-slowdown",
        "state": "open",
        "severity": "warning",
        "source": "nvml",
        "count": 1,
        "first_seen": _now(),
        "last_seen": _now(),
    }
    event = {"id": new_id(), "kind": "node.daemon", "message": "slurmd restarted", "at": _now()}
    result = {
        "id": new_id(),
        "agent_boot_id": "boot-1",
        "exit_code": 0,
        "started_at": _now(),
        "finished_at": _now(),
    }
    # A command that is not the node's: 404 for a good token, 401 for a refused one.
    result_url = f"/api/v1/agent/commands/{result['id']}/result"
    async with app.with_token(token) as agent:
        return {
            "reports": await agent.post("/api/v1/agent/reports", json=report_batch(1)),
            "findings": await agent.post("/api/v1/agent/findings", json={"findings": [finding]}),
            "events": await agent.post("/api/v1/agent/events", json={"events": [event]}),
            "commands": await agent.get("/api/v1/agent/commands", params={"boot_id": "boot-1"}),
            # A command that is not the node's: 404 for a good token, 401 for a refused one.
            "result": await agent.post(result_url, json=result),
            "access": await agent.get("/api/v1/agent/access"),
        }


@pytest.mark.parametrize("state", sorted(REFUSED_NODE_STATES))
async def test_every_agent_route_refuses_a_node_on_its_way_out(app: RunningApp, state: str) -> None:
    [(node, token)] = await _nodes(app, 1)
    before = await _call_every_agent_route(app, token)
    assert {route: r.status_code for route, r in before.items()} == {
        "reports": 200,
        "findings": 200,
        "events": 200,
        "commands": 200,
        "result": 404,
        "access": 200,
    }
    await _set_node(app, node["id"], state=state)
    after = await _call_every_agent_route(app, token)
    assert {route: r.status_code for route, r in after.items()} == dict.fromkeys(after, 401)
    assert {r.json()["error"]["message"] for r in after.values()} == {
        "unknown or revoked node token"
    }


async def test_every_agent_route_refuses_a_released_machines_token(app: RunningApp) -> None:
    """Releasing a machine clears its node's token hash: the token names no node."""
    [(node, token)] = await _nodes(app, 1)
    await _set_node(app, node["id"], token_hash=None)
    after = await _call_every_agent_route(app, token)
    assert {route: r.status_code for route, r in after.items()} == dict.fromkeys(after, 401)


async def test_a_caller_is_the_node_its_token_names(app: RunningApp) -> None:
    [(node, token), _other] = await _nodes(app, 2)
    async with app.ctx.db.session() as session:
        caller = await resolve_node_caller(session, token_hash=hash_token(token))
        with pytest.raises(Unauthorized):
            await resolve_node_caller(session, token_hash=hash_token("gpfn_forged"))
    project = (await app.client.get("/api/v1/projects/ml")).json()
    assert caller == NodeCaller(
        node_id=node["id"],
        name=node["name"],
        cluster_id=node["cluster_id"],
        project_id=project["id"],
        state=NodeState(node["state"]),
        token_hash=hash_token(token),
    )
    assert hash_token(token) not in repr(caller)


@pytest.mark.parametrize(
    "change", [{"state": NodeState.REMOVING.value}, {"token_hash": hash_token("gpfn_new")}]
)
async def test_a_service_reading_the_node_again_sees_a_token_stop_working(
    app: RunningApp, change: dict[str, str]
) -> None:
    """The long poll claims again after each wake: a node removed (or reinstalled with a
    fresh token) meanwhile gets nothing more."""
    [(node, token)] = await _nodes(app, 1)
    async with app.ctx.db.session() as session:
        caller = await resolve_node_caller(session, token_hash=hash_token(token))
    async with app.ctx.db.transaction() as session:
        assert (await node_of_caller(session, caller, for_update=True)).id == node["id"]
    await _set_node(app, node["id"], **change)
    async with app.ctx.db.transaction() as session:
        with pytest.raises(Unauthorized):
            await node_of_caller(session, caller)
        with pytest.raises(Unauthorized):
            await claim_commands(
                session, caller=caller, boot_id="boot-1", have=[], max_commands=1, now=utcnow()
            )


async def test_the_ingest_resolves_many_tokens_in_one_go_and_refuses_the_same(
    app: RunningApp,
) -> None:
    [(live, live_token), (leaving, leaving_token)] = await _nodes(app, 2)
    await _set_node(app, leaving["id"], state=NodeState.REMOVING.value)
    hashes = {hash_token(t) for t in (live_token, leaving_token, "gpfn_forged")}
    async with app.ctx.db.session() as session:
        found = await nodes_by_token_hash(session, token_hashes=hashes)
    assert {h: node.id for h, (node, _project) in found.items()} == {
        hash_token(live_token): live["id"]
    }
