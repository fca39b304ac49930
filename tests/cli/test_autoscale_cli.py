"""``gpufleet clusters autoscale show|set|actions`` against the real app, in process (the
CLI in a worker thread, its requests to the app on the test's loop), on SQLite and
PostgreSQL; and the pure parts (durations, bounds), where a value the CLI cannot read
exits 2 before anything is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli import config
from gpufleet.cli.autoscale import fmt_duration, parse_bound, parse_duration
from gpufleet.cli.main import app as cli_app
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.cli_app import InProcessCli, ready_cluster
from gpufleet.testing.processes import free_port


def _flat(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("7d", 7 * 86400.0),
        ("0", 0.0),
        ("1.5m", 90.0),
        (" 2 m ", 120.0),
        ("2M", 120.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, option="--x") == seconds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not a duration"),
        ("2x", "not a duration"),
        ("m", "not a duration"),
        ("2m junk", "not a duration"),
        ("nan", "not a duration"),
        ("inf", "not a duration"),
        ("-5", "outside 0s..7d"),
        ("8d", "outside 0s..7d"),
    ],
)
def test_a_bad_duration_names_the_option_and_the_forms_taken(text: str, says: str) -> None:
    with pytest.raises(typer.BadParameter) as raised:
        parse_duration(text, option="--up-cooldown")
    assert says in str(raised.value) and raised.value.param_hint == "--up-cooldown"


def test_bounds_and_shown_durations() -> None:
    assert parse_bound("16", option="--max") == 16
    assert parse_bound("none", option="--max") is None
    assert parse_bound("NONE", option="--max") is None
    for bad in ("-1", "two", "1.5", ""):
        with pytest.raises(typer.BadParameter, match="'none' to remove it"):
            parse_bound(bad, option="--min")
    assert [fmt_duration(s) for s in (120, 1800, 5400, 86400, 90.5, 0)] == [
        "2m", "30m", "1h30m", "1d", "90.5s", "0s",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["train"], "nothing to change"),
        (["train", "--scale-up-after", "2x"], "not a duration"),
        (["train", "--down-cooldown", "9d"], "outside 0s..7d"),
        (["train", "--min", "-1"], "'none' to remove it"),
        (["train", "--max-step", "0"], "--max-step"),
        (["train", "--mode", "sometimes"], "--mode"),
    ],
)
def test_bad_input_exits_2_before_anything_is_sent(
    args: list[str], says: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    closed = f"http://127.0.0.1:{free_port()}"  # any call would exit 1: unreachable
    env = {"GPUFLEET_URL": closed, "GPUFLEET_TOKEN": "t", "COLUMNS": "200"}
    result = CliRunner().invoke(cli_app, ["clusters", "autoscale", "set", *args], env=env)
    assert result.exit_code == 2, result.output
    assert says in _flat(result.stderr)
    assert "cannot reach" not in result.stderr


# ---------------------------------------------------------------------------- the app


@dataclass
class Fleet:
    app: RunningApp
    cli: InProcessCli
    clusters: dict[str, dict[str, Any]]

    async def run(self, *args: str) -> Any:
        result = await self.cli.run(*args)
        assert self.app.owner_token not in result.stdout + result.stderr
        return result

    async def settings(self, name: str) -> dict[str, Any]:
        shown = await self.run("clusters", "autoscale", "show", name, "-p", "ml", "-o", "json")
        assert shown.exit_code == 0
        data: dict[str, Any] = json.loads(shown.stdout)
        return data


@pytest.fixture
async def fleet(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Fleet]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("COLUMNS", "200")  # rich would otherwise wrap at 80
    settings = make_settings(data_dir=tmp_path / "data", database_url=database_url)
    async with running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        clusters = {
            name: await ready_cluster(app, project="ml", name=name, scheduler=scheduler)
            for name, scheduler in (("train", "sim"), ("hpc", "slurm"))
        }
        cli = InProcessCli(app, asyncio.get_running_loop())
        monkeypatch.setattr(config, "make_client", cli.make_client)
        yield Fleet(app, cli, clusters)


async def test_show_the_defaults(fleet: Fleet) -> None:
    shown = await fleet.run("clusters", "autoscale", "show", "train", "-p", "ml")
    assert shown.exit_code == 0
    out = _flat(shown.stdout)
    assert f"cluster {fleet.clusters['train']['id']}" in out
    assert "mode off" in out and "nodes -" in out
    assert "scale up after 2m of GPU work pending" in out
    assert "scale down after 30m idle" in out
    assert "up cooldown 5m" in out and "down cooldown 10m" in out and "max step 8 node(s)" in out
    data = await fleet.settings("train")
    assert data["mode"] == "off" and data["min_nodes"] is None and data["max_step"] == 8


async def test_set_every_option_then_remove_a_bound(fleet: Fleet) -> None:
    changed = await fleet.run(
        "clusters", "autoscale", "set", "train", "-p", "ml", "--mode", "gpufleet",
        "--min", "2", "--max", "16", "--scale-up-after", "2m", "--scale-down-after", "30m",
        "--up-cooldown", "90s", "--down-cooldown", "1h", "--max-step", "4",
        "--reason", "night shift",
    )  # fmt: skip
    assert changed.exit_code == 0
    out = _flat(changed.stdout)
    assert "mode gpufleet" in out and "nodes 2..16" in out and "up cooldown 1m30s" in out
    data = await fleet.settings("train")
    assert {k: data[k] for k in ("mode", "min_nodes", "max_nodes", "max_step")} == {
        "mode": "gpufleet", "min_nodes": 2, "max_nodes": 16, "max_step": 4,
    }  # fmt: skip
    assert (data["scale_up_after_s"], data["scale_down_after_s"]) == (120.0, 1800.0)
    assert (data["up_cooldown_s"], data["down_cooldown_s"]) == (90.0, 3600.0)

    # only what is given changes
    again = await fleet.run("clusters", "autoscale", "set", "train", "--max", "8", "-o", "json")
    assert again.exit_code == 0
    assert json.loads(again.stdout)["max_nodes"] == 8
    assert json.loads(again.stdout)["up_cooldown_s"] == 90.0

    # a mode other than off needs both bounds: the server's 422, exit 2, nothing written
    refused = await fleet.run("clusters", "autoscale", "set", "train", "--min", "none")
    assert refused.exit_code == 2 and "needs both min_nodes and max_nodes" in refused.stderr
    assert (await fleet.settings("train"))["min_nodes"] == 2

    off = await fleet.run(
        "clusters", "autoscale", "set", "train", "--mode", "off", "--min", "none", "-o", "json"
    )  # fmt: skip
    assert off.exit_code == 0
    assert json.loads(off.stdout)["min_nodes"] is None
    assert json.loads(off.stdout)["max_nodes"] == 8


async def test_the_server_s_refusals_exit_2_with_its_message(fleet: Fleet) -> None:
    slurm_on_sim = await fleet.run(
        "clusters", "autoscale", "set", "train", "--mode", "slurm", "--min", "0", "--max", "2"
    )  # fmt: skip
    assert slurm_on_sim.exit_code == 2
    assert "mode slurm is for slurm clusters" in _flat(slurm_on_sim.stderr)
    upside_down = await fleet.run("clusters", "autoscale", "set", "hpc", "--min", "5", "--max", "2")
    assert upside_down.exit_code == 2 and "must not exceed max_nodes" in upside_down.stderr
    unknown = await fleet.run("clusters", "autoscale", "show", "nope")
    assert unknown.exit_code == 2 and "no cluster named 'nope'" in unknown.stderr
    assert (await fleet.settings("train"))["mode"] == "off"


async def test_actions_newest_first_with_their_first_reason(fleet: Fleet) -> None:
    empty = await fleet.run("clusters", "autoscale", "actions", "hpc")
    assert empty.exit_code == 0 and "no autoscaling actions yet" in empty.stdout
    mode = await fleet.run(
        "clusters", "autoscale", "set", "hpc", "--mode", "slurm", "--min", "0", "--max", "4"
    )  # fmt: skip
    assert mode.exit_code == 0
    power = f"/api/v1/clusters/{fleet.clusters['hpc']['id']}/power"
    for nodes in (["cloud1", "cloud2"], ["cloud3"]):
        body = {"action": "resume", "nodes": nodes, "jobs": [{"job_id": "7", "nodes": nodes}]}
        answer = await fleet.app.client.post(power, json=body)
        assert answer.status_code == 202, answer.text

    listed = await fleet.run("clusters", "autoscale", "actions", "hpc", "-p", "ml")
    assert listed.exit_code == 0
    header, *rows = listed.stdout.strip().splitlines()
    assert header.split() == [
        "WHEN", "KIND", "STATUS", "SOURCE", "COUNT", "NODES", "REASON", "ID",
    ]  # fmt: skip
    assert len(rows) == 2
    assert "scale_up" in rows[0] and " slurm " in rows[0] and "cloud3" in rows[0]
    assert "Slurm resumes cloud3" in rows[0]  # newest first
    assert "cloud1, cloud2" in rows[1] and "Slurm resumes cloud1, cloud2" in rows[1]

    one = await fleet.run("clusters", "autoscale", "actions", "hpc", "--limit", "1", "-o", "json")
    page = json.loads(one.stdout)
    assert [a["nodes"] for a in page["items"]] == [["cloud3"]]
    assert page["next_cursor"] is not None
    assert page["items"][0]["source"] == "slurm" and page["items"][0]["count"] == 1
