"""Health: the summary's counts, findings, and staleness on a FakeClock."""

from __future__ import annotations

from typing import Any

from apihelpers import (
    STALENESS_S,
    add_finding,
    create_cluster,
    create_project,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    run_loops,
    send_report,
)

from gpufleet.core.clock import FakeClock
from gpufleet.server.app import build_loops
from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.services.health import refresh_cluster_health
from gpufleet.server.workers.health import HealthLoop
from gpufleet.testing.app import RunningApp

ALL_HEALTH = {"healthy", "degraded", "unhealthy", "unknown"}


async def _fleet(app: RunningApp, *, size: int = 2, name: str = "train") -> list[dict[str, Any]]:
    """A ready cluster; returns its nodes, each with its node ``token`` added."""
    cluster = await ready_cluster(app, name=name, size=size, gpus=8)
    tokens = await node_tokens(app, cluster["id"])
    return [{**n, "token": tokens[n["name"]]} for n in await nodes_of(app, cluster["id"])]


async def _summary(app: RunningApp, **params: str) -> dict[str, Any]:
    response = await app.client.get("/api/v1/health/summary", params=params)
    assert response.status_code == 200, response.text
    summary: dict[str, Any] = response.json()
    return summary


async def _health(app: RunningApp, node_id: str) -> str:
    response = await app.client.get(f"/api/v1/nodes/{node_id}")
    assert response.status_code == 200, response.text
    health: str = response.json()["health"]
    return health


async def test_empty_summary(app: RunningApp) -> None:
    summary = await _summary(app)
    assert summary == {
        "clusters": 0,
        "nodes": 0,
        "gpus": 0,
        "nodes_by_health": dict.fromkeys(ALL_HEALTH, 0),
        "gpus_by_health": dict.fromkeys(ALL_HEALTH, 0),
        "open_findings_by_severity": {},
        "stale_nodes": 0,
    }


async def test_summary_counts_nodes_gpus_and_findings(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    a = await _fleet(app, size=3, name="a")
    b_cluster = await create_cluster(app.client, name="b", size=2)  # never provisioned
    await send_report(app, a[0]["token"], report_batch(1))
    await send_report(app, a[1]["token"], report_batch(1, gpus=6))
    await add_finding(app, cluster_id=a[0]["cluster_id"], node_id=a[0]["id"], severity="warning")
    await add_finding(
        app, cluster_id=a[1]["cluster_id"], node_id=a[1]["id"], severity="critical", cleared=True
    )

    summary = await _summary(app)
    assert summary["clusters"] == 2
    assert summary["nodes"] == 5
    assert summary["gpus"] == 14
    assert summary["nodes_by_health"] == {
        "healthy": 1,
        "degraded": 0,
        "unhealthy": 1,
        "unknown": 3,
    }
    assert summary["gpus_by_health"] == {"healthy": 14, "degraded": 0, "unhealthy": 0, "unknown": 0}
    assert summary["open_findings_by_severity"] == {"warning": 1}
    assert summary["stale_nodes"] == 3

    only_b = await _summary(app, cluster=b_cluster["id"])
    assert (only_b["clusters"], only_b["nodes"], only_b["gpus"], only_b["stale_nodes"]) == (
        1,
        2,
        0,
        2,
    )
    assert only_b["open_findings_by_severity"] == {}


async def test_summary_of_unknown_cluster_is_404(app: RunningApp) -> None:
    response = await app.client.get(
        "/api/v1/health/summary", params={"cluster": "01a237be-697e-7000-9bff-8b287e325098"}
    )
    assert response.status_code == 404


async def test_deleted_clusters_leave_the_summary(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    nodes = await _fleet(app, size=2)
    await app.client.delete(f"/api/v1/clusters/{nodes[0]['cluster_id']}")
    await run_loops(app)
    summary = await _summary(app)
    assert (summary["clusters"], summary["nodes"], summary["gpus"]) == (0, 0, 0)


async def test_open_finding_decides_node_health_on_next_report(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    node = (await _fleet(app, size=1))[0]
    await send_report(app, node["token"], report_batch(1))
    assert await _health(app, node["id"]) == "healthy"
    await add_finding(app, cluster_id=node["cluster_id"], node_id=node["id"], severity="warning")
    await send_report(app, node["token"], report_batch(2))
    assert await _health(app, node["id"]) == "degraded"
    await add_finding(app, cluster_id=node["cluster_id"], node_id=node["id"], severity="fatal")
    await send_report(app, node["token"], report_batch(3))
    assert await _health(app, node["id"]) == "unhealthy"


async def test_list_findings_filters_and_pages(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    a, b = await _fleet(app, size=2)
    ids = [
        await add_finding(app, cluster_id=a["cluster_id"], node_id=a["id"], severity="warning"),
        await add_finding(
            app, cluster_id=a["cluster_id"], node_id=b["id"], severity="critical", signature="x"
        ),
        await add_finding(
            app, cluster_id=a["cluster_id"], node_id=b["id"], severity="info", cleared=True
        ),
    ]

    async def listed(**params: str) -> list[str]:
        response = await app.client.get("/api/v1/findings", params=params)
        assert response.status_code == 200, response.text
        return [f["id"] for f in response.json()["items"]]

    assert await listed() == ids[::-1]
    assert await listed(node=b["id"]) == [ids[2], ids[1]]
    assert await listed(signature="x") == [ids[1]]
    assert await listed(open="true") == [ids[1], ids[0]]
    assert await listed(open="false") == [ids[2]]
    assert await listed(cluster=a["cluster_id"]) == ids[::-1]
    first = (await app.client.get("/api/v1/findings", params={"limit": 2})).json()
    assert [f["id"] for f in first["items"]] == [ids[2], ids[1]]
    rest = await app.client.get(
        "/api/v1/findings", params={"limit": 2, "cursor": first["next_cursor"]}
    )
    assert [f["id"] for f in rest.json()["items"]] == [ids[0]]
    assert rest.json()["next_cursor"] is None


def _health_loop(app: RunningApp) -> HealthLoop:
    return next(loop for loop in build_loops(app.ctx) if isinstance(loop, HealthLoop))


async def _one_goes_silent(
    app: RunningApp, clock: FakeClock
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two nodes report and the cluster is healthy; then b keeps reporting and a goes
    silent just past the staleness (no health pass since)."""
    await create_project(app.client, "ml")
    a, b = await _fleet(app, size=2)
    for node in (a, b):
        await send_report(app, node["token"], report_batch(1))
    await run_loops(app)
    cluster = (await app.client.get(f"/api/v1/clusters/{a['cluster_id']}")).json()
    assert cluster["health"] == "healthy"
    clock.advance(STALENESS_S / 2)
    await send_report(app, b["token"], report_batch(2))
    clock.advance(STALENESS_S / 2 + 1)
    return a, b


async def test_silent_node_becomes_unknown_and_recovers(
    clocked_app: RunningApp, clock: FakeClock
) -> None:
    app = clocked_app
    a, b = await _one_goes_silent(app, clock)
    cluster_id = a["cluster_id"]
    health_loop = _health_loop(app)
    await health_loop.run_once()

    assert await _health(app, a["id"]) == "unknown"
    assert await _health(app, b["id"]) == "healthy"
    shown = (await app.client.get(f"/api/v1/nodes/{a['id']}")).json()
    assert {g["health"] for g in shown["gpus"]} == {"unknown"}  # a silent node's GPUs too
    events = await app.client.get("/api/v1/events", params={"node": a["id"], "kind": "node.health"})
    latest = events.json()["items"][0]
    assert latest["data"]["to"] == "unknown"
    assert latest["data"]["from"] == "healthy"
    assert f"no report for {int(STALENESS_S) + 1} s" in latest["message"]
    summary = await _summary(app)
    assert summary["stale_nodes"] == 1
    assert summary["nodes_by_health"]["healthy"] == 1
    assert summary["gpus_by_health"] == {"healthy": 8, "degraded": 0, "unhealthy": 0, "unknown": 8}
    cluster = (await app.client.get(f"/api/v1/clusters/{cluster_id}")).json()
    assert cluster["health"] == "unhealthy"  # half its nodes are not known to be fine
    healthy = await app.client.get("/api/v1/nodes", params={"health": "healthy"})
    assert [n["id"] for n in healthy.json()["items"]] == [b["id"]]

    await send_report(app, a["token"], report_batch(2))
    assert await _health(app, a["id"]) == "healthy"
    await health_loop.run_once()
    assert (await app.client.get(f"/api/v1/clusters/{cluster_id}")).json()["health"] == "healthy"


async def test_stale_node_is_never_shown_healthy_between_passes(
    clocked_app: RunningApp, clock: FakeClock
) -> None:
    app = clocked_app
    await create_project(app.client, "ml")
    node = (await _fleet(app, size=1))[0]
    await send_report(app, node["token"], report_batch(1))
    clock.advance(STALENESS_S + 1)  # the HealthLoop has not run yet
    assert await _health(app, node["id"]) == "unknown"


async def test_a_silent_node_turned_unhealthy_by_a_finding_gets_an_event(
    clocked_app: RunningApp, clock: FakeClock
) -> None:
    """The health loop's "known bad beats unknown" is a health change like any other: it
    writes a node.health event (it once changed the node silently)."""
    app = clocked_app
    await create_project(app.client, "ml")
    node = (await _fleet(app, size=1))[0]
    await send_report(app, node["token"], report_batch(1))
    assert await _health(app, node["id"]) == "healthy"
    # A critical finding the node's health has not taken in yet (written directly).
    await add_finding(app, cluster_id=node["cluster_id"], node_id=node["id"], severity="critical")
    clock.advance(STALENESS_S + 1)
    await _health_loop(app).run_once()
    assert await _health(app, node["id"]) == "unhealthy"
    events = await app.client.get(
        "/api/v1/events", params={"node": node["id"], "kind": "node.health"}
    )
    latest = events.json()["items"][0]
    assert (latest["data"]["from"], latest["data"]["to"]) == ("healthy", "unhealthy")
    assert latest["actor"] == "system:health"
    assert "an open critical finding" in latest["message"]


async def test_silent_node_with_critical_finding_stays_unhealthy(
    clocked_app: RunningApp, clock: FakeClock
) -> None:
    app = clocked_app
    await create_project(app.client, "ml")
    node = (await _fleet(app, size=1))[0]
    await add_finding(app, cluster_id=node["cluster_id"], node_id=node["id"], severity="critical")
    await send_report(app, node["token"], report_batch(1))
    assert await _health(app, node["id"]) == "unhealthy"
    clock.advance(STALENESS_S + 1)
    await _health_loop(app).run_once()
    assert await _health(app, node["id"]) == "unhealthy"


async def test_cluster_health_counts_a_silent_node_unknown_before_the_loop_marks_it(
    clocked_app: RunningApp, clock: FakeClock
) -> None:
    """The cluster's health is counted in the database (stored health × silence), yet a
    node still stored healthy but silent past the staleness counts as unknown."""
    app = clocked_app
    a, _b = await _one_goes_silent(app, clock)
    async with app.ctx.db.transaction() as session:
        cluster = await session.get(ClusterRow, a["cluster_id"])
        assert cluster is not None and cluster.health == "healthy"
        silent = await session.get(NodeRow, a["id"])
        assert silent is not None and silent.health == "healthy"  # not marked yet
        changed = await refresh_cluster_health(
            session, cluster=cluster, staleness_s=STALENESS_S, now=clock.now()
        )
    assert changed
    cluster_now = (await app.client.get(f"/api/v1/clusters/{a['cluster_id']}")).json()
    assert cluster_now["health"] == "unhealthy"  # 1 of 2 unknown: half not known fine
    await send_report(app, a["token"], report_batch(2))
    async with app.ctx.db.transaction() as session:
        cluster = await session.get(ClusterRow, a["cluster_id"])
        assert cluster is not None
        await refresh_cluster_health(
            session, cluster=cluster, staleness_s=STALENESS_S, now=clock.now()
        )
    cluster_now = (await app.client.get(f"/api/v1/clusters/{a['cluster_id']}")).json()
    assert cluster_now["health"] == "healthy"
