"""Agent reports: node-token auth, idempotent seqs, telemetry, health, GPU swaps."""

from __future__ import annotations

from typing import Any

import pytest
from apihelpers import (
    count_rows,
    create_project,
    error_of,
    gpu_sample,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    run_loops,
    send_report,
)
from sqlalchemy import select

from gpufleet.server.db.tables import EventRow
from gpufleet.testing.app import RunningApp


@pytest.fixture
async def fleet(app: RunningApp) -> tuple[RunningApp, dict[str, Any], dict[str, str]]:
    """A ready 2-node cluster of 8 GPUs each, and node id → node token."""
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=2, gpus=8)
    by_name = await node_tokens(app, cluster["id"])
    tokens = {n["id"]: by_name[n["name"]] for n in await nodes_of(app, cluster["id"])}
    assert len(tokens) == 2
    return app, cluster, tokens


Fleet = tuple[RunningApp, dict[str, Any], dict[str, str]]


async def _node(app: RunningApp, node_id: str) -> dict[str, Any]:
    response = await app.client.get(f"/api/v1/nodes/{node_id}")
    assert response.status_code == 200, response.text
    node: dict[str, Any] = response.json()
    return node


async def test_ack_counts_accepted_then_duplicates(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    node_id, token = next(iter(tokens.items()))
    first = await send_report(app, token, report_batch(1, 2, 3))
    assert first.status_code == 200, first.text
    ack = first.json()
    assert (ack["node_id"], ack["accepted"], ack["duplicates"], ack["last_seq"]) == (
        node_id,
        3,
        0,
        3,
    )
    assert ack["report_interval_s"] == app.ctx.settings.report_interval_s

    resent = (await send_report(app, token, report_batch(1, 2, 3))).json()
    assert (resent["accepted"], resent["duplicates"], resent["last_seq"]) == (0, 3, 3)

    older = (await send_report(app, token, report_batch(2, gpus=1))).json()
    assert (older["accepted"], older["duplicates"], older["last_seq"]) == (0, 1, 3)
    node = await _node(app, node_id)
    assert node["last_report_seq"] == 3
    assert node["health"] == "healthy"  # the stale 1-GPU report changed nothing
    assert len(node["gpus"]) == 8

    mixed = (await send_report(app, token, report_batch(3, 4))).json()
    assert (mixed["accepted"], mixed["duplicates"], mixed["last_seq"]) == (1, 1, 4)


async def test_telemetry_and_identity_visible_on_node(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    node_id, token = next(iter(tokens.items()))
    samples = [gpu_sample(i, ecc_sbe_volatile=i) for i in range(8)]
    response = await send_report(
        app, token, report_batch(1, gpu_list=samples, hostname="gpu-host-a")
    )
    assert response.status_code == 200, response.text
    node = await _node(app, node_id)
    assert node["hostname"] == "gpu-host-a"
    assert node["serial"] == "SER-1"
    assert node["health"] == "healthy"
    assert node["last_report_at"] is not None
    gpus = node["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    for i, gpu in enumerate(gpus):
        expected = samples[i]
        assert gpu["uuid"] == expected["uuid"]
        assert gpu["serial"] == expected["serial"]
        assert gpu["model"] == expected["model"]
        assert gpu["health"] == "healthy"
        assert gpu["utilization_pct"] == expected["utilization_pct"]
        assert gpu["temperature_c"] == expected["temperature_c"]
        assert gpu["memory_total_mib"] == expected["memory_total_mib"]
        assert gpu["ecc_sbe_volatile"] == i
        assert gpu["sampled_at"] is not None
    listed = await app.client.get("/api/v1/nodes", params={"gpus": "true"})
    by_id = {n["id"]: n for n in listed.json()["items"]}
    assert len(by_id[node_id]["gpus"]) == 8
    other = next(i for i in tokens if i != node_id)
    assert by_id[other]["gpus"] == []
    without = await app.client.get("/api/v1/nodes")
    assert all(n["gpus"] is None for n in without.json()["items"])


async def test_latest_report_wins_within_a_batch(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    node_id, token = next(iter(tokens.items()))
    batch = report_batch(5, 6)
    batch["reports"][1]["gpus"] = [gpu_sample(i, utilization_pct=99.0) for i in range(8)]
    batch["reports"].reverse()  # out of order on the wire; seq decides
    assert (await send_report(app, token, batch)).json()["last_seq"] == 6
    node = await _node(app, node_id)
    assert {g["utilization_pct"] for g in node["gpus"]} == {99.0}


async def test_fewer_gpus_than_expected_is_unhealthy(fleet: Fleet) -> None:
    app, cluster, tokens = fleet
    (a, token_a), (b, token_b) = tokens.items()
    await send_report(app, token_a, report_batch(1))
    await send_report(app, token_b, report_batch(1, gpus=7))
    assert (await _node(app, a))["health"] == "healthy"
    assert (await _node(app, b))["health"] == "unhealthy"
    async with app.ctx.db.session() as session:
        event = await session.scalar(
            select(EventRow).where(EventRow.node_id == b, EventRow.kind == "node.health")
        )
    assert event is not None
    assert "7 of 8 GPUs" in event.message
    await run_loops(app)
    status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
    assert status["nodes"]["by_health"] == {"healthy": 1, "unhealthy": 1}
    assert status["health"] == "unhealthy"  # half the nodes are bad
    # The GPU comes back: the node recovers on the next report.
    await send_report(app, token_b, report_batch(2))
    assert (await _node(app, b))["health"] == "healthy"
    await run_loops(app)
    assert (await app.client.get(f"/api/v1/clusters/{cluster['id']}")).json()["health"] == (
        "healthy"
    )


async def test_swapped_gpu_replaces_the_old_one(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    node_id, token = next(iter(tokens.items()))
    await send_report(app, token, report_batch(1))
    old_uuid = gpu_sample(3)["uuid"]
    new_uuid = "GPU-ffffffff-0000-0000-0000-000000000003"
    samples = [gpu_sample(i, uuid=new_uuid if i == 3 else None) for i in range(8)]
    await send_report(app, token, report_batch(2, gpu_list=samples))
    node = await _node(app, node_id)
    uuids = [g["uuid"] for g in node["gpus"]]
    assert len(uuids) == 8
    assert new_uuid in uuids
    assert old_uuid not in uuids
    assert node["gpus"][3]["uuid"] == new_uuid
    events = await app.client.get(
        "/api/v1/events", params={"node": node_id, "kind": "node.gpus_changed"}
    )
    items = events.json()["items"]
    assert len(items) == 1
    assert items[0]["data"] == {"index": 3, "old_uuid": old_uuid, "new_uuid": new_uuid}
    summary = (await app.client.get("/api/v1/health/summary")).json()
    assert summary["gpus"] == 8


async def test_two_nodes_report_independently(fleet: Fleet) -> None:
    app, cluster, tokens = fleet
    for token in tokens.values():
        assert (await send_report(app, token, report_batch(1))).json()["accepted"] == 1
    shown = (await app.client.get(f"/api/v1/clusters/{cluster['id']}")).json()
    assert shown["nodes"]["gpus"] == 16
    assert shown["nodes"]["by_health"] == {"healthy": 2}


async def _rejected_report(
    app: RunningApp, token: str | None, batch: dict[str, Any], *, status: int
) -> dict[str, Any]:
    before = await count_rows(app)
    response = await send_report(app, token, batch)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert await count_rows(app) == before
    return error


@pytest.mark.parametrize("token", [None, "gpfn_not-a-real-token", "Basic abc"])
async def test_missing_or_unknown_node_token_is_401(fleet: Fleet, token: str | None) -> None:
    app, _cluster, _tokens = fleet
    error = await _rejected_report(app, token, report_batch(1), status=401)
    assert error["code"] == "unauthorized"


async def test_api_token_is_not_a_node_token(fleet: Fleet) -> None:
    app, _cluster, _tokens = fleet
    error = await _rejected_report(app, app.owner_token, report_batch(1), status=401)
    assert "node token" in error["message"]


async def test_node_token_is_not_an_api_token(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    async with app.with_token(next(iter(tokens.values()))) as node_client:
        response = await node_client.get("/api/v1/clusters")
    assert response.status_code == 401


async def test_deleted_cluster_tokens_stop_working(fleet: Fleet) -> None:
    app, cluster, tokens = fleet
    await app.client.delete(f"/api/v1/clusters/{cluster['id']}")
    await run_loops(app)
    await _rejected_report(app, next(iter(tokens.values())), report_batch(1), status=401)


async def test_too_many_gpus_is_422(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    error = await _rejected_report(
        app, next(iter(tokens.values())), report_batch(1, gpus=65), status=422
    )
    assert error["field"] == "reports.0.gpus"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("utilization_pct", -1.0),
        ("power_w", -5.0),
        ("ecc_dbe_volatile", -1),
        ("index", -1),
        ("utilization_pct", 101.0),
    ],
)
async def test_out_of_range_gpu_value_is_422(fleet: Fleet, key: str, value: float) -> None:
    app, _cluster, tokens = fleet
    samples = [gpu_sample(i) for i in range(8)]
    samples[2][key] = value
    error = await _rejected_report(
        app, next(iter(tokens.values())), report_batch(1, gpu_list=samples), status=422
    )
    assert error["field"] == f"reports.0.gpus.2.{key}"


@pytest.mark.parametrize("batch", [{"reports": []}, {"reports": [{"seq": 0}]}])
async def test_malformed_batch_is_422(fleet: Fleet, batch: dict[str, Any]) -> None:
    app, _cluster, tokens = fleet
    error = await _rejected_report(app, next(iter(tokens.values())), batch, status=422)
    assert error["field"].startswith("reports")


async def test_repeated_seq_in_one_batch_is_409(fleet: Fleet) -> None:
    app, _cluster, tokens = fleet
    error = await _rejected_report(app, next(iter(tokens.values())), report_batch(4, 4), status=409)
    assert error["field"] == "seq"
