"""Schemathesis over the whole OpenAPI document, against the in-process app.

Every operation gets a bounded number of generated requests (schema-valid and not), each
sent as one of four callers (the platform owner, an admin and a member of project ``ml``,
nobody) and, half the time, pointed at objects that exist (project ``ml``, its cluster
and a node), so the requests reach past the 404s. Every answer must: not be a server
error; have a status code, content type and body the document describes; and, for a
4xx, be an ``ErrorResponse`` whose message says what was wrong.

The query proxy has the session's real Prometheus behind it. Agent routes are called
with these callers' tokens only (forged node tokens, all refused); the test below the
fuzz checks that such a token is refused whatever the body.

Generation is derandomized (hypothesis picks the same cases on every run) and nothing is
shrunk: a failure is reported as found, with the request that made it.

The app runs in the test's event loop; hypothesis drives it from a worker thread (its
``@given`` functions are synchronous), each request handed back to the loop.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from apihelpers import create_project, nodes_of, ready_cluster
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.core.failures import FailureGroup
from schemathesis.core.transport import Response
from schemathesis.generation import GenerationMode
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpufleet.core.models import ErrorResponse
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.databases import SqliteTemplate
from gpufleet.testing.prometheus import PrometheusServer

pytestmark = pytest.mark.slow

# Cases per operation (about half of them schema-valid): 108 operations × 10 ≈ 1,000
# requests, under a minute on a shared 2-core machine.
EXAMPLES = 10
ROLES = ("owner", "admin", "member", "anonymous")
SendFn = Callable[[Coroutine[Any, Any, httpx.Response]], httpx.Response]


def error_body_check(ctx: Any, response: Response, case: Case) -> bool | None:
    """A 4xx is the project's ErrorResponse and says what was wrong."""
    if not 400 <= response.status_code < 500:
        return None
    body = ErrorResponse.model_validate_json(response.content)
    assert body.error.message.strip(), f"{response.status_code} with an empty message"
    assert body.error.code.strip(), f"{response.status_code} with an empty code"
    return None


def explicit_status_check(ctx: Any, response: Response, case: Case) -> bool | None:
    """Every error is listed by its own code, not only by the "4XX" range."""
    if 400 <= response.status_code < 500:
        documented = case.operation.responses.status_codes
        assert str(response.status_code) in documented, (
            f"{response.status_code} is not listed by code: {sorted(documented)}"
        )
    return None


CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    error_body_check,
    explicit_status_check,
]


def _real_values(world: dict[str, str]) -> dict[str, str]:
    """Parameter name → an object that exists, for the cases pointed at real objects."""
    return {
        "project_ref": "ml",
        "project": "ml",
        "cluster_id": world["cluster"],
        "cluster": world["cluster"],
        "node_id": world["node"],
        "node": world["node"],
        "user_ref": world["member_user"],
    }


def _aim(case: Case, real: dict[str, str]) -> None:
    """Point the case's path and query parameters at objects that exist."""
    for params in (case.path_parameters, case.query):
        if not params:
            continue
        for name in list(params):
            if name in real:
                params[name] = real[name]


def _fuzz_operation(
    operation: Any, *, send: SendFn, app: RunningApp, world: dict[str, str]
) -> tuple[int, str | None]:
    """Run one operation's cases; (how many ran, the first failure's report or None)."""
    real = _real_values(world)
    clients = {
        "owner": app.owner_token,
        "admin": world["admin_token"],
        "member": world["member_token"],
    }
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )
    ran = 0

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report what was found
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, role=st.sampled_from(ROLES), aimed=st.booleans())
    def run(case: Case, role: str, aimed: bool) -> None:
        nonlocal ran
        ran += 1
        if aimed:
            _aim(case, real)
        kwargs = case.as_transport_kwargs(base_url="http://test")
        headers = dict(kwargs.get("headers") or {})
        headers.pop("Authorization", None)
        if role in clients:
            headers["Authorization"] = f"Bearer {clients[role]}"
        request = httpx.Request(
            kwargs["method"],
            kwargs["url"],
            params=kwargs.get("params"),
            headers=headers,
            cookies=kwargs.get("cookies"),
            json=kwargs.get("json"),
            content=kwargs.get("data") if isinstance(kwargs.get("data"), str | bytes) else None,
            data=kwargs.get("data") if isinstance(kwargs.get("data"), dict) else None,
            files=kwargs.get("files"),
        )
        response = send(_send(app, request))
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            found = "; ".join(f"{f.title}: {f.message}" for f in group.exceptions)
            raise AssertionError(
                f"as {role}: {case.method} {response.request.url} → {response.status_code} "
                f"{response.text[:300]}\n    {found}"
            ) from None

    try:
        run()
    except Exception as exc:  # noqa: BLE001 - collected, reported with the others
        return ran, f"{operation.label}: {exc}"[:3000]
    return ran, None


async def _send(app: RunningApp, request: httpx.Request) -> httpx.Response:
    async with app.anonymous() as client:
        response = await client.send(request)
        await response.aread()
        return response


async def _world(app: RunningApp) -> dict[str, str]:
    """Project ``ml`` with a ready one-node cluster, an admin and a member of it."""
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, project="ml", name="train", size=1, gpus=2)
    node = (await nodes_of(app, cluster["id"]))[0]
    world = {"cluster": cluster["id"], "node": node["id"]}
    for role in ("admin", "member"):
        user = f"fuzz-{role}"
        created = await app.client.post("/api/v1/users", json={"name": user})
        assert created.status_code == 201, created.text
        added = await app.client.post(
            "/api/v1/projects/ml/members", json={"user": user, "role": role}
        )
        assert added.status_code == 201, added.text
        token = await app.client.post(
            "/api/v1/tokens", json={"user": user, "project": "ml", "name": f"fuzz-{role}"}
        )
        assert token.status_code == 201, token.text
        world[f"{role}_token"] = token.json()["token"]
        world[f"{role}_user"] = user
    return world


@pytest.fixture
async def fuzz_app(
    tmp_path: Path, sqlite_template: SqliteTemplate, prometheus: PrometheusServer
) -> AsyncIterator[RunningApp]:
    """The app on SQLite, with the session's real Prometheus behind its query proxy."""
    settings_ = make_settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_template.clone(tmp_path / "db"),
        prometheus_url=prometheus.url,
    )
    async with running_app(settings_) as running:
        yield running


async def test_every_operation_answers_as_documented(fuzz_app: RunningApp) -> None:
    app = fuzz_app
    world = await _world(app)
    schema = schemathesis.openapi.from_dict(app.app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    loop = asyncio.get_running_loop()

    def send(coro: Coroutine[Any, Any, httpx.Response]) -> httpx.Response:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)

    def fuzz_all() -> tuple[int, list[str]]:
        total, failures = 0, []
        for operation in operations:
            ran, failure = _fuzz_operation(operation, send=send, app=app, world=world)
            total += ran
            if failure is not None:
                failures.append(failure)
        return total, failures

    total, failures = await asyncio.to_thread(fuzz_all)
    print(f"{total} cases over {len(operations)} operations, as {', '.join(ROLES)}")
    assert len(operations) >= 100
    assert not failures, f"{len(failures)} operation(s) failed:\n\n" + "\n\n".join(failures)


def _concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", template)


async def test_405_allow_names_every_method_of_the_path(fuzz_app: RunningApp) -> None:
    paths: dict[str, Any] = fuzz_app.app.openapi()["paths"]
    checked = 0
    for template, operations in paths.items():
        documented = {m.upper() for m in operations}
        path = _concrete(template)
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            if method in documented:
                continue
            response = await fuzz_app.client.request(method, path)
            if response.status_code != 405:
                continue  # the concrete path is another template's too (hosts/import)
            checked += 1
            allow = {m.strip() for m in response.headers["allow"].split(",")}
            assert documented <= allow, (method, template, response.headers["allow"])
            assert method not in allow
            assert method in response.json()["error"]["message"]
    assert checked > 100


async def test_a_forged_node_token_is_refused_before_the_body_is_read(
    fuzz_app: RunningApp,
) -> None:
    paths: dict[str, Any] = fuzz_app.app.openapi()["paths"]
    agent_posts = [
        p for p, ops in paths.items() if p.startswith("/api/v1/agent/") and "post" in ops
    ]
    assert len(agent_posts) >= 4
    async with fuzz_app.anonymous() as client:
        for template in agent_posts:
            # The enroll route takes a cluster's enroll token, the others a node's.
            forged = "gpfe_forged" if template == "/api/v1/agent/enroll" else "gpfn_forged"
            headers = {"Authorization": f"Bearer {forged}", "Content-Type": "application/json"}
            for body in (None, b"", b"{", b"{}", b"[]", b'{"reports": 1}'):
                response = await client.post(_concrete(template), content=body, headers=headers)
                assert response.status_code == 401, (template, body, response.text)
                assert response.json()["error"]["code"] == "unauthorized"


async def test_any_cursor_the_schema_allows_is_taken(fuzz_app: RunningApp) -> None:
    for path in ("/api/v1/nodes", "/api/v1/events", "/api/v1/audit"):
        taken = await fuzz_app.client.get(path, params={"cursor": str(uuid.uuid4())})
        assert taken.status_code == 200, taken.text
        refused = await fuzz_app.client.get(path, params={"cursor": "not-a-cursor"})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["field"] == "cursor"
