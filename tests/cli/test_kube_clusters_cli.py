"""`gpufleet clusters create --scheduler kubernetes --kubeconfig FILE [--context NAME]`
(and `--in-cluster`), and `clusters show`, against the real app and the Kubernetes API
emulator (``gpufleet.testing.kube_api``), in process: the CLI runs in a worker thread
(typer's CliRunner) and its client's requests are sent to the app on the test's event
loop, where the emulator runs too. A file that cannot be read, or options that do not go
together, exit 2 before anything is sent; the server's 422 exits 2 with its message."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gpufleet.cli import config
from gpufleet.server.db.tables import ClusterRow, CredentialRow
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.cli_app import InProcessCli
from gpufleet.testing.kube_api import RunningKubeApi, kube_api
from gpufleet.testing.processes import free_port

KEY = base64.urlsafe_b64encode(bytes(range(7, 39))).decode()
TOKEN = "kube-cli-canary-81c2-TOKEN-do-not-leak"


@dataclass
class Lab:
    app: RunningApp
    api: RunningKubeApi
    tmp: Path
    run: Callable[..., Awaitable[Any]]

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)

    async def stored(self) -> tuple[int, int]:
        async with self.app.ctx.db.session() as session:
            clusters = await session.scalar(select(func.count()).select_from(ClusterRow))
            credentials = await session.scalar(select(func.count()).select_from(CredentialRow))
        return int(clusters or 0), int(credentials or 0)


@pytest.fixture
async def lab(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Lab]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("COLUMNS", "200")  # rich would otherwise wrap at 80
    settings = make_settings(data_dir=tmp_path / "data", database_url=database_url, secret_key=KEY)
    async with kube_api() as api, running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        cli = InProcessCli(app, asyncio.get_running_loop())
        monkeypatch.setattr(config, "make_client", cli.make_client)

        async def run(*args: str) -> Any:
            result = await cli.run(*args)
            assert TOKEN not in result.stdout + result.stderr
            return result

        yield Lab(app=app, api=api, tmp=tmp_path, run=run)


def _flat(text: str) -> str:
    return " ".join(text.split())


CREATE = ("clusters", "create", "kube", "-p", "ml", "--size", "1", "--scheduler", "kubernetes")


async def test_create_with_a_kubeconfig_then_show(lab: Lab) -> None:
    kubeconfig = lab.file("kubeconfig", lab.api.kubeconfig(token=TOKEN))
    created = await lab.run(*CREATE, "--kubeconfig", kubeconfig, "--context", "lab")
    assert created.exit_code == 0
    shown = await lab.run("clusters", "show", "kube", "-p", "ml")
    assert shown.exit_code == 0
    out = _flat(shown.stdout)
    assert "scheduler kubernetes" in out and f"api server {lab.api.url}" in out
    assert "context lab" in out and "stored sealed" in out
    assert await lab.stored() == (1, 1)


async def test_a_file_that_cannot_be_read_or_is_refused_exits_2_and_nothing_is_stored(
    lab: Lab,
) -> None:
    missing = await lab.run(*CREATE, "--kubeconfig", str(lab.tmp / "nope"))
    assert missing.exit_code == 2 and "cannot read it" in missing.stderr
    not_yaml = await lab.run(*CREATE, "--kubeconfig", lab.file("bad", "clusters: [unclosed"))
    assert not_yaml.exit_code == 2 and "not YAML" in not_yaml.stderr
    good = lab.api.kubeconfig(token=TOKEN)
    unknown = await lab.run(*CREATE, "--kubeconfig", lab.file("k", good), "--context", "prod")
    assert unknown.exit_code == 2 and "no context 'prod'" in _flat(unknown.stderr)
    closed = f"http://127.0.0.1:{free_port()}"
    unreachable = lab.file("far", good.replace(lab.api.url, closed))
    far = await lab.run(*CREATE, "--kubeconfig", unreachable)
    assert far.exit_code == 2
    assert f"cannot reach the Kubernetes API at {closed}" in _flat(far.stderr)
    both = await lab.run(*CREATE, "--kubeconfig", lab.file("k", good), "--in-cluster")
    assert both.exit_code == 2 and "not both" in both.stderr
    neither = await lab.run(*CREATE)
    assert neither.exit_code == 2 and "--kubeconfig FILE" in neither.stderr
    slurm = await lab.run(*CREATE[:-1], "slurm", "--kubeconfig", lab.file("k", good))
    assert slurm.exit_code == 2 and "--scheduler kubernetes only" in slurm.stderr
    assert await lab.stored() == (0, 0)
