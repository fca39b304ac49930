"""POST /api/v1/agent/findings: fold, open, clear, exactly once and in order."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
from apihelpers import (
    create_project,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    send_report,
)

from gpufleet.core.clock import utcnow
from gpufleet.server.db.tables import NodeRow
from gpufleet.server.services.findings import close_findings_for_repair
from gpufleet.testing.app import RunningApp

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"


def change(
    seq: int,
    *,
    state: str = "open",
    signature: str = "xid-79",
    key: str | None = None,
    severity: str = "fatal",
    count: int = 1,
    at: dt.datetime | None = None,
) -> dict[str, Any]:
    when = (at or utcnow()).isoformat()
    return {
        "seq": seq,
        "key": key or f"{signature}/{UUID0}",
        "signature_id": signature,
        "state": state,
        "severity": severity,
        "source": "kernel-log",
        "title": "GPU has fallen off the bus",
        "gpu_uuid": UUID0,
        "gpu_index": 0,
        "pci_bus_id": "0000:18:00.0",
        "evidence": "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",
        "count": count,
        "first_seen": when,
        "last_seen": when,
    }


async def post(app: RunningApp, token: str | None, *changes: dict[str, Any]) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with app.anonymous() as client:
        return await client.post(
            "/api/v1/agent/findings", json={"findings": list(changes)}, headers=headers
        )


async def one_node(app: RunningApp) -> tuple[dict[str, Any], str, dict[str, Any]]:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    node = (await nodes_of(app, cluster["id"]))[0]
    token = (await node_tokens(app, cluster["id"]))[node["name"]]
    assert (
        await send_report(app, token, report_batch(1, hostname=node["name"]))
    ).status_code == 200
    return cluster, token, node


async def findings(app: RunningApp, **params: str) -> list[dict[str, Any]]:
    response = await app.client.get("/api/v1/findings", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_open_fold_and_clear(app: RunningApp) -> None:
    cluster, token, node = await one_node(app)
    ack = await post(app, token, change(1))
    assert ack.status_code == 200, ack.text
    assert ack.json()["accepted"] == 1
    shown = (await app.client.get(f"/api/v1/nodes/{node['id']}")).json()
    assert shown["health"] == "unhealthy"
    assert next(g for g in shown["gpus"] if g["uuid"] == UUID0)["health"] == "unhealthy"

    # A repeat folds into the same finding.
    assert (await post(app, token, change(2, count=3))).json()["accepted"] == 1
    open_now = await findings(app, cluster=cluster["id"], open="true")
    assert len(open_now) == 1 and open_now[0]["count"] == 3
    assert open_now[0]["signature_id"] == "xid-79" and open_now[0]["gpu_uuid"] == UUID0

    assert (await post(app, token, change(3, state="cleared"))).json()["accepted"] == 1
    assert await findings(app, cluster=cluster["id"], open="true") == []
    cleared = await findings(app, cluster=cluster["id"], open="false")
    assert len(cleared) == 1 and cleared[0]["cleared_at"] is not None
    shown = (await app.client.get(f"/api/v1/nodes/{node['id']}")).json()
    assert shown["health"] == "healthy"

    kinds = [
        e["kind"]
        for e in (await app.client.get("/api/v1/events", params={"node": node["id"]})).json()[
            "items"
        ]
    ]
    assert "finding.opened" in kinds and "finding.cleared" in kinds


async def test_replays_apply_once_and_in_order(app: RunningApp) -> None:
    cluster, token, _node = await one_node(app)
    batch = [change(1), change(2, count=2), change(3, state="cleared")]
    first = (await post(app, token, *batch)).json()
    assert (first["accepted"], first["duplicates"], first["last_seq"]) == (3, 0, 3)
    # The same batch again (an agent that never saw the ack) changes nothing.
    again = (await post(app, token, *batch)).json()
    assert (again["accepted"], again["duplicates"]) == (0, 3)
    # Out-of-order arrival in one batch is applied in seq order: open, then clear.
    at = utcnow()
    late = (change(5, state="cleared", at=at), change(4, at=at))
    assert (await post(app, token, *late)).json()["accepted"] == 2
    assert await findings(app, cluster=cluster["id"], open="true") == []
    assert len(await findings(app, cluster=cluster["id"])) == 2


async def test_an_earlier_episodes_clear_never_ends_the_open_one(app: RunningApp) -> None:
    """An agent that lost its memory may send an old episode's clear again, with a new
    seq. It ends only an episode that began no later than the clear says: the open one,
    begun after it, stays open, and nothing is cleared before it began."""
    cluster, token, node = await one_node(app)
    t0 = utcnow() - dt.timedelta(minutes=10)
    old_open, old_clear = change(1, at=t0), change(2, state="cleared", at=t0)
    old_clear["last_seen"] = (t0 + dt.timedelta(minutes=1)).isoformat()
    again = change(3, at=t0 + dt.timedelta(minutes=5))
    assert (await post(app, token, old_open, old_clear, again)).json()["accepted"] == 3
    replayed = {**old_clear, "seq": 4}  # as a restarted agent re-sends it
    assert (await post(app, token, replayed, {**again, "seq": 5})).json()["accepted"] == 2
    rows = sorted(await findings(app, cluster=cluster["id"]), key=lambda f: f["first_seen"])
    assert [r["cleared_at"] is None for r in rows] == [False, True]
    assert dt.datetime.fromisoformat(rows[1]["first_seen"]) == t0 + dt.timedelta(minutes=5)
    events = (
        await app.client.get(
            "/api/v1/events",
            params={"node": node["id"], "kind": ["finding.opened", "finding.cleared"]},
        )
    ).json()["items"]
    assert len(events) == 3
    # Its own clear (same first_seen) still ends it.
    own = change(6, state="cleared", at=t0 + dt.timedelta(minutes=5))
    assert (await post(app, token, own)).json()["accepted"] == 1
    assert await findings(app, cluster=cluster["id"], open="true") == []


async def test_a_warning_degrades_and_a_fatal_escalates_the_same_finding(app: RunningApp) -> None:
    cluster, token, node = await one_node(app)
    key = f"thermal-slowdown/{UUID0}"
    await post(app, token, change(1, signature="thermal-slowdown", key=key, severity="warning"))
    shown = (await app.client.get(f"/api/v1/nodes/{node['id']}")).json()
    assert shown["health"] == "degraded"
    await post(app, token, change(2, signature="thermal-slowdown", key=key, severity="critical"))
    listed = await findings(app, cluster=cluster["id"], open="true")
    assert [f["severity"] for f in listed] == ["critical"]


async def test_bad_finding_input_is_refused_and_writes_nothing(app: RunningApp) -> None:
    cluster, token, _node = await one_node(app)
    assert (await post(app, None, change(1))).status_code == 401
    assert (await post(app, "gpfn_forged", change(1))).status_code == 401
    bad = change(1)
    bad["severity"] = "apocalyptic"
    response = await post(app, token, bad)
    assert response.status_code == 422 and "severity" in response.json()["error"]["field"]
    unknown = change(1)
    unknown["extra"] = 1
    assert (await post(app, token, unknown)).status_code == 422
    dup = await post(app, token, change(1), change(1, state="cleared"))
    assert dup.status_code == 409 and dup.json()["error"]["field"] == "seq"
    assert await findings(app, cluster=cluster["id"]) == []


async def test_a_finding_the_server_closed_mid_episode_opens_again_counting_what_came_after(
    app: RunningApp,
) -> None:
    """A repair closes the node's findings when it acts; the agent (even rebooted) goes
    on counting its open episode. The next sighting opens a new finding that counts only
    the lines after the close, and folds on from there; the episode's clear ends it."""
    cluster, token, node = await one_node(app)
    t0 = utcnow() - dt.timedelta(minutes=5)
    opened = change(1, signature="xid-43", severity="info", count=2, at=t0)
    assert (await post(app, token, opened)).json()["accepted"] == 1
    async with app.ctx.db.session() as session, session.begin():
        row = await session.get(NodeRow, node["id"])
        assert row is not None
        closed = await close_findings_for_repair(
            session, node=row, project_id=cluster["project_id"], actor="repair:r1",
            why="closed by repair r1", now=utcnow(),
        )  # fmt: skip
        assert len(closed) == 1
    again = {**change(2, signature="xid-43", severity="info", count=3, at=t0)}
    again["last_seen"] = utcnow().isoformat()
    assert (await post(app, token, again)).json()["accepted"] == 1
    rows = sorted(await findings(app, cluster=cluster["id"]), key=lambda f: f["cleared_at"] or "~")
    assert [(r["count"], r["cleared_at"] is None) for r in rows] == [(2, False), (1, True)]
    assert (await post(app, token, {**again, "seq": 3, "count": 5})).json()["accepted"] == 1
    [reopened] = await findings(app, cluster=cluster["id"], open="true")
    assert reopened["count"] == 3  # lines 3, 4 and 5 of the episode
    cleared = {**again, "seq": 4, "count": 5, "state": "cleared"}
    assert (await post(app, token, cleared)).json()["accepted"] == 1
    assert await findings(app, cluster=cluster["id"], open="true") == []
