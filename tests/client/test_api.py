"""ApiClient against an httpx.MockTransport serving the server's response shapes."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gpufleet.client.api import ApiClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.enums import ClusterStatus, Health, NodeState, Role

URL = "http://gpufleet.test"
T0 = "2026-01-01T00:00:00Z"
CLUSTER_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
PROJECT_ID = "0190a1b2-c3d4-7e5f-8a9b-000000000001"


def cluster(cid: str = CLUSTER_ID, name: str = "train-a", **extra: Any) -> dict[str, Any]:
    return {
        "id": cid,
        "project_id": PROJECT_ID,
        "name": name,
        "scheduler": "sim",
        "provider": "sim",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpus_per_node": 8,
        "size": 2,
        "status": "ready",
        "health": "healthy",
        "acceptance_tests": True,
        "startup_scripts": [],
        "autoscale_min": None,
        "autoscale_max": None,
        "labels": {"team": "ml"},
        "created_at": T0,
        "updated_at": T0,
        **extra,
    }


def node(i: int) -> dict[str, Any]:
    return {
        "id": f"0190a1b2-c3d4-7e5f-8a9b-{i:012d}",
        "cluster_id": CLUSTER_ID,
        "name": f"node-{i}",
        "hostname": None,
        "scheduler_name": None,
        "serial": None,
        "provider_instance_id": None,
        "state": "in_service",
        "health": "unknown",
        "rack": None,
        "leaf_switch": None,
        "pdu": None,
        "expected_gpus": 8,
        "last_report_at": None,
        "last_report_seq": 0,
        "created_at": T0,
        "updated_at": T0,
    }


Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def calls() -> list[httpx.Request]:
    return []


@pytest.fixture
def make(calls: list[httpx.Request]) -> Iterator[Callable[[Handler], ApiClient]]:
    clients: list[ApiClient] = []

    def build(handler: Handler) -> ApiClient:
        def record(request: httpx.Request) -> httpx.Response:
            calls.append(request)
            return handler(request)

        c = ApiClient(base_url=URL + "/", token="tok-1", transport=httpx.MockTransport(record))
        clients.append(c)
        return c

    yield build
    for c in clients:
        c.close()


def test_me_sends_bearer_token_and_parses(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    body = {
        "user": {
            "id": "u1",
            "name": "ada",
            "email": None,
            "is_owner": True,
            "created_at": T0,
        },
        "memberships": [{"project_id": PROJECT_ID, "user_id": "u1", "role": "admin"}],
        "token": {"id": "t1", "project_id": None, "role": None},
    }
    me = make(lambda _: httpx.Response(200, json=body)).me()
    assert me.user.name == "ada"
    assert me.memberships[0].role is Role.ADMIN
    assert me.token.id == "t1" and me.token.project_id is None
    assert calls[0].url.path == "/api/v1/me"
    assert calls[0].headers["Authorization"] == "Bearer tok-1"


def test_list_clusters_sends_filters_and_parses_page(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    client = make(lambda _: httpx.Response(200, json={"items": [cluster()], "next_cursor": "c2"}))
    page = client.list_clusters(project="ml", status=ClusterStatus.READY, limit=10)
    assert page.next_cursor == "c2"
    assert page.items[0].labels == {"team": "ml"}
    assert dict(calls[0].url.params) == {"project": "ml", "status": "ready", "limit": "10"}


def test_find_cluster_by_id_gets_it_directly(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    counts = {"total": 2, "by_state": {"in_service": 2}, "by_health": {"healthy": 2}, "gpus": 16}
    client = make(lambda _: httpx.Response(200, json=cluster(nodes=counts)))
    found = client.find_cluster(CLUSTER_ID)
    assert found.nodes is not None and found.nodes.gpus == 16
    assert calls[0].url.path == f"/api/v1/clusters/{CLUSTER_ID}"


def test_find_cluster_by_name(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    client = make(lambda _: httpx.Response(200, json={"items": [cluster()], "next_cursor": None}))
    assert client.find_cluster("train-a", project="ml").id == CLUSTER_ID
    assert calls[0].url.params["name"] == "train-a"
    assert calls[0].url.params["project"] == "ml"


def test_find_cluster_none_or_ambiguous_raise(make: Callable[[Handler], ApiClient]) -> None:
    empty = make(lambda _: httpx.Response(200, json={"items": [], "next_cursor": None}))
    with pytest.raises(ApiError) as none:
        empty.find_cluster("nope")
    assert none.value.status == 404 and "nope" in none.value.message

    two = {"items": [cluster(), cluster(cid=CLUSTER_ID[:-1] + "c")], "next_cursor": None}
    twice = make(lambda _: httpx.Response(200, json=two))
    with pytest.raises(ApiError) as ambiguous:
        twice.find_cluster("train-a")
    assert ambiguous.value.status == 409 and "2 clusters" in ambiguous.value.message


def test_iter_nodes_follows_cursors(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    pages = {
        None: {"items": [node(1), node(2)], "next_cursor": "p2"},
        "p2": {"items": [node(3)], "next_cursor": None},
    }
    client = make(lambda r: httpx.Response(200, json=pages[r.url.params.get("cursor")]))
    names = [n.name for n in client.iter_nodes(cluster=CLUSTER_ID, state=NodeState.IN_SERVICE)]
    assert names == ["node-1", "node-2", "node-3"]
    assert [r.url.params.get("cursor") for r in calls] == [None, "p2"]
    assert calls[0].url.params["limit"] == "1000"
    assert calls[0].url.params["state"] == "in_service"


def test_create_cluster_body(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    client = make(lambda _: httpx.Response(201, json=cluster(status="provisioning")))
    created = client.create_cluster(
        project="ml", name="train-a", size=4, labels={"team": "ml"}, acceptance_tests=False
    )
    assert created.status is ClusterStatus.PROVISIONING
    body = json.loads(calls[0].content)
    assert calls[0].method == "POST"
    assert body == {
        "project": "ml",
        "name": "train-a",
        "scheduler": "sim",
        "provider": "sim",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpus_per_node": 8,
        "size": 4,
        "acceptance_tests": False,
        "startup_scripts": [],
        "autoscale_min": None,
        "autoscale_max": None,
        "labels": {"team": "ml"},
        "node_prefix": None,
        "first_node_index": 0,
    }


def test_error_body_becomes_api_error(make: Callable[[Handler], ApiClient]) -> None:
    err = {"error": {"code": "invalid_input", "message": "size must be >= 0", "field": "size"}}
    client = make(lambda _: httpx.Response(422, json=err))
    with pytest.raises(ApiError) as exc:
        client.create_cluster(project="ml", name="x", size=-1)
    assert (exc.value.status, exc.value.code, exc.value.field) == (422, "invalid_input", "size")


def test_an_error_without_the_api_body_keeps_status_and_text(
    make: Callable[[Handler], ApiClient],
) -> None:
    client = make(lambda _: httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(ApiError) as exc:
        client.get_cluster("c1")
    assert (exc.value.status, exc.value.code) == (502, "http_error")
    assert exc.value.message == "<html>bad gateway</html>" and exc.value.field is None


def test_transport_error_is_server_unreachable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = ApiClient(base_url=URL, token="t", transport=httpx.MockTransport(refuse))
    with client, pytest.raises(ServerUnreachable, match=r"gpufleet\.test"):
        client.health()


def test_ready_is_false_on_503(make: Callable[[Handler], ApiClient]) -> None:
    assert make(lambda _: httpx.Response(200, json={"status": "ready"})).ready() is True
    assert make(lambda _: httpx.Response(503, json={"status": "starting"})).ready() is False
    assert make(lambda _: httpx.Response(200, json={"status": "ok"})).health() == "ok"


def test_events_findings_and_summary_params(
    make: Callable[[Handler], ApiClient], calls: list[httpx.Request]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/summary"):
            return httpx.Response(
                200,
                json={
                    "clusters": 1,
                    "nodes": 2,
                    "gpus": 16,
                    "nodes_by_health": {"healthy": 1, "unknown": 1},
                    "gpus_by_health": {"healthy": 16},
                    "open_findings_by_severity": {},
                    "stale_nodes": 1,
                },
            )
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    client = make(handler)
    since = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    client.list_events(cluster=CLUSTER_ID, kind="node.health", since=since, limit=5)
    client.list_findings(node="n1", open=True)
    summary = client.health_summary(cluster=CLUSTER_ID)
    assert summary.nodes_by_health["unknown"] == 1
    assert calls[0].url.params["since"] == "2026-01-01T12:00:00+00:00"
    assert calls[0].url.params["kind"] == "node.health"
    assert dict(calls[1].url.params) == {"node": "n1", "open": "true"}
    assert calls[2].url.params["cluster"] == CLUSTER_ID
    assert Health.UNKNOWN.value in summary.nodes_by_health
