"""An in-process server for tests: the real app over ASGI, lifespan included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from gpufleet.core.clock import Clock
from gpufleet.server.app import create_app
from gpufleet.server.context import AppContext
from gpufleet.server.settings import ServerSettings


def make_settings(*, data_dir: Path, database_url: str, **overrides: object) -> ServerSettings:
    values: dict[str, object] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "run_workers": False,  # tests drive loops with run_once()
        "announce_bootstrap_token": False,
        "sim_provision_delay_s": (0.0, 0.0),
        **overrides,
    }
    return ServerSettings(**values)  # type: ignore[arg-type]


@dataclass
class RunningApp:
    app: FastAPI
    ctx: AppContext
    client: httpx.AsyncClient  # authenticated as the platform owner
    owner_token: str

    def anonymous(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://test"
        )

    def with_token(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {token}"},
        )


@asynccontextmanager
async def running_app(
    settings: ServerSettings, *, clock: Clock | None = None
) -> AsyncIterator[RunningApp]:
    app = create_app(settings, clock=clock)
    async with LifespanManager(app, startup_timeout=60):
        ctx: AppContext = app.state.ctx
        assert ctx.bootstrap_token is not None, "tests start on an empty store"
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {ctx.bootstrap_token}"},
        ) as client:
            yield RunningApp(app=app, ctx=ctx, client=client, owner_token=ctx.bootstrap_token)
