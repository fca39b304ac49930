"""``GET /metrics``: who may read it, and the numbers it shows, on SQLite and PostgreSQL.

The fleet's gauges are read from the store at scrape time; a test builds a fleet through
the API (nodes, a cordon, agent reports) and writes findings and repairs with known
timestamps, then checks every series against what it built. The in-process instruments
(repair steps, loop passes, API latency) are process-wide, so those tests read how much
a series grew, never its absolute value.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from apihelpers import (
    add_finding,
    create_project,
    member_client,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    send_report,
)
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from gpufleet.core.clock import FakeClock, utcnow
from gpufleet.core.enums import Health, RepairStatus
from gpufleet.core.ids import new_id
from gpufleet.server.db.leases import acquire_lease
from gpufleet.server.db.tables import RepairRow
from gpufleet.server.metrics import REGISTRY
from gpufleet.server.services.repairs import switch_repair_status
from gpufleet.server.workers.base import LoopDeps, LoopService
from gpufleet.testing.app import RunningApp, make_settings, running_app

SCRAPE_TOKEN = "scrape-" + "s3cr3t" * 8

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=utcnow().replace(microsecond=0))


@pytest.fixture
async def metrics_app(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[RunningApp]:
    """The app on a fake clock with a scrape token file, as Prometheus would use it."""
    token_file = tmp_path / "metrics-token"
    token_file.write_text(SCRAPE_TOKEN + "\n")
    settings = make_settings(
        data_dir=tmp_path / "data", database_url=database_url, metrics_token_file=token_file
    )
    async with running_app(settings, clock=clock) as running:
        yield running


async def scrape(app: RunningApp, token: str = SCRAPE_TOKEN) -> tuple[str, Series]:
    async with app.with_token(token) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    series: Series = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series[sample.name, frozenset(sample.labels.items())] = sample.value
    return response.text, series


def values(series: Series, name: str, **match: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` whose labels include ``match``."""
    want = set(match.items())
    return {labels: v for (n, labels), v in series.items() if n == name and want <= labels}


def one(series: Series, name: str, **labels: str) -> float:
    found = values(series, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {found}"
    return next(iter(found.values()))


def grown(before: float | None, after: float | None) -> float:
    return (after or 0.0) - (before or 0.0)


# -- who may read it ------------------------------------------------------------------


async def test_only_the_owner_and_the_scrape_token_read_metrics(metrics_app: RunningApp) -> None:
    app = metrics_app
    await create_project(app.client)
    cluster = await ready_cluster(app, size=1)
    node_token = next(iter((await node_tokens(app, cluster["id"])).values()))
    admin = await app.client.post(
        "/api/v1/tokens", json={"project": "ml", "role": "admin", "name": "admin"}
    )
    assert admin.status_code == 201, admin.text

    assert (await app.client.get("/metrics")).status_code == 200  # the owner
    async with app.anonymous() as anonymous:
        assert (await anonymous.get("/metrics")).status_code == 401
    for token, status in [
        (SCRAPE_TOKEN, 200),
        (SCRAPE_TOKEN + "x", 401),  # not the scrape token, not an API token
        (node_token, 401),  # node tokens work on agent routes only
        (admin.json()["token"], 403),  # a project's admin sees one project, not the fleet
    ]:
        async with app.with_token(token) as client:
            assert (await client.get("/metrics")).status_code == status, token[:8]
    async with await member_client(app) as member:
        refused = await member.get("/metrics")
    assert refused.status_code == 403
    assert "metrics.read" in refused.json()["error"]["message"]
    # The scrape token reads /metrics and nothing else.
    async with app.with_token(SCRAPE_TOKEN) as scraper:
        assert (await scraper.get("/api/v1/projects")).status_code == 401
        assert (await scraper.get(f"/api/v1/clusters/{cluster['id']}")).status_code == 401


async def test_a_short_scrape_token_file_is_refused_by_name(
    database_url: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "metrics-token"
    token_file.write_text("short\n")
    settings = make_settings(
        data_dir=tmp_path / "data", database_url=database_url, metrics_token_file=token_file
    )
    async with running_app(settings) as app, app.with_token("short") as client:
        response = await client.get("/metrics")
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert str(token_file) in message and "32 characters" in message
    assert "short" not in message.replace(str(token_file), "")


# -- the fleet's gauges ---------------------------------------------------------------


async def _repair(
    app: RunningApp,
    *,
    cluster_id: str,
    node_id: str,
    status: RepairStatus,
    action: str = "reboot",
    created: dt.datetime,
    step_started: dt.datetime | None = None,
    finished: dt.datetime | None = None,
) -> str:
    """A repair row with the timestamps a test needs (the planner makes real ones)."""
    row = RepairRow(
        id=new_id(),
        cluster_id=cluster_id,
        node_id=node_id,
        action=action,
        status=status.value,
        signature_id="xid-79",
        reason="test",
        rule="test",
        evidence={},
        progress={},
        step_started_at=step_started,
        approved_at=None,
        finished_at=finished,
        created_at=created,
        updated_at=step_started or created,
    )
    async with app.ctx.db.transaction() as session:
        session.add(row)
    return row.id


async def test_fleet_gauges_show_the_store(metrics_app: RunningApp, clock: FakeClock) -> None:
    app = metrics_app
    await create_project(app.client)
    cluster = await ready_cluster(app, size=3)
    cid = cluster["id"]
    nodes = {n["name"]: n for n in await nodes_of(app, cid)}
    names = sorted(nodes)
    cordon = await app.client.post(
        f"/api/v1/nodes/{nodes[names[2]]['id']}/actions",
        json={"action": "cordon", "reason": "metrics test"},
    )
    assert cordon.status_code in (200, 202), cordon.text
    tokens = await node_tokens(app, cid)
    for name in names[:2]:
        response = await send_report(app, tokens[name], report_batch(1, 2, hostname=name))
        assert response.status_code == 200, response.text
    reported_at = clock.now()

    await add_finding(app, cluster_id=cid, node_id=nodes[names[0]]["id"], severity="fatal")
    await add_finding(app, cluster_id=cid, node_id=nodes[names[1]]["id"], severity="fatal")
    await add_finding(
        app, cluster_id=cid, node_id=nodes[names[1]]["id"], severity="fatal", cleared=True
    )
    await add_finding(
        app,
        cluster_id=cid,
        node_id=nodes[names[2]]["id"],
        severity="warning",
        signature="thermal-slowdown",
    )

    clock.advance(30)
    now = clock.now()
    node0, node1 = nodes[names[0]]["id"], nodes[names[1]]["id"]

    def ago(seconds: float) -> dt.datetime:
        return now - dt.timedelta(seconds=seconds)

    # Two reboots that succeeded in the MTTR window (500 s and 300 s), one long before it.
    for took, ended in ((500, 100), (300, 700)):
        await _repair(
            app, cluster_id=cid, node_id=node0, status=RepairStatus.SUCCEEDED,
            created=ago(ended + took), step_started=ago(ended), finished=ago(ended),
        )  # fmt: skip
    await _repair(
        app, cluster_id=cid, node_id=node0, status=RepairStatus.SUCCEEDED,
        created=ago(9 * 86400), step_started=ago(8 * 86400), finished=ago(8 * 86400),
    )  # fmt: skip
    # Open ones: two draining (the older one counts), one awaiting approval since 120 s.
    await _repair(
        app, cluster_id=cid, node_id=node1, status=RepairStatus.DRAINING,
        created=ago(7200), step_started=ago(3600),
    )  # fmt: skip
    await _repair(
        app, cluster_id=cid, node_id=node0, status=RepairStatus.DRAINING,
        created=ago(100), step_started=ago(60),
    )  # fmt: skip
    await _repair(
        app, cluster_id=cid, node_id=node1, status=RepairStatus.PROPOSED,
        action="reprovision", created=ago(120),
    )  # fmt: skip

    text, series = await scrape(app)
    listed = await nodes_of(app, cid)
    where = {"project": "ml", "cluster": "train"}
    by_state = values(series, "gpufleet_nodes_by_state", **where)
    assert sum(by_state.values()) == 3 == len(listed)
    for state in ("in_service", "cordoned", "failed", "repairing"):
        expected = sum(1 for n in listed if n["state"] == state)
        assert one(series, "gpufleet_nodes_by_state", state=state, **where) == expected, state
    assert one(series, "gpufleet_nodes_by_state", state="cordoned", **where) == 1
    by_health = values(series, "gpufleet_nodes_by_health", **where)
    assert len(by_health) == len(Health) and sum(by_health.values()) == 3
    for health in Health:
        expected = sum(1 for n in listed if n["health"] == health)
        assert one(series, "gpufleet_nodes_by_health", health=health.value, **where) == expected

    findings = values(series, "gpufleet_findings_open", **where)
    assert {dict(k)["signature"] + "/" + dict(k)["severity"]: v for k, v in findings.items()} == {
        "xid-79/fatal": 2,
        "thermal-slowdown/warning": 1,
    }

    repairs = values(series, "gpufleet_repairs_by_status", **where)
    assert {(dict(k)["status"], dict(k)["action"]): v for k, v in repairs.items()} == {
        ("succeeded", "reboot"): 3,
        ("draining", "reboot"): 2,
        ("proposed", "reprovision"): 1,
    }
    assert one(series, "gpufleet_repair_mttr_seconds", action="reboot", **where) == (
        pytest.approx(400, abs=0.01)
    )
    assert one(series, "gpufleet_repair_recoveries", action="reboot", **where) == 2
    stuck = values(series, "gpufleet_repair_oldest_step_age_seconds", **where)
    assert {(dict(k)["status"], dict(k)["action"]): v for k, v in stuck.items()} == {
        ("draining", "reboot"): pytest.approx(3600, abs=0.01),
        ("proposed", "reprovision"): pytest.approx(120, abs=0.01),
    }
    assert one(series, "gpufleet_repair_breaker_tripped", **where) == 0

    ages = values(series, "gpufleet_node_last_report_age_seconds", **where)
    assert len(ages) == 3
    for name in names[:2]:
        age = one(series, "gpufleet_node_last_report_age_seconds", node=name, **where)
        assert age == pytest.approx((now - reported_at).total_seconds(), abs=1.0)
        assert one(series, "gpufleet_node_last_report_age_seconds", node=name, hostname=name) == age
    never = one(series, "gpufleet_node_last_report_age_seconds", node=names[2], **where)
    assert 25 < never < 120  # since the node was made (30 s ago): it never reported
    assert one(series, "gpufleet_node_last_report_age_seconds", node=names[2], state="cordoned")

    # No id, token or secret is ever a label value.
    secrets = [app.owner_token, SCRAPE_TOKEN, *tokens.values()]
    ids = [cid, node0, node1, nodes[names[2]]["id"], cluster["project_id"]]
    assert not [s for s in [*secrets, *ids] if s in text]


async def test_ingest_and_request_counters_grow(metrics_app: RunningApp) -> None:
    app = metrics_app
    await create_project(app.client)
    cluster = await ready_cluster(app, size=1)
    token = next(iter((await node_tokens(app, cluster["id"])).values()))
    _, before = await scrape(app)
    accepted = one(before, "gpufleet_agent_reports_accepted_total")
    assert (await send_report(app, token, report_batch(1, 2, 3))).status_code == 200
    assert (await app.client.get("/api/v1/projects")).status_code == 200
    assert (await app.client.get("/api/v1/no/such/route")).status_code == 404
    _, after = await scrape(app)
    assert one(after, "gpufleet_agent_reports_accepted_total") == accepted + 3
    assert one(after, "gpufleet_agent_report_batches_total") >= 1
    route = {"method": "GET", "route": "/api/v1/projects", "status_class": "2xx"}
    count = "gpufleet_http_request_duration_seconds_count"
    assert grown(before.get((count, frozenset(route.items()))), one(after, count, **route)) == 1
    unmatched = {"method": "GET", "route": "unmatched", "status_class": "4xx"}
    assert one(after, count, **unmatched) >= 1
    agent = {"method": "POST", "route": "/api/v1/agent/reports", "status_class": "2xx"}
    assert one(after, count, **agent) >= 1
    assert one(after, "gpufleet_build_info") == 1
    assert one(after, "gpufleet_metrics_collect_duration_seconds") >= 0


# -- the in-process instruments -------------------------------------------------------


async def test_a_repair_step_is_timed_when_it_ends(
    metrics_app: RunningApp, clock: FakeClock
) -> None:
    app = metrics_app
    project = await create_project(app.client)
    cluster = await ready_cluster(app, size=1)
    node = (await nodes_of(app, cluster["id"]))[0]
    labels = {"step": "proposed", "action": "reset_gpu"}
    count = REGISTRY.get_sample_value("gpufleet_repair_step_duration_seconds_count", labels)
    total = REGISTRY.get_sample_value("gpufleet_repair_step_duration_seconds_sum", labels)
    repair_id = await _repair(
        app, cluster_id=cluster["id"], node_id=node["id"], status=RepairStatus.PROPOSED,
        action="reset_gpu", created=clock.now(),
    )  # fmt: skip
    clock.advance(90)
    async with app.ctx.db.transaction() as session:
        repair = await session.scalar(select(RepairRow).where(RepairRow.id == repair_id))
        assert repair is not None
        changed = switch_repair_status(
            session, repair=repair, project_id=project["id"], node_name=node["name"],
            target=RepairStatus.APPROVED, actor="user:test", reason="test", now=clock.now(),
        )  # fmt: skip
    assert changed
    after = REGISTRY.get_sample_value("gpufleet_repair_step_duration_seconds_count", labels)
    after_sum = REGISTRY.get_sample_value("gpufleet_repair_step_duration_seconds_sum", labels)
    assert grown(count, after) == 1
    assert grown(total, after_sum) == pytest.approx(90)
    _, series = await scrape(app)
    assert one(series, "gpufleet_repair_step_duration_seconds_count", **labels) == after


class _Flaky(LoopService):
    name = "metrics-test"

    def __init__(self, deps: LoopDeps, *, stop: asyncio.Event) -> None:
        super().__init__(deps, interval_s=0.01)
        self.calls = 0
        self.stop = stop

    async def run_once(self) -> None:
        self.calls += 1
        if self.calls == 3:
            self.stop.set()
        if self.calls == 2:
            raise RuntimeError("a pass that fails")


class _Standby(_Flaky):
    """Stops itself after two lease checks (it never gets the lease)."""

    checks = 0

    async def holds_lease(self) -> bool:
        held = await super().holds_lease()
        self.checks += 1
        if self.checks == 2:
            self.stop.set()
        return held


async def test_loop_passes_are_counted_timed_and_stamped(metrics_app: RunningApp) -> None:
    ctx = metrics_app.ctx
    deps = LoopDeps(db=ctx.db, clock=ctx.clock, owner="metrics-test", lease_ttl_s=15)
    name = {"loop": "metrics-test"}

    def sample(metric: str, **extra: str) -> float:
        return REGISTRY.get_sample_value(metric, {**name, **extra}) or 0.0

    ok, failed = (
        sample("gpufleet_loop_passes_total", result="ok"),
        sample("gpufleet_loop_passes_total", result="failed"),
    )
    timed = sample("gpufleet_loop_pass_duration_seconds_count")
    stop = asyncio.Event()
    await asyncio.wait_for(_Flaky(deps, stop=stop).run(stop), timeout=10)
    assert sample("gpufleet_loop_passes_total", result="ok") == ok + 2
    assert sample("gpufleet_loop_passes_total", result="failed") == failed + 1
    assert sample("gpufleet_loop_pass_duration_seconds_count") == timed + 3
    assert sample("gpufleet_loop_lag_seconds_count") >= 3
    assert sample("gpufleet_loop_interval_seconds") == 0.01
    last = sample("gpufleet_loop_last_pass_timestamp_seconds")
    assert abs(last - dt.datetime.now(dt.UTC).timestamp()) < 60
    # A replica that does not hold the lease counts standby passes, and runs none.
    held = await acquire_lease(
        ctx.db, name="loop:metrics-test", owner="leader", ttl_s=60, now=ctx.clock.now()
    )
    assert held is not None
    other = LoopDeps(db=ctx.db, clock=ctx.clock, owner="another-replica", lease_ttl_s=15)
    standby = sample("gpufleet_loop_passes_total", result="standby")
    stop_other = asyncio.Event()
    loop = _Standby(other, stop=stop_other)
    await asyncio.wait_for(loop.run(stop_other), timeout=10)
    assert loop.calls == 0
    assert sample("gpufleet_loop_passes_total", result="standby") == standby + 2
