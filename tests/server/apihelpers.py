"""Helpers for the API tests: the real app, real stores, driven one loop pass at a time.

A plain module (not conftest) so test files can import it; the name is unique because
pytest's default import mode puts each test folder on sys.path.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import httpx
from sqlalchemy import func, select

from gpufleet.core.clock import utcnow
from gpufleet.core.ids import new_id
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops
from gpufleet.server.db.tables import (
    ApiTokenRow,
    AuditLogRow,
    ClusterRow,
    EventRow,
    FindingRow,
    GpuRow,
    NodeRow,
    ProjectRow,
)
from gpufleet.testing.app import RunningApp

H100 = "NVIDIA H100 80GB HBM3"
COUNTED = {
    "project": ProjectRow,
    "cluster": ClusterRow,
    "node": NodeRow,
    "gpu": GpuRow,
    "event": EventRow,
    "audit_log": AuditLogRow,
    "api_token": ApiTokenRow,
}
STALENESS_S = 30.0


async def count_rows(app: RunningApp) -> dict[str, int]:
    """Row counts of the tables a bad request must leave alone. ``audit_log`` counts what
    was done (result ``ok``): a refused mutation leaves its own row, which is not that."""
    async with app.ctx.db.session() as session:
        counts = {
            name: int(await session.scalar(select(func.count()).select_from(row)) or 0)
            for name, row in COUNTED.items()
        }
        counts["audit_log"] = int(
            await session.scalar(
                select(func.count()).select_from(AuditLogRow).where(AuditLogRow.result == "ok")
            )
            or 0
        )
        return counts


async def audit_rows_of(app: RunningApp, response: httpx.Response) -> list[AuditLogRow]:
    """The audit rows written while the server handled ``response``'s request."""
    request_id = response.headers["X-Request-ID"]
    async with app.ctx.db.session() as session:
        rows = await session.scalars(
            select(AuditLogRow).where(AuditLogRow.request_id == request_id).order_by(AuditLogRow.id)
        )
        return list(rows)


async def assert_only_refusal_written(
    app: RunningApp, before: dict[str, int], response: httpx.Response, *, audited: bool
) -> None:
    """Nothing changed but, for a refused mutation by a known caller, its one audit row."""
    rows = await audit_rows_of(app, response)
    assert len(rows) == (1 if audited else 0), [(r.action, r.result) for r in rows]
    for row in rows:
        assert row.result != "ok"
        assert row.detail["status"] == response.status_code
    assert await count_rows(app) == before


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "field"}, error
    return error


async def create_project(client: httpx.AsyncClient, name: str = "ml") -> dict[str, Any]:
    response = await client.post("/api/v1/projects", json={"name": name})
    assert response.status_code == 201, response.text
    project: dict[str, Any] = response.json()
    return project


async def create_cluster(
    client: httpx.AsyncClient,
    *,
    project: str = "ml",
    name: str = "train",
    size: int = 2,
    gpus_per_node: int = 8,
    **extra: Any,
) -> dict[str, Any]:
    """A cluster as the API makes it. Acceptance tests are off unless ``extra`` turns them
    on: they need the simulated agents to run their checks, which these in-process tests
    drive only where they say so (tests/server/test_acceptance*.py do)."""
    body = {
        "project": project,
        "name": name,
        "size": size,
        "gpus_per_node": gpus_per_node,
        "acceptance_tests": False,
    }
    response = await client.post("/api/v1/clusters", json={**body, **extra})
    assert response.status_code == 201, response.text
    cluster: dict[str, Any] = response.json()
    return cluster


async def run_loops(app: RunningApp, passes: int = 1) -> None:
    """Provisioning, then health, ``passes`` times."""
    loops = build_loops(app.ctx)
    for _ in range(passes):
        for loop in loops:
            await loop.run_once()


async def ready_cluster(
    app: RunningApp, *, project: str = "ml", name: str = "train", size: int = 2, gpus: int = 8
) -> dict[str, Any]:
    """A cluster whose nodes are all in service (the sim boots at once in tests)."""
    cluster = await create_cluster(
        app.client, project=project, name=name, size=size, gpus_per_node=gpus
    )
    for _ in range(4):
        await run_loops(app)
        status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
        if status["status"] == "ready":
            return cluster
    raise AssertionError(f"cluster never became ready: {status}")


async def node_tokens(app: RunningApp, cluster_id: str) -> dict[str, str]:
    """Node name → the node token the provisioning loop handed the machine in user_data."""
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    return {
        sim.node_name: sim.user_data["gpufleet_node_token"]
        for sim in provider.world.list_instances(cluster_id=cluster_id)
    }


async def nodes_of(app: RunningApp, cluster_id: str) -> list[dict[str, Any]]:
    response = await app.client.get("/api/v1/nodes", params={"cluster": cluster_id})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def gpu_sample(index: int, *, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid or f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "serial": f"SN{index:04d}",
        "model": H100,
        "utilization_pct": 50.0 + index,
        "memory_used_mib": 1024.0,
        "memory_total_mib": 81559.0,
        "temperature_c": 40.0 + index,
        "power_w": 300.0,
        "sm_clock_mhz": 1980.0,
        **extra,
    }


def report_batch(
    *seqs: int,
    gpus: int = 8,
    gpu_list: list[dict[str, Any]] | None = None,
    hostname: str | None = None,
    sampled_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """A ReportBatch as JSON: one report per seq, each with the same GPUs."""
    at = (sampled_at or utcnow()).isoformat()
    samples = gpu_list if gpu_list is not None else [gpu_sample(i) for i in range(gpus)]
    batch: dict[str, Any] = {
        "reports": [{"seq": s, "sampled_at": at, "gpus": samples} for s in seqs],
    }
    if hostname is not None:
        batch["identity"] = {"hostname": hostname, "serial": "SER-1", "agent_version": "0.1"}
    return batch


async def send_report(app: RunningApp, token: str | None, batch: dict[str, Any]) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with app.anonymous() as client:
        return await client.post("/api/v1/agent/reports", json=batch, headers=headers)


async def add_finding(
    app: RunningApp,
    *,
    cluster_id: str,
    node_id: str,
    severity: str,
    signature: str = "xid-79",
    cleared: bool = False,
    gpu_uuid: str | None = None,
) -> str:
    """A finding row as the passive-health work will write them (no API creates one yet)."""
    now = utcnow()
    row = FindingRow(
        id=new_id(),
        cluster_id=cluster_id,
        node_id=node_id,
        gpu_uuid=gpu_uuid,
        signature_id=signature,
        title=f"{signature} seen",
        severity=severity,
        source="kernel-log",
        evidence="NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        count=1,
        first_seen=now,
        last_seen=now,
        cleared_at=now if cleared else None,
    )
    async with app.ctx.db.transaction() as session:
        session.add(row)
    return row.id


async def member_client(app: RunningApp, project: str = "ml") -> httpx.AsyncClient:
    """A client holding an owner's token capped to member in ``project``."""
    created = await app.client.post(
        "/api/v1/tokens", json={"project": project, "role": "member", "name": "member"}
    )
    assert created.status_code == 201, created.text
    return app.with_token(created.json()["token"])


async def console_page(app: RunningApp, path: str) -> httpx.Response:
    """``path`` of the console (asserted 200), logged in through its token form as the
    owner. https: the console's session cookies are Secure."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app.app), base_url="https://gpufleet.test"
    ) as browser:
        login = await browser.get("/login", params={"next": path})
        csrf = re.search(r'name="login_csrf" value="([^"]*)"', login.text)
        assert csrf is not None, login.text
        form = {"login_csrf": csrf.group(1), "next": path, "token": app.owner_token}
        assert (await browser.post("/login", data=form)).status_code == 303
        page = await browser.get(path)
    assert page.status_code == 200, f"{path}: {page.status_code} {page.text[:500]}"
    return page
