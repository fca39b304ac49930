"""The real CLI against an in-process app: each command runs in a worker thread (typer's
``CliRunner``), and its client's requests go to the app on the test's event loop, where
the app (and whatever else the test runs) lives.

    async with running_app(settings) as app:
        cli = InProcessCli(app, asyncio.get_running_loop())
        monkeypatch.setattr(config, "make_client", cli.make_client)
        result = await cli.run("clusters", "list", env={...})   # typer's (click's) Result
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
from fastapi import FastAPI
from typer.testing import CliRunner, Result

from gpufleet.cli.config import ENV_TOKEN, ENV_URL, Credentials
from gpufleet.cli.main import app as cli_app
from gpufleet.client.api import ApiClient
from gpufleet.server.app import build_loops
from gpufleet.server.workers.provisioning import ProvisioningLoop
from gpufleet.testing.app import RunningApp

BASE_URL = "http://test"


class AppBridge(httpx.BaseTransport):
    """A synchronous transport that hands each request to the app, on ``loop``."""

    def __init__(self, app: FastAPI, loop: asyncio.AbstractEventLoop) -> None:
        self._app, self._loop = app, loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self._app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
                forwarded = httpx.Request(
                    request.method, request.url, headers=request.headers, content=request.read()
                )
                return await client.send(forwarded)

        answer = asyncio.run_coroutine_threadsafe(send(), self._loop).result(timeout=60)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


class InProcessCli:
    """``gpufleet ...`` against ``app``; the caller patches ``config.make_client`` with
    ``make_client`` for the test's duration."""

    def __init__(self, app: RunningApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop

    def make_client(self, creds: Credentials) -> ApiClient:
        return ApiClient(
            base_url=creds.url, token=creds.token, transport=AppBridge(self.app.app, self.loop)
        )

    def env(self, token: str | None = None) -> dict[str, str]:
        """The variables that point the CLI at the app (as the owner by default)."""
        return {ENV_URL: BASE_URL, ENV_TOKEN: token or self.app.owner_token}

    async def run(self, *args: str, env: Mapping[str, str] | None = None) -> Result:
        """Run the command; prints it, its exit code and its output (for failures)."""
        full = {**self.env(), **(env or {})}

        def invoke() -> Result:
            result = CliRunner().invoke(cli_app, list(args), env=full)
            print(f"$ gpufleet {' '.join(args)}  (exit {result.exit_code})")
            print(result.stdout + result.stderr)
            return result

        return await asyncio.to_thread(invoke)


async def ready_cluster(
    app: RunningApp,
    *,
    project: str,
    name: str,
    scheduler: str = "sim",
    size: int = 1,
    node_prefix: str | None = None,
) -> dict[str, Any]:
    """A cluster on the sim provider, made ready by the provisioning loop alone (no other
    loop runs: a Slurm cluster's would look for a Slurm). Its project must exist."""
    created = await app.client.post(
        "/api/v1/clusters",
        json={
            "project": project,
            "name": name,
            "scheduler": scheduler,
            "provider": "sim",
            "size": size,
            "acceptance_tests": False,
            "node_prefix": node_prefix,
        },
    )
    if created.status_code != 201:
        raise AssertionError(f"cluster {name} not created: {created.text}")
    cluster: dict[str, Any] = created.json()
    loops = [loop for loop in build_loops(app.ctx) if isinstance(loop, ProvisioningLoop)]
    for _ in range(5):
        for loop in loops:
            await loop.run_once()
        status = (await app.client.get(f"/api/v1/clusters/{cluster['id']}/status")).json()
        if status["status"] == "ready":
            return cluster
    raise AssertionError(f"cluster {name} never became ready: {status}")
