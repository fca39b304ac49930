"""Durable accounting on the sim scheduler: finished jobs copied once, through scheduler
outages and restarts; GPU-hours by project, user and day."""

from __future__ import annotations

from pathlib import Path

from apihelpers import error_of
from sqlalchemy import func, select

from gpufleet.server.db.tables import JobRow
from gpufleet.server.workers.accounting import AccountingLoop
from gpufleet.server.workers.base import LoopDeps
from gpufleet.testing.app import RunningApp
from gpufleet.testing.fleet import sim_fleet


async def _job_rows(app: RunningApp) -> int:
    async with app.ctx.db.session() as session:
        return int(await session.scalar(select(func.count()).select_from(JobRow)) or 0)


async def test_jobs_of_three_users_are_copied_once_through_an_outage_and_a_restart(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=3) as fleet:
        cid = fleet.cluster["id"]
        for user, hours in (("alice", 1.0), ("bob", 2.0), ("carol", 0.5)):
            fleet.world.submit_job(
                cluster_id=cid, node_count=1, gpus_per_node=8, duration_s=hours * 3600,
                user=user, account=f"{user}-lab",
            )  # fmt: skip
        await fleet.tick()
        assert len(fleet.world.running_jobs(cluster_id=cid)) == 3
        await fleet.tick(1.5 * 3600)  # alice and carol are done, bob still runs
        fleet.world.set_scheduler_available(False)  # slurmdbd down: sacct fails
        await fleet.tick(3600)  # bob ends while accounting cannot be read
        assert await _job_rows(fleet.app) == 2
        fleet.world.set_scheduler_available(True)
        await fleet.tick()
        assert await _job_rows(fleet.app) == 3  # the gap is filled
        # gpufleet restarts: a fresh loop copies nothing twice.
        ctx = fleet.app.ctx
        again = AccountingLoop(
            LoopDeps(db=ctx.db, clock=fleet.clock, owner="replica-2", lease_ttl_s=10),
            interval_s=1,
            drivers=ctx.drivers,
        )
        await again.run_once()
        await again.run_once()
        assert await _job_rows(fleet.app) == 3 and again.copied == 0

        usage = await fleet.app.client.get(
            "/api/v1/usage/gpu-hours", params={"group_by": ["project", "user"]}
        )
        assert usage.status_code == 200, usage.text
        body = usage.json()
        by_user = {r["user"]: r["gpu_hours"] for r in body["rows"]}
        assert by_user == {"alice": 8.0, "bob": 16.0, "carol": 4.0}
        assert {r["project"] for r in body["rows"]} == {"ml"}
        assert body["total_gpu_hours"] == 28.0 and body["jobs"] == 3
        daily = await fleet.app.client.get(
            "/api/v1/usage/gpu-hours", params={"group_by": "day", "cluster": cid}
        )
        assert sum(r["gpu_hours"] for r in daily.json()["rows"]) == 28.0
        assert all(len(r["day"]) == 10 for r in daily.json()["rows"])
        # A row carries the keys grouped by and nothing for the others (not even null).
        assert all(set(r) == {"day", "gpu_hours", "jobs"} for r in daily.json()["rows"])
        assert daily.json()["group_by"] == ["day"]


async def test_bad_usage_queries_are_refused(database_url: str, tmp_path: Path) -> None:
    async with sim_fleet(database_url, tmp_path, size=1) as fleet:
        bad = await fleet.app.client.get("/api/v1/usage/gpu-hours", params={"group_by": "planet"})
        assert bad.status_code == 422 and error_of(bad)["field"].startswith("group_by")
        backwards = await fleet.app.client.get(
            "/api/v1/usage/gpu-hours",
            params={"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        )
        assert backwards.status_code == 422 and error_of(backwards)["field"] == "until"


async def test_a_record_the_scheduler_corrects_later_is_copied_again(
    database_url: str, tmp_path: Path
) -> None:
    # slurmdbd 22.05, restarted while jobs end, first reports User=root and a little later
    # the job's real user: the copy follows the correction instead of keeping the first.
    async with sim_fleet(database_url, tmp_path, size=1) as fleet:
        cid = fleet.cluster["id"]
        fleet.world.submit_job(
            cluster_id=cid, node_count=1, gpus_per_node=8, duration_s=600,
            user="root", account="root",
        )  # fmt: skip
        await fleet.tick()
        await fleet.tick(900)
        async with fleet.app.ctx.db.session() as session:
            row = (await session.scalars(select(JobRow))).one()
        assert row.user_name == "root"
        (record,) = fleet.world._workload.ended_since(row.ended_at, [cid])
        record.user, record.account = "alice", "alice-lab"
        await fleet.tick(5)
        async with fleet.app.ctx.db.session() as session:
            rows = list(await session.scalars(select(JobRow)))
        assert [(r.user_name, r.account) for r in rows] == [("alice", "alice-lab")]
