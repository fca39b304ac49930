"""Bad input: a 4xx that names what was wrong, and nothing written (STYLE §15).

Each test snapshots the row counts of project, cluster, node, gpu, event, audit_log and
api_token, sends one bad request, and checks the counts did not move, except for the one
audit row a refused mutation leaves (requests refused before the caller is known, like
malformed JSON or a body too large, leave none).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from apihelpers import (
    assert_only_refusal_written,
    count_rows,
    create_cluster,
    create_project,
    error_of,
)

from gpufleet.testing.app import RunningApp

CLUSTERS = "/api/v1/clusters"


def cluster_body(**extra: Any) -> dict[str, Any]:
    return {"project": "ml", "name": "new", "size": 2, **extra}


@pytest.fixture
async def seeded(app: RunningApp) -> RunningApp:
    """One project ``ml`` with one cluster ``train``: the things duplicates clash with."""
    await create_project(app.client, "ml")
    await create_cluster(app.client, project="ml", name="train", size=2)
    return app


async def rejected(
    app: RunningApp, method: str, url: str, *, status: int, field: str | None, **kwargs: Any
) -> dict[str, Any]:
    """Send one request; assert its status, its error field, and that nothing was written."""
    before = await count_rows(app)
    response = await app.client.request(method, url, **kwargs)
    assert response.status_code == status, response.text
    error = error_of(response)
    if field is not None:
        assert error["field"] == field, error
    assert error["message"], error
    audited = method != "GET" and status not in (400, 413)
    await assert_only_refusal_written(app, before, response, audited=audited)
    return error


async def test_malformed_json_is_400(seeded: RunningApp) -> None:
    error = await rejected(
        seeded,
        "POST",
        CLUSTERS,
        status=400,
        field="body",
        content=b'{"project": "ml", "name": ',
        headers={"Content-Type": "application/json"},
    )
    assert error["code"] == "invalid_json"
    assert "JSON" in error["message"]


async def test_unknown_field_is_named(seeded: RunningApp) -> None:
    error = await rejected(
        seeded, "POST", CLUSTERS, status=422, field="colour", json=cluster_body(colour="red")
    )
    assert "colour" in error["message"]
    assert "unknown field" in error["message"]


async def test_unknown_field_on_project(seeded: RunningApp) -> None:
    await rejected(
        seeded,
        "POST",
        "/api/v1/projects",
        status=422,
        field="owner",
        json={"name": "other", "owner": "me"},
    )


async def test_size_of_wrong_type(seeded: RunningApp) -> None:
    error = await rejected(
        seeded, "POST", CLUSTERS, status=422, field="size", json=cluster_body(size="big")
    )
    assert "integer" in error["message"]


async def test_missing_size_is_named(seeded: RunningApp) -> None:
    body = cluster_body()
    del body["size"]
    error = await rejected(seeded, "POST", CLUSTERS, status=422, field="size", json=body)
    assert "required" in error["message"]


async def test_gpus_per_node_boolean_is_rejected(seeded: RunningApp) -> None:
    await rejected(
        seeded,
        "POST",
        CLUSTERS,
        status=422,
        field="gpus_per_node",
        json=cluster_body(gpus_per_node=True),
    )


async def test_labels_of_wrong_type(seeded: RunningApp) -> None:
    await rejected(
        seeded, "POST", CLUSTERS, status=422, field="labels", json=cluster_body(labels=["a"])
    )


@pytest.mark.parametrize("size", [0, -1])
async def test_size_below_one(seeded: RunningApp, size: int) -> None:
    error = await rejected(
        seeded, "POST", CLUSTERS, status=422, field="size", json=cluster_body(size=size)
    )
    assert "greater than or equal to 1" in error["message"]


async def test_huge_size(seeded: RunningApp) -> None:
    error = await rejected(
        seeded, "POST", CLUSTERS, status=422, field="size", json=cluster_body(size=4097)
    )
    assert "4096" in error["message"]


async def test_huge_gpus_per_node(seeded: RunningApp) -> None:
    error = await rejected(
        seeded,
        "POST",
        CLUSTERS,
        status=422,
        field="gpus_per_node",
        json=cluster_body(gpus_per_node=65),
    )
    assert "64" in error["message"]


@pytest.mark.parametrize("name", ["Train", "train_a", "-train", "train-", "", "a" * 64])
async def test_bad_cluster_name(seeded: RunningApp, name: str) -> None:
    await rejected(seeded, "POST", CLUSTERS, status=422, field="name", json=cluster_body(name=name))


async def test_bad_project_name(seeded: RunningApp) -> None:
    await rejected(
        seeded, "POST", "/api/v1/projects", status=422, field="name", json={"name": "My Project"}
    )


async def test_unknown_gpu_model(seeded: RunningApp) -> None:
    error = await rejected(
        seeded,
        "POST",
        CLUSTERS,
        status=422,
        field="gpu_model",
        json=cluster_body(gpu_model="NVIDIA GeForce 256"),
    )
    assert "NVIDIA GeForce 256" in error["message"]
    assert "NVIDIA H100 80GB HBM3" in error["message"]  # says what is accepted


async def test_unknown_provider_kind(seeded: RunningApp) -> None:
    await rejected(
        seeded, "POST", CLUSTERS, status=422, field="provider", json=cluster_body(provider="gcp")
    )


async def test_autoscale_bounds_inverted(seeded: RunningApp) -> None:
    await rejected(
        seeded,
        "POST",
        CLUSTERS,
        status=422,
        field="autoscale_min",
        json=cluster_body(autoscale_min=4, autoscale_max=2),
    )


async def test_duplicate_project_name(seeded: RunningApp) -> None:
    error = await rejected(
        seeded, "POST", "/api/v1/projects", status=409, field="name", json={"name": "ml"}
    )
    assert error["code"] == "conflict"
    assert "ml" in error["message"]


async def test_duplicate_cluster_name_in_project(seeded: RunningApp) -> None:
    error = await rejected(
        seeded, "POST", CLUSTERS, status=409, field="name", json=cluster_body(name="train")
    )
    assert "train" in error["message"]


async def test_same_cluster_name_in_another_project_is_fine(seeded: RunningApp) -> None:
    await create_project(seeded.client, "other")
    await create_cluster(seeded.client, project="other", name="train", size=1)


@pytest.mark.parametrize(("method", "suffix"), [("GET", ""), ("DELETE", ""), ("GET", "/status")])
async def test_unknown_cluster_id(seeded: RunningApp, method: str, suffix: str) -> None:
    await rejected(
        seeded, method, f"{CLUSTERS}/{uuid.uuid4()}{suffix}", status=404, field="cluster_id"
    )


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_non_uuid_cluster_id(seeded: RunningApp, method: str) -> None:
    error = await rejected(seeded, method, f"{CLUSTERS}/not-an-id", status=404, field="cluster_id")
    assert error["code"] == "not_found"


@pytest.mark.parametrize("node_id", ["5f0c7a2e-3d1b-4c8e-9a6f-2b7d4e1c9a30", "node-1"])
async def test_unknown_node_id(seeded: RunningApp, node_id: str) -> None:
    await rejected(seeded, "GET", f"/api/v1/nodes/{node_id}", status=404, field="node_id")


async def test_unknown_project_ref_in_create_cluster(seeded: RunningApp) -> None:
    error = await rejected(
        seeded, "POST", CLUSTERS, status=404, field="project", json=cluster_body(project="nope")
    )
    assert "nope" in error["message"]


async def test_unknown_project_filter(seeded: RunningApp) -> None:
    await rejected(seeded, "GET", CLUSTERS, status=404, field="project", params={"project": "nope"})


async def test_oversized_body_is_413(seeded: RunningApp) -> None:
    limit = seeded.ctx.settings.max_body_bytes
    body = cluster_body(labels={"pad": "x"}, startup_scripts=["#" * (limit + 1)])
    error = await rejected(seeded, "POST", CLUSTERS, status=413, field="body", json=body)
    assert error["code"] == "too_large"
    assert str(limit) in error["message"]


async def test_oversized_streamed_body_is_413(seeded: RunningApp) -> None:
    limit = seeded.ctx.settings.max_body_bytes

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"project": "ml", "name": "new", "size": 2, "startup_scripts": ["'
        for _ in range(limit // 65536 + 2):
            yield b"#" * 65536
        yield b'"]}'

    await rejected(
        seeded,
        "POST",
        CLUSTERS,
        status=413,
        field="body",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/events", "/api/v1/findings"])
@pytest.mark.parametrize("limit", ["0", "5000", "ten"])
async def test_bad_limit(seeded: RunningApp, path: str, limit: str) -> None:
    error = await rejected(seeded, "GET", path, status=422, field="limit", params={"limit": limit})
    assert "limit" in error["message"]


@pytest.mark.parametrize(("path", "param"), [("/api/v1/nodes", "state"), (CLUSTERS, "status")])
async def test_bad_enum_filter(seeded: RunningApp, path: str, param: str) -> None:
    error = await rejected(seeded, "GET", path, status=422, field=param, params={param: "bogus"})
    assert (
        "bogus" in error["message"]
        or "in_service" in error["message"]
        or "ready" in (error["message"])
    )


async def test_bad_event_kind(seeded: RunningApp) -> None:
    await rejected(
        seeded, "GET", "/api/v1/events", status=422, field="kind.0", params={"kind": "bogus"}
    )


@pytest.mark.parametrize("param", ["since", "until"])
async def test_naive_datetime(seeded: RunningApp, param: str) -> None:
    error = await rejected(
        seeded,
        "GET",
        "/api/v1/events",
        status=422,
        field=param,
        params={param: "2026-01-01T00:00:00"},
    )
    assert "timezone" in error["message"]


async def test_unparseable_datetime(seeded: RunningApp) -> None:
    await rejected(
        seeded, "GET", "/api/v1/events", status=422, field="since", params={"since": "yesterday"}
    )


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/events"])
async def test_bad_cursor(seeded: RunningApp, path: str) -> None:
    error = await rejected(
        seeded, "GET", path, status=422, field="cursor", params={"cursor": "not-a-cursor"}
    )
    assert "cursor" in error["message"]


async def test_overlong_query_value(seeded: RunningApp) -> None:
    await rejected(
        seeded, "GET", "/api/v1/nodes", status=422, field="cluster", params={"cluster": "x" * 37}
    )


async def test_unknown_cluster_filter_is_404(seeded: RunningApp) -> None:
    await rejected(
        seeded,
        "GET",
        "/api/v1/nodes",
        status=404,
        field="cluster_id",
        params={"cluster": str(uuid.uuid4())},
    )


async def test_token_with_bad_expiry(seeded: RunningApp) -> None:
    await rejected(
        seeded,
        "POST",
        "/api/v1/tokens",
        status=422,
        field="expires_in_days",
        json={"project": "ml", "expires_in_days": 0},
    )


async def test_token_for_unknown_project(seeded: RunningApp) -> None:
    await rejected(
        seeded, "POST", "/api/v1/tokens", status=404, field="project", json={"project": "nope"}
    )
