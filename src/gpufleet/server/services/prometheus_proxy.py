"""The per-project Prometheus query proxy: a label-enforcing proxy (as prom-label-proxy)
with gpufleet's own authentication in front.

Every selector of every query and ``match[]`` is forced to ``project="<name>"``
(``core.promql.enforce_label``), so a project's member, or the Grafana data source of
its organisation holding a project-scoped token, reads that project's series and no
other. The label comes from the HTTP service discovery (``prometheus_targets.py``), i.e.
from the store, never from the agent. What the injector cannot check is refused (400)
and never forwarded. Prometheus's answer is passed through as it is; series listings are
filtered once more on the label, which a listing can afford.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.core.promql import enforce_label
from gpufleet.server.db.engine import Database
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.projects import get_project_row_or_error
from gpufleet.server.services.prometheus_targets import PROJECT_LABEL

ENDPOINTS = ("query", "query_range", "series", "labels", "label_values")
# Parameters Prometheus's API takes besides the expressions; the rest is dropped.
PASSED_PARAMS = frozenset({"time", "start", "end", "step", "timeout", "limit", "stats"})
MAX_MATCHERS = 32
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class ProxiedAnswer:
    status_code: int
    body: bytes
    content_type: str


def rewrite_params(
    endpoint: str, params: Sequence[tuple[str, str]], *, project: str
) -> list[tuple[str, str]]:
    """The parameters to forward: every expression forced to ``project``; InvalidInput
    (400) when an expression is missing or cannot be checked."""
    out = [(k, v) for k, v in params if k in PASSED_PARAMS]
    if endpoint in ("query", "query_range"):
        queries = [v for k, v in params if k == "query"]
        if len(queries) != 1:
            raise InvalidInput("give exactly one query parameter", field="query")
        out.append(("query", enforce_label(queries[0], name=PROJECT_LABEL, value=project)))
        return out
    matches = [v for k, v in params if k == "match[]"]
    if len(matches) > MAX_MATCHERS:
        raise InvalidInput(f"at most {MAX_MATCHERS} match[] parameters", field="match[]")
    if not matches:
        if endpoint == "series":
            raise InvalidInput("give at least one match[] selector", field="match[]")
        matches = ["{}"]  # labels and values of this project's series only
    out += [("match[]", enforce_label(m, name=PROJECT_LABEL, value=project)) for m in matches]
    return out


async def proxy_prometheus(
    db: Database,
    *,
    caller: Caller,
    prometheus_url: str | None,
    timeout_s: float,
    project_ref: str,
    endpoint: str,
    params: Sequence[tuple[str, str]],
    label_name: str | None = None,
) -> ProxiedAnswer:
    """Forward one read of Prometheus's HTTP API for ``project_ref``'s series only."""
    async with db.session() as session:
        project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
    if endpoint not in ENDPOINTS:
        raise InvalidInput(f"not a proxied endpoint: {endpoint}", field="endpoint")
    if prometheus_url is None:
        raise Unavailable("no Prometheus is configured (GPUFLEET_PROMETHEUS_URL)")
    forwarded = rewrite_params(endpoint, params, project=project.name)
    if endpoint == "label_values":
        if label_name is None or not _LABEL_NAME.fullmatch(label_name):
            raise InvalidInput(f"not a label name: {label_name!r}", field="name")
        path = f"/api/v1/label/{label_name}/values"
    else:
        path = f"/api/v1/{endpoint}"
    url = prometheus_url.rstrip("/") + path
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            if endpoint == "label_values":  # Prometheus takes GET only there
                response = await client.get(url, params=_form(forwarded))
            else:
                response = await client.post(url, data=_form(forwarded))
    except httpx.HTTPError as exc:
        raise Unavailable(f"Prometheus at {prometheus_url} did not answer: {exc}") from exc
    body = response.content
    if endpoint == "series" and response.status_code == 200:
        body = _only_project_series(body, project.name)
    return ProxiedAnswer(
        status_code=response.status_code,
        body=body,
        content_type=response.headers.get("content-type", "application/json"),
    )


def _form(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    form: dict[str, list[str]] = {}
    for key, value in pairs:
        form.setdefault(key, []).append(value)
    return form


def _only_project_series(body: bytes, project: str) -> bytes:
    """A second guard on listings: drop any series not labelled with the project."""
    try:
        doc = json.loads(body)
        doc["data"] = [s for s in doc["data"] if s.get(PROJECT_LABEL) == project]
    except (ValueError, KeyError, TypeError, AttributeError):
        return body
    return json.dumps(doc).encode()
