"""Every route under /api/v1 answers with a declared type, so the OpenAPI document and
the client share one definition of each answer (``core.models`` and the other ``core``
objects). A route that returns ``dict``, ``dict[str, Any]`` or ``Any`` fails here."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel

from gpufleet.core.models import Node, Page
from gpufleet.server.app import create_app
from gpufleet.testing.app import make_settings

API = "/api/v1"

# Routes whose answer is not a JSON document of a model, each for a reason it cannot be.
UNTYPED_ALLOWED: dict[tuple[str, str], str] = {
    # Redirects: the browser follows them, there is no body to describe.
    ("GET", f"{API}/auth/login"): "302 to the identity provider",
    ("GET", f"{API}/auth/callback"): "303 back into the console",
    # 204: no body at all.
    ("POST", f"{API}/auth/logout"): "204 No Content",
    # The stored report, byte for byte: its ETag is the SHA-256 of exactly these bytes
    # (re-serialising it through a model could change them).
    ("GET", f"{API}/acceptance/{{acceptance_id}}/report.json"): "signed JSON bytes",
    ("GET", f"{API}/acceptance/{{acceptance_id}}/report.html"): "an HTML page",
    # A raw output stream as text/plain.
    ("GET", f"{API}/checks/{{check_id}}/output"): "text/plain",
    # Prometheus's own answer, passed through (the per-project query proxy).
    **{
        (method, f"{API}/projects/{{project_ref}}/prometheus/api/v1/{endpoint}"): "Prometheus JSON"
        for endpoint in ("query", "query_range", "series", "labels")
        for method in ("GET", "POST")
    },
    ("GET", f"{API}/projects/{{project_ref}}/prometheus/api/v1/label/{{label_name}}/values"): (
        "Prometheus JSON"
    ),
}


def _typed(annotation: object) -> bool:
    """A pydantic model, a dataclass (pydantic validates and documents both), a list of
    one, or a generic model (``Page[Node]``) whose parameters are typed too."""
    if get_origin(annotation) is list:
        return all(_typed(arg) for arg in get_args(annotation))
    if not isinstance(annotation, type):
        return False  # Any, a union, a bare string or int
    if dataclasses.is_dataclass(annotation):
        return True
    if not issubclass(annotation, BaseModel) or annotation is BaseModel:
        return False  # dict, str, ...
    params = annotation.__pydantic_generic_metadata__["args"]
    return all(_typed(p) for p in params)


def _api_routes(app: FastAPI) -> Iterator[tuple[str, str, APIRoute]]:
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        path = context.path_format or ""
        if isinstance(route, APIRoute) and path.startswith(f"{API}/"):
            for method in sorted(route.methods):
                yield method, path, route


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    # Nothing touches the store until the lifespan starts: no database is needed.
    data: Path = tmp_path_factory.mktemp("api-types")
    return create_app(
        make_settings(data_dir=data, database_url=f"sqlite+aiosqlite:///{data}/unused.db")
    )


def test_the_checker_tells_typed_from_untyped() -> None:
    assert _typed(Node) and _typed(list[Node]) and _typed(Page[Node])
    assert not _typed(dict) and not _typed(dict[str, Any]) and not _typed(Any)
    assert not _typed(Page[Any]) and not _typed(list[dict[str, Any]]) and not _typed(None)


def test_every_api_route_declares_a_typed_response(app: FastAPI) -> None:
    seen = {(method, path): route for method, path, route in _api_routes(app)}
    assert len(seen) > 50  # the walk found the API (a FastAPI upgrade could hide it)
    untyped = {
        key: repr(route.response_model)
        for key, route in seen.items()
        if not _typed(route.response_model)
    }
    unexplained = {k: v for k, v in untyped.items() if k not in UNTYPED_ALLOWED}
    assert not unexplained, f"return a model from core.models or the schemas: {unexplained}"
    stale = sorted(set(UNTYPED_ALLOWED) - set(untyped))
    assert not stale, f"typed now or gone; drop from UNTYPED_ALLOWED: {stale}"


def test_openapi_names_a_schema_for_every_json_answer(app: FastAPI) -> None:
    paths: dict[str, dict[str, Any]] = app.openapi()["paths"]
    missing = []
    for path, operations in paths.items():
        for method, operation in operations.items():
            if not path.startswith(f"{API}/") or (method.upper(), path) in UNTYPED_ALLOWED:
                continue
            for code, response in operation["responses"].items():
                if not code.startswith("2"):
                    continue
                schema = response["content"]["application/json"]["schema"]
                if schema.get("type") == "array":
                    schema = schema["items"]
                if "$ref" not in schema:
                    missing.append((method, path, code, schema))
    assert not missing


def test_the_answers_that_were_loose_dicts_are_named_models(app: FastAPI) -> None:
    paths = app.openapi()["paths"]

    def ref(path: str, method: str, code: str = "200") -> str:
        content = paths[f"{API}{path}"][method]["responses"][code]["content"]
        return str(content["application/json"]["schema"]["$ref"]).rsplit("/", 1)[-1]

    assert ref("/me", "get") == "Me"
    assert ref("/auth/config", "get") == "AuthConfig"
    assert ref("/clusters/{cluster_id}/status", "get") == "ClusterStatusReport"
    assert ref("/nodes/{node_id}/actions", "post") == "NodeActionResult"
    assert ref("/usage/gpu-hours", "get") == "GpuHours"
    assert ref("/projects/{project_ref}/repair-policy", "get") == "PolicyConfig"
    assert ref("/projects/{project_ref}/repair-policy/replay", "post") == "ReplayReport"


def test_openapi_describes_the_error_body_the_server_writes(app: FastAPI) -> None:
    document = app.openapi()
    # FastAPI's own 422 shape is never sent: the handlers write ErrorResponse for all.
    assert "HTTPValidationError" not in document["components"]["schemas"]
    operation = document["paths"][f"{API}/clusters"]["post"]
    for code in ("4XX", "5XX"):
        schema = operation["responses"][code]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ErrorResponse")
