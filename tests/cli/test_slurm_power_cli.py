"""``gpufleet slurm resume|suspend HOSTLIST``, Slurm's ResumeProgram/SuspendProgram.

Against the real app, in process (the CLI in a worker thread, its requests to the app on
the test's loop), on SQLite and PostgreSQL: a Slurm cluster in autoscaling mode slurm,
the cluster named by ``GPUFLEET_CLUSTER`` as the wrapper script sets it, the resume file
recorded from Slurm 22.05. And without a server: the log line, and exit 2 for bad input
before anything is sent (a call would exit 1: the URL has nothing listening)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from gpufleet.cli import config
from gpufleet.cli.main import app as cli_app
from gpufleet.cli.slurm_power import Outcome, append_log, format_log_line, job_bodies
from gpufleet.client.api import ApiClient
from gpufleet.core.autoscaling import PowerAction
from gpufleet.schedulers.slurm.power import parse_resume_file
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.cli_app import InProcessCli, ready_cluster
from gpufleet.testing.processes import free_port

FIXTURE = Path(__file__).parents[1] / "fixtures" / "slurm" / "resume-file-22.05.json"
TOKEN = "gft_power-canary-5be1-do-not-log"
T0 = dt.datetime(2026, 12, 4, 16, 40, 29, 123456, tzinfo=dt.UTC)


def _line(log: Path) -> str:
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---------------------------------------------------------------------------- pure


def test_the_log_line_has_time_action_nodes_jobs_and_the_action_id() -> None:
    line = format_log_line(
        at=T0, action=PowerAction.RESUME, cluster="hpc", hostlist="cloud[1-3]", nodes=3,
        jobs=["1", "2"], outcome=Outcome(0, action_id="01a2-act"),
    )  # fmt: skip
    assert line == (
        "2026-12-04T16:40:29.123Z resume cluster=hpc hostlist=cloud[1-3] nodes=3 jobs=1,2 "
        "exit=0 action=01a2-act"
    )
    nothing = format_log_line(
        at=T0, action=PowerAction.SUSPEND, cluster="hpc", hostlist="cloud3", nodes=1, jobs=[],
        outcome=Outcome(0),
    )  # fmt: skip
    assert nothing.endswith(
        'suspend cluster=hpc hostlist=cloud3 nodes=1 jobs="" exit=0 action=none'
    )


def test_an_error_is_one_quoted_line_and_the_token_never_shows() -> None:
    line = format_log_line(
        at=T0, action=PowerAction.RESUME, cluster=None, hostlist="c[1-\nx", nodes=None,
        jobs=[str(i) for i in range(25)],
        outcome=Outcome(1, error=f"cannot reach http://h/?t={TOKEN}\nsecond line",
                        note="resume file gone"),
        secrets=[TOKEN],
    )  # fmt: skip
    assert "\n" not in line and TOKEN not in line
    assert 'cluster="" hostlist="c[1-\\nx" nodes=? jobs=0,1,2,' in line
    assert ",19,+5 exit=1 " in line
    assert 'error="cannot reach http://h/?t=***\\nsecond line" note="resume file gone"' in line


def test_a_log_file_that_cannot_be_opened_falls_back_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    assert not append_log(tmp_path / "file" / "power.log", "the line")
    assert capsys.readouterr().err.endswith("the line\n")
    assert append_log(tmp_path / "new" / "power.log", "one")
    assert append_log(tmp_path / "new" / "power.log", "two")
    assert (tmp_path / "new" / "power.log").read_text() == "one\ntwo\n"
    assert (tmp_path / "new" / "power.log").stat().st_mode & 0o777 == 0o640


def test_the_jobs_sent_are_the_resume_file_s() -> None:
    sent = job_bodies(parse_resume_file(FIXTURE.read_bytes()))
    assert sent == [
        {"job_id": "1", "nodes": ["cloud1"], "features": "", "partition": ""},
        {"job_id": "2", "nodes": ["cloud2", "cloud3"], "features": "", "partition": ""},
    ]
    assert job_bodies(None) == []


@dataclass
class Offline:
    """The CLI pointed at a port where nothing listens: any call it made exits 1."""

    tmp: Path
    log: Path

    def run(self, *args: str, **env: str) -> Result:
        full = {
            "GPUFLEET_URL": f"http://127.0.0.1:{free_port()}",
            "GPUFLEET_TOKEN": TOKEN,
            "GPUFLEET_CLUSTER": "hpc",
            "SLURM_RESUME_FILE": "",
            **env,
        }
        result = CliRunner().invoke(
            cli_app, ["slurm", *args, "--log-file", str(self.log)], env=full
        )
        print(f"$ gpufleet slurm {' '.join(args)}  (exit {result.exit_code})")
        print(result.stdout + result.stderr)
        assert TOKEN not in result.stdout + result.stderr
        if self.log.exists():
            assert TOKEN not in self.log.read_text()
        return result


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Offline:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))  # no saved login
    return Offline(tmp_path, tmp_path / "log" / "slurm-power.log")


@pytest.mark.parametrize(
    ("hostlist", "says"),
    [
        ("cloud[1-", "not a hostlist"),
        ("cloud[3-1]", "runs backwards"),
        ("cloud1;reboot", "not a node name"),
        ("cloud[1-99999]", "at most 4096"),
        ("", "empty"),
    ],
)
def test_a_bad_hostlist_exits_2_logged_before_any_call(
    offline: Offline, hostlist: str, says: str
) -> None:
    result = offline.run("resume", hostlist)
    assert result.exit_code == 2 and says in result.stderr
    line = _line(offline.log)
    assert " resume cluster=hpc " in line and " exit=2 error=" in line and says in line


def test_a_resume_file_that_is_not_one_exits_2_logged_before_any_call(offline: Offline) -> None:
    bad = offline.tmp / "resume.json"
    bad.write_text('{"jobs": [{"job_id": "seven"}]}')
    result = offline.run("resume", "cloud1", SLURM_RESUME_FILE=str(bad))
    assert result.exit_code == 2 and "not a Slurm job id" in result.stderr
    assert " exit=2 " in _line(offline.log)


def test_no_cluster_or_no_credentials_exits_2(offline: Offline) -> None:
    nameless = offline.run("suspend", "cloud1", GPUFLEET_CLUSTER="")
    assert nameless.exit_code == 2 and "GPUFLEET_CLUSTER" in nameless.stderr
    tokenless = offline.run("suspend", "cloud1", GPUFLEET_TOKEN="")
    assert tokenless.exit_code == 2 and "no API token" in tokenless.stderr
    lines = offline.log.read_text().splitlines()
    assert len(lines) == 2 and all(" exit=2 " in line for line in lines)


def test_an_unreachable_server_exits_1_and_a_vanished_resume_file_is_only_a_note(
    offline: Offline,
) -> None:
    gone = offline.tmp / "gone.json"  # slurmctld stopped: the file is gone
    result = offline.run("resume", "cloud[1-2]", SLURM_RESUME_FILE=str(gone))
    assert result.exit_code == 1 and "cannot reach the gpufleet server" in result.stderr
    line = _line(offline.log)
    assert " hostlist=cloud[1-2] nodes=2 " in line and " exit=1 error=" in line
    assert f'note="resume file {gone} unreadable' in line


def test_an_answer_not_understood_still_leaves_a_log_line_and_exits_1(
    offline: Offline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever fails, Slurm's only record is the log line: a server that answers
    something else than the API's shape is exit 1, logged."""
    cluster = {"items": [{"id": "c1"}], "next_cursor": None}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/power"):
            return httpx.Response(202, json={"accepted": True})
        return httpx.Response(200, json=cluster)

    monkeypatch.setattr(
        config,
        "make_client",
        lambda creds: ApiClient(
            base_url=creds.url, token=creds.token, transport=httpx.MockTransport(answer)
        ),
    )
    result = offline.run("resume", "cloud1")
    assert result.exit_code == 1 and "ValidationError" in result.stderr
    line = _line(offline.log)
    assert " exit=1 error=" in line and "ValidationError" in line


# ---------------------------------------------------------------------------- the app


@dataclass
class Fleet:
    app: RunningApp
    cli: InProcessCli
    hpc: dict[str, Any]
    tmp: Path
    log: Path

    async def power(self, *args: str, **env: str) -> Any:
        """``gpufleet slurm ARGS`` as slurmctld runs it through the wrapper script: the
        cluster in GPUFLEET_CLUSTER, the server and token from the environment."""
        full = {"GPUFLEET_CLUSTER": "hpc", "SLURM_RESUME_FILE": "", **env}
        result = await self.cli.run("slurm", *args, "--log-file", str(self.log), env=full)
        assert self.app.owner_token not in result.stdout + result.stderr
        assert self.app.owner_token not in self.log.read_text()
        return result

    async def actions(self) -> list[dict[str, Any]]:
        path = f"/api/v1/clusters/{self.hpc['id']}/autoscale/actions"
        items: list[dict[str, Any]] = (await self.app.client.get(path)).json()["items"]
        return items

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
async def fleet(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Fleet]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    settings = make_settings(data_dir=tmp_path / "data", database_url=database_url)
    async with running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        hpc = await ready_cluster(app, project="ml", name="hpc", scheduler="slurm")
        await ready_cluster(app, project="ml", name="train")
        mode = await app.client.put(
            f"/api/v1/clusters/{hpc['id']}/autoscale",
            json={"mode": "slurm", "min_nodes": 0, "max_nodes": 8},
        )
        assert mode.status_code == 200, mode.text
        cli = InProcessCli(app, asyncio.get_running_loop())
        monkeypatch.setattr(config, "make_client", cli.make_client)
        yield Fleet(app, cli, hpc, tmp_path, tmp_path / "slurm-power.log")


async def test_resume_with_the_recorded_resume_file_is_accepted_at_once(fleet: Fleet) -> None:
    resume_file = fleet.tmp / "slurm-resume.json"
    shutil.copy(FIXTURE, resume_file)
    result = await fleet.power("resume", "cloud[1-3]", SLURM_RESUME_FILE=str(resume_file))
    assert result.exit_code == 0
    [action] = await fleet.actions()
    assert f"resume 3 node(s): accepted, action {action['id']} (acting)" in result.stdout
    assert (action["kind"], action["source"], action["status"]) == ("scale_up", "slurm", "acting")
    assert action["nodes"] == ["cloud1", "cloud2", "cloud3"] and action["count"] == 3
    assert action["reasons"] == ["Slurm resumes cloud1, cloud2, cloud3", "for job(s) 1, 2"]
    [line] = fleet.lines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z resume cluster=hpc hostlist=cloud\[1-3\] "
        rf"nodes=3 jobs=1,2 exit=0 action={action['id']}",
        line,
    ), line

    # slurmctld may run it twice (after a restart): nothing more to do, still exit 0
    again = await fleet.power("resume", "cloud[1-2]")
    assert again.exit_code == 0 and "accepted, nothing to do" in again.stdout
    assert ' jobs="" exit=0 action=none note="nothing to do: ' in fleet.lines()[-1]
    assert len(await fleet.actions()) == 1


async def test_suspend_gives_the_nodes_back(fleet: Fleet) -> None:
    nobody = await fleet.power("suspend", "cloud9")  # never resumed: nothing to give back
    assert nobody.exit_code == 0 and "nothing to do" in nobody.stdout
    assert (await fleet.power("resume", "cloud[1-2]")).exit_code == 0
    result = await fleet.power("suspend", "cloud2", "--reason", "idle past SuspendTime")
    assert result.exit_code == 0, result.stderr
    newest = (await fleet.actions())[0]
    assert (newest["kind"], newest["source"], newest["nodes"]) == (
        "scale_down",
        "slurm",
        ["cloud2"],
    )
    assert fleet.lines()[-1].endswith(
        f'suspend cluster=hpc hostlist=cloud2 nodes=1 jobs="" exit=0 action={newest["id"]}'
    )


async def test_the_server_s_refusals_exit_2_and_are_logged(fleet: Fleet) -> None:
    wrong = await fleet.power("resume", "cloud1", "--cluster", "train")  # not a Slurm cluster
    assert wrong.exit_code == 2
    assert "power saving needs a Slurm cluster" in " ".join(wrong.stderr.split())
    unknown = await fleet.power("resume", "cloud1", GPUFLEET_CLUSTER="nope")
    assert unknown.exit_code == 2 and "no cluster named 'nope'" in unknown.stderr
    first, second = fleet.lines()
    assert " resume cluster=train " in first and " exit=2 error=" in first
    assert " resume cluster=nope " in second and "no cluster named" in second
    assert await fleet.actions() == []


async def test_a_member_s_token_is_refused_with_exit_2(fleet: Fleet) -> None:
    client = fleet.app.client
    assert (await client.post("/api/v1/users", json={"name": "bob"})).status_code == 201
    added = await client.post("/api/v1/projects/ml/members", json={"user": "bob", "role": "member"})
    assert added.status_code == 201, added.text
    made = await client.post(
        "/api/v1/tokens", json={"name": "slurm", "project": "ml", "user": "bob"}
    )
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    result = await fleet.power("resume", "cloud1", GPUFLEET_TOKEN=token)
    assert result.exit_code == 2, result.stderr
    assert token not in result.stdout + result.stderr + fleet.log.read_text()
    assert " exit=2 error=" in fleet.lines()[-1]
    assert json.dumps(await fleet.actions()) == "[]"
