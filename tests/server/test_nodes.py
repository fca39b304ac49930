"""Nodes: list (filters, cursor pages, GPUs), show, and what a node row says."""

from __future__ import annotations

from typing import Any

from apihelpers import (
    create_cluster,
    create_project,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    send_report,
)

from gpufleet.testing.app import RunningApp

NODES = "/api/v1/nodes"


async def _pages(app: RunningApp, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = await app.client.get(NODES, params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append([n["id"] for n in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            return pages


async def test_new_nodes_are_listed_in_slot_order(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, name="train", size=3, gpus_per_node=4)
    nodes = await nodes_of(app, cluster["id"])
    assert [n["name"] for n in nodes] == ["train-000", "train-001", "train-002"]
    for node in nodes:
        assert node["cluster_id"] == cluster["id"]
        assert (node["state"], node["health"]) == ("provisioning", "unknown")
        assert node["expected_gpus"] == 4
        assert node["last_report_at"] is None
        assert node["last_report_seq"] == 0
        assert node["hostname"] is None
        assert node["gpus"] is None


async def test_cursor_pages_cover_every_node_once(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    a = await create_cluster(app.client, name="a", size=3)
    b = await create_cluster(app.client, name="b", size=2)
    pages = await _pages(app, limit=2)
    assert [len(p) for p in pages] == [2, 2, 1]
    flat = [i for p in pages for i in p]
    assert len(set(flat)) == 5
    assert flat == sorted(flat)
    assert set(flat) == {n["id"] for c in (a, b) for n in await nodes_of(app, c["id"])}
    assert [len(p) for p in await _pages(app, limit=1, cluster=b["id"])] == [1, 1]
    assert await _pages(app, limit=5) == [flat]


async def test_filters_by_state_and_health(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    ready = await ready_cluster(app, name="ready", size=2)
    fresh = await create_cluster(app.client, name="fresh", size=2)
    tokens = await node_tokens(app, ready["id"])
    ready_nodes = await nodes_of(app, ready["id"])
    await send_report(app, tokens[ready_nodes[0]["name"]], report_batch(1))

    async def ids(**params: str) -> set[str]:
        response = await app.client.get(NODES, params=params)
        assert response.status_code == 200, response.text
        return {n["id"] for n in response.json()["items"]}

    fresh_ids = {n["id"] for n in await nodes_of(app, fresh["id"])}
    assert await ids(state="provisioning") == fresh_ids
    assert await ids(state="in_service") == {n["id"] for n in ready_nodes}
    assert await ids(health="healthy") == {ready_nodes[0]["id"]}
    assert await ids(health="unknown") == fresh_ids | {ready_nodes[1]["id"]}
    assert await ids(health="unhealthy") == set()
    assert await ids(state="in_service", health="unknown") == {ready_nodes[1]["id"]}
    assert await ids(state="removed") == set()
    # Health is filtered after staleness is applied, and still pages.
    pages = await _pages(app, health="unknown", limit=1)
    assert [len(p) for p in pages] == [1, 1, 1]
    assert {i for p in pages for i in p} == fresh_ids | {ready_nodes[1]["id"]}


async def test_show_node_includes_gpus(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=1, gpus=2)
    node = (await nodes_of(app, cluster["id"]))[0]
    shown = (await app.client.get(f"{NODES}/{node['id']}")).json()
    assert shown["gpus"] == []
    token = (await node_tokens(app, cluster["id"]))[node["name"]]
    await send_report(app, token, report_batch(1, gpus=2))
    shown = (await app.client.get(f"{NODES}/{node['id']}")).json()
    assert [g["index"] for g in shown["gpus"]] == [0, 1]
    assert {g["node_id"] for g in shown["gpus"]} == {node["id"]}
    assert shown["health"] == "healthy"
    assert shown["last_report_seq"] == 1
    assert {k: shown[k] for k in ("id", "name", "cluster_id", "rack")} == {
        k: node[k] for k in ("id", "name", "cluster_id", "rack")
    }
