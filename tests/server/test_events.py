"""The event timeline: newest first, filters, and cursor pagination."""

from __future__ import annotations

import datetime as dt
from typing import Any

from apihelpers import create_cluster, create_project, nodes_of, ready_cluster, run_loops

from gpufleet.testing.app import RunningApp

EVENTS = "/api/v1/events"


async def _all(app: RunningApp, **params: Any) -> list[dict[str, Any]]:
    """Every event matching ``params``, following cursors (asserting each page's shape)."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = await app.client.get(EVENTS, params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items


async def _timeline(app: RunningApp) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two projects' worth of events: a ready cluster ``train`` and a fresh one ``infer``."""
    await create_project(app.client, "ml")
    train = await ready_cluster(app, name="train", size=2)
    infer = await create_cluster(app.client, name="infer", size=1)
    await run_loops(app)
    return train, infer


def _ts(event: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(event["ts"])


async def test_newest_first_and_complete(app: RunningApp) -> None:
    train, infer = await _timeline(app)
    events = (await app.client.get(EVENTS, params={"limit": 1000})).json()
    items = events["items"]
    assert events["next_cursor"] is None
    ids = [e["id"] for e in items]
    assert ids == sorted(ids, reverse=True)
    assert len(set(ids)) == len(ids)
    assert items[-1]["kind"] == "project.created"
    kinds = {e["kind"] for e in items}
    assert {"project.created", "cluster.created", "node.created", "node.state"} <= kinds
    assert {e["cluster_id"] for e in items} == {None, train["id"], infer["id"]}


async def test_cursor_pagination_covers_everything_once(app: RunningApp) -> None:
    await _timeline(app)
    everything = (await app.client.get(EVENTS, params={"limit": 1000})).json()["items"]
    assert len(everything) > 5
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await app.client.get(EVENTS, params=params)).json()
        pages.append([e["id"] for e in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert cursor == page["items"][-1]["id"]
    assert all(len(p) == 2 for p in pages[:-1])
    assert 1 <= len(pages[-1]) <= 2
    flat = [i for p in pages for i in p]
    assert len(flat) == len(set(flat))
    assert flat == [e["id"] for e in everything]


async def test_exact_multiple_of_limit_ends_without_an_empty_page(app: RunningApp) -> None:
    await create_project(app.client, "a")
    await create_project(app.client, "b")
    first = (await app.client.get(EVENTS, params={"limit": 2})).json()
    assert len(first["items"]) == 2
    assert first["next_cursor"] is None


async def test_filter_by_cluster(app: RunningApp) -> None:
    train, infer = await _timeline(app)
    for cluster in (train, infer):
        items = await _all(app, cluster=cluster["id"], limit=3)
        assert items
        assert {e["cluster_id"] for e in items} == {cluster["id"]}
    assert [e["kind"] for e in await _all(app, cluster=infer["id"])][-1] == "cluster.created"


async def test_filter_by_node(app: RunningApp) -> None:
    train, _infer = await _timeline(app)
    node = (await nodes_of(app, train["id"]))[0]
    items = await _all(app, node=node["id"], limit=1)
    assert [e["kind"] for e in items] == ["node.state", "node.created"]
    assert {e["node_id"] for e in items} == {node["id"]}
    assert items[0]["data"] == {
        "from": "provisioning",
        "to": "in_service",
        "reason": items[0]["data"]["reason"],
    }


async def test_filter_by_kinds(app: RunningApp) -> None:
    train, infer = await _timeline(app)
    created = await _all(app, kind="cluster.created")
    assert [e["cluster_id"] for e in created] == [infer["id"], train["id"]]
    both = await _all(app, kind=["cluster.created", "project.created"], limit=1)
    assert [e["kind"] for e in both] == ["cluster.created", "cluster.created", "project.created"]
    combined = await _all(app, kind="node.created", cluster=train["id"])
    assert len(combined) == 2
    assert await _all(app, kind="finding.opened") == []


async def test_filter_by_since_and_until(app: RunningApp) -> None:
    await _timeline(app)
    everything = await _all(app, limit=1000)
    middle = _ts(everything[len(everything) // 2])
    after = [e["id"] for e in everything if _ts(e) >= middle]
    before = [e["id"] for e in everything if _ts(e) < middle]
    assert after
    assert before
    assert [e["id"] for e in await _all(app, since=middle.isoformat(), limit=2)] == after
    assert [e["id"] for e in await _all(app, until=middle.isoformat(), limit=2)] == before
    # The same instant written in another timezone selects the same events.
    plus2 = middle.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()
    assert [e["id"] for e in await _all(app, since=plus2)] == after
    zulu = middle.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert [e["id"] for e in await _all(app, until=zulu)] == before
    window = await _all(
        app, since=_ts(everything[-1]).isoformat(), until=middle.isoformat(), limit=2
    )
    assert [e["id"] for e in window] == before
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    assert await _all(app, since=future) == []


async def test_project_filter(app: RunningApp) -> None:
    train, _infer = await _timeline(app)
    await create_project(app.client, "other")
    ml = await _all(app, project="ml")
    other = await _all(app, project="other")
    assert [e["kind"] for e in other] == ["project.created"]
    assert {e["project_id"] for e in ml} == {train["project_id"]}
    assert len(ml) + len(other) == len(await _all(app))


async def test_unknown_node_or_cluster_filter_is_404(app: RunningApp) -> None:
    missing = "01a237be-697e-7000-9bff-8b287e325098"
    for param in ("cluster", "node"):
        response = await app.client.get(EVENTS, params={param: missing})
        assert response.status_code == 404
        assert response.json()["error"]["field"] == f"{param}_id"
