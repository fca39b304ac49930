"""The lean path for agent reports (``routers/agent.ReportsFastPath``, installed by
``main``): the same answers as the route, the happy path without the router."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from apihelpers import (
    create_project,
    error_of,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from gpufleet.server.routers.agent import REPORTS_PATH, with_reports_fast_path
from gpufleet.testing.app import RunningApp


class _AppCalls:
    """Counts the agent-report requests that reached the app behind the fast path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == REPORTS_PATH:
            self.calls += 1
        await self.app(scope, receive, send)


Lean = tuple[httpx.AsyncClient, RunningApp, str, str, _AppCalls]


@pytest.fixture
async def lean(app: RunningApp) -> AsyncIterator[Lean]:
    """The app behind the fast path as ``main`` serves it, a node and its token, and a
    counter of the agent-report requests the fast path passed on to the app."""
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, name="train", size=1, gpus=8)
    by_name = await node_tokens(app, cluster["id"])
    node = (await nodes_of(app, cluster["id"]))[0]
    served = with_reports_fast_path(app.app)
    counter = _AppCalls(served.app)
    served.app = counter
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=served), base_url="http://test"
    ) as client:
        yield client, app, node["id"], by_name[node["name"]], counter


async def _post(
    client: httpx.AsyncClient, token: str | None, body: bytes | dict[str, Any]
) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(REPORTS_PATH, content=content, headers=headers)


async def test_a_report_is_stored_without_the_router(lean: Lean) -> None:
    client, app, node_id, token, router = lean
    response = await _post(client, token, report_batch(1, 2))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"]
    ack = response.json()
    assert (ack["node_id"], ack["accepted"], ack["duplicates"], ack["last_seq"]) == (
        node_id,
        2,
        0,
        2,
    )
    again = (await _post(client, token, report_batch(2, 3))).json()
    assert (again["accepted"], again["duplicates"], again["last_seq"]) == (1, 1, 3)
    node = (await app.client.get(f"/api/v1/nodes/{node_id}")).json()
    assert (node["last_report_seq"], node["health"], len(node["gpus"])) == (3, "healthy", 8)
    assert router.calls == 0


@pytest.mark.parametrize("body", [b"", b"{not json", b'{"reports": 3}'])
async def test_a_forged_node_token_is_401_whatever_the_body(lean: Lean, body: bytes) -> None:
    client, _app, _node_id, _token, _router = lean
    response = await _post(client, "gpfn_forged", body)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert error_of(response)["code"] == "unauthorized"


async def test_a_forged_node_token_with_a_good_body_is_401(lean: Lean) -> None:
    client, _app, _node_id, _token, router = lean
    response = await _post(client, "gpfn_forged", report_batch(1))
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert error_of(response)["code"] == "unauthorized"
    assert router.calls == 0  # answered by the fast path, from the group's lookup


@pytest.mark.parametrize("token", [None, "not-a-node-token"])
async def test_no_node_token_goes_to_the_route(lean: Lean, token: str | None) -> None:
    client, _app, _node_id, _token, router = lean
    response = await _post(client, token, report_batch(1))
    assert response.status_code == 401, response.text
    assert error_of(response)["message"]
    assert router.calls == 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, "body"),
        (b'{"reports": [{"seq": 0}]}', 422, "reports.0.seq"),
    ],
)
async def test_a_bad_body_is_the_routes_answer(
    lean: Lean, body: bytes, status: int, field: str
) -> None:
    client, _app, _node_id, token, router = lean
    response = await _post(client, token, body)
    assert response.status_code == status, response.text
    assert error_of(response)["field"] == field
    assert router.calls == 1


async def test_a_repeated_seq_is_409_from_the_fast_path(lean: Lean) -> None:
    client, _app, _node_id, token, router = lean
    response = await _post(client, token, report_batch(4, 4))
    assert response.status_code == 409, response.text
    assert error_of(response)["field"] == "seq"
    assert router.calls == 0


async def test_a_body_over_the_limit_is_the_apps_413(lean: Lean) -> None:
    client, app, _node_id, token, router = lean
    too_big = b" " * (app.ctx.settings.max_body_bytes + 1)
    response = await _post(client, token, too_big)
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "too_large"
    assert router.calls == 1
