"""``gpufleet login --oidc``: the device authorization grant end to end, CLI as a user runs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from idp_browser import act_at_idp
from oidc_env import OidcAppFactory
from typer.testing import CliRunner

from gpufleet.cli import config
from gpufleet.cli.main import app as cli_app
from gpufleet.client.api import ApiClient
from gpufleet.testing.app import RunningApp
from gpufleet.testing.processes import RUN_CLI, free_port


@contextlib.asynccontextmanager
async def serving(app: RunningApp) -> AsyncIterator[str]:
    """The running app on a real loopback port (its lifespan is already running)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app.app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)  # real sleep: uvicorn has no event to await for "started"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_cli_device_login_end_to_end(
    oidc_app_factory: OidcAppFactory, idp_client: httpx.AsyncClient, tmp_path: Path
) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("GPUFLEET_TOKEN", None)
    async with oidc_app_factory() as app, serving(app) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            RUN_CLI,
            "login",
            "--url",
            url,
            "--oidc",
            "--output",
            "json",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert proc.stderr is not None
        prompt = b""
        while b"confirm the code" not in prompt:
            line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
            assert line, f"the CLI stopped before showing a code: {prompt!r}"
            prompt += line
        where = re.search(rb"open (\S+)", prompt)
        assert where is not None, prompt
        # The person opens the link in a browser, logs in as bob and approves.
        page = await act_at_idp(idp_client, where.group(1).decode(), login="bob")
        assert isinstance(page, httpx.Response) and page.status_code == 200, page
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, (out, err)
    me = json.loads(out)
    assert me["user"]["name"] == "bob"
    assert [m["role"] for m in me["memberships"]] == ["member"]  # ml-users → ml:member
    saved = json.loads((tmp_path / "config" / "gpufleet" / "credentials.json").read_text())
    assert saved["url"] == url and saved["token"].startswith("gpf_")
    assert (tmp_path / "config" / "gpufleet" / "credentials.json").stat().st_mode & 0o077 == 0


def test_cli_without_oidc_on_the_server_explains_the_token_way(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/auth/config"
        return httpx.Response(200, json={"oidc": False})

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setattr(
        config,
        "make_client",
        lambda creds: ApiClient(
            base_url=creds.url, token=creds.token, transport=httpx.MockTransport(handler)
        ),
    )
    result = CliRunner().invoke(cli_app, ["login", "--url", "http://gpufleet.test", "--oidc"])
    assert result.exit_code == 2, result.output
    assert "gpufleet tokens create" in result.output
    assert not (tmp_path / "gpufleet" / "credentials.json").exists()


def test_cli_when_the_idp_has_no_device_flow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "oidc": True,
                "issuer": "https://idp.example",
                "cli_client_id": "gpufleet-cli",
                "scopes": "openid",
                "device_authorization_endpoint": None,
                "token_endpoint": "https://idp.example/token",
            },
        )

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setattr(
        config,
        "make_client",
        lambda creds: ApiClient(
            base_url=creds.url, token=creds.token, transport=httpx.MockTransport(handler)
        ),
    )
    result = CliRunner().invoke(cli_app, ["login", "--url", "http://gpufleet.test", "--oidc"])
    assert result.exit_code == 2, result.output
    assert "offers no device login" in result.output
    assert "personal API token" in result.output
