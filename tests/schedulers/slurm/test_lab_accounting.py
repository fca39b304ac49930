"""Durable accounting on the real lab: jobs of three users are copied from sacct exactly
once, with slurmdbd restarted and gpufleet killed (SIGKILL) midway."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from gpufleet.server.db.tables import JobRow
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow

USERS = ("nobody", "daemon", "bin")  # three real users root may submit as (sbatch --uid)


def _wait(check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s")


class Jobs:
    """The job rows gpufleet holds, read straight from its database (sync drivers)."""

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        sync = {"sqlite+aiosqlite": "sqlite", "postgresql+asyncpg": "postgresql+psycopg"}
        self.engine = create_engine(url.set(drivername=sync[url.drivername]))

    def rows(self, ids: list[str]) -> list[JobRow]:
        with Session(self.engine) as session:
            found = session.scalars(select(JobRow).where(JobRow.scheduler_job_id.in_(ids)))
            return list(found)


def _submit(lab: SlurmLab, round_: int) -> list[str]:
    ids = []
    for i, user in enumerate(USERS):
        node = lab.node_names[i % lab.nodes]
        out = lab.run(
            "sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", f"--uid={user}",
            f"--gres=gpu:{i + 1}", "-w", node, f"--job-name=acct-{round_}-{user}",
            "--wrap=sleep 1",
        )  # fmt: skip
        ids.append(out.stdout.strip().split(";")[0])
    return ids


def _sacct_users(lab: SlurmLab, ids: list[str]) -> dict[str, str]:
    out = lab.run("sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,User,State")
    done = {}
    for line in out.stdout.splitlines():
        job_id, user, state = line.split("|")
        if state not in ("RUNNING", "PENDING"):
            done[job_id] = user
    return done


def test_jobs_of_three_users_exactly_once_across_slurmdbd_and_gpufleet_restarts(
    slurm_lab: SlurmLab, database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **fast_sim_server_env(data_dir=tmp_path / "data", port=port, token_file=tmp_path / "tok"),
        "GPUFLEET_DATABASE_URL": database_url,
        "GPUFLEET_SLURM_CONF": str(slurm_lab.slurm_conf),
        "GPUFLEET_ACCOUNTING_INTERVAL_S": "1",
    }
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(args=["server"], env=env, log_path=tmp_path / "server.log")
    jobs = Jobs(database_url)
    try:
        server.start()
        server.wait_ready(url)
        token = (tmp_path / "tok").read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=20)
        assert api.post("/api/v1/projects", json={"name": "ml"}).status_code == 201
        created = api.post("/api/v1/clusters", json={
            "project": "ml", "name": "lab", "scheduler": "slurm", "provider": "sim",
            "size": slurm_lab.nodes, "gpus_per_node": slurm_lab.gpus, "acceptance_tests": False,
            "node_prefix": "lab-", "first_node_index": 1,
        })  # fmt: skip
        assert created.status_code == 201, created.text
        started = dt.datetime.now(dt.UTC)

        first = _submit(slurm_lab, 1)
        _wait(lambda: len(jobs.rows(first)) == 3, timeout_s=60, what="round 1 copied")

        second = _submit(slurm_lab, 2)
        slurm_lab.restart_slurmdbd()  # the jobs end while their records wait in slurmctld
        third = _submit(slurm_lab, 3)

        server.kill()  # SIGKILL mid-copy; round 4 finishes while gpufleet is down
        fourth = _submit(slurm_lab, 4)
        every = first + second + third + fourth
        _wait(lambda: set(_sacct_users(slurm_lab, every).values()) == set(USERS)
              and len(_sacct_users(slurm_lab, every)) == len(every)
              and "root" not in _sacct_users(slurm_lab, every).values(),
              timeout_s=60, what="sacct has every job with its real user")  # fmt: skip
        server.start()
        server.wait_ready(url)
        _wait(lambda: len(jobs.rows(every)) == len(every), timeout_s=90, what="all copied")

        rows = jobs.rows(every)
        assert sorted(r.scheduler_job_id for r in rows) == sorted(every)  # no gap, no twin
        sacct = _sacct_users(slurm_lab, every)
        for row in rows:
            assert row.user_name == sacct[row.scheduler_job_id], row
            assert row.state == "COMPLETED" and row.exit_code == 0
            assert row.ended_at is not None and row.started_at is not None
        by_user = {u: sorted(r.gpus for r in rows if r.user_name == u) for u in USERS}
        assert by_user == {"nobody": [1] * 4, "daemon": [2] * 4, "bin": [3] * 4}

        usage = api.get("/api/v1/usage/gpu-hours", params={
            "group_by": "user", "since": started.isoformat(),
        })  # fmt: skip
        assert usage.status_code == 200, usage.text
        users = {row["user"] for row in usage.json()["rows"]}
        assert set(USERS) <= users
    finally:
        server.stop()
        jobs.engine.dispose()
