"""A real OpenID Provider (panva's oidc-provider, tests/oidc) on loopback, and the app
configured to log in through it. Without node or ``npm ci --prefix tests/oidc`` these
tests fail, never skip."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from oidc_env import (
    APP_URL,
    CALLBACK,
    CLIENT_SECRET,
    DEV_URL,
    GROUP_ROLES,
    OIDC_DIR,
    Idp,
    OidcAppFactory,
)

from gpufleet.core.clock import FakeClock, utcnow
from gpufleet.testing.app import RunningApp, make_settings, running_app
from gpufleet.testing.processes import free_port


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Idp]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed for the OIDC tests (Debian: apt-get install nodejs npm)")
    if not (OIDC_DIR / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("the test OIDC provider is not installed: run `npm ci --prefix tests/oidc`")
    workdir = tmp_path_factory.mktemp("oidc-provider")
    config = workdir / "config.json"
    config.write_text(
        json.dumps(
            {
                "redirect_uris": [CALLBACK, f"{DEV_URL}/api/v1/auth/callback"],
                "users": {
                    "alice": {
                        "email": "alice@example.test",
                        "email_verified": True,
                        "name": "Alice",
                        "preferred_username": "alice",
                        "groups": ["fleet-admins", "unmapped-group"],
                    },
                    "bob": {"preferred_username": "bob", "groups": ["ml-users"]},
                },
            }
        )
    )
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    log_path = workdir / "provider.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [node, str(OIDC_DIR / "provider.mjs"), str(port), str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"oidc-provider did not start:\n{log_path.read_text()}")
            time.sleep(0.05)  # real sleep: a real node process, started above, until it serves
        yield Idp(issuer=issuer)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def clock() -> FakeClock:
    # Real "now": the IdP signs with real time; tests move this clock forward only.
    return FakeClock(start=utcnow())


@pytest.fixture
def oidc_app_factory(
    database_url: str, tmp_path: Path, oidc_provider: Idp, clock: FakeClock
) -> OidcAppFactory:
    """Start the app logging in through the test IdP; keyword overrides change settings."""
    secret_file = tmp_path / "client-secret"
    secret_file.write_text(CLIENT_SECRET + "\n")
    secret_file.chmod(0o600)

    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[RunningApp]:
        values: dict[str, Any] = {
            "public_url": APP_URL,
            "oidc_issuer": oidc_provider.issuer,
            "oidc_client_id": "gpufleet",
            "oidc_client_secret_file": secret_file,
            "oidc_cli_client_id": "gpufleet-cli",
            "oidc_scopes": "openid email profile groups",
            "oidc_group_roles": GROUP_ROLES,
            **overrides,
        }
        settings = make_settings(data_dir=tmp_path / "data", database_url=database_url, **values)
        async with running_app(settings, clock=clock) as running:
            for name in ("ml", "infra"):
                response = await running.client.post("/api/v1/projects", json={"name": name})
                assert response.status_code == 201, response.text
            yield running

    return start


@pytest.fixture
async def oidc_app(oidc_app_factory: OidcAppFactory) -> AsyncIterator[RunningApp]:
    async with oidc_app_factory() as running:
        yield running


@pytest.fixture
async def idp_client() -> AsyncIterator[httpx.AsyncClient]:
    """The person's browser at the IdP (real HTTP to the provider on loopback)."""
    async with httpx.AsyncClient(timeout=10) as client:
        yield client
