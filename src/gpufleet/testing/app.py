"""An in-process server for tests: the real app over ASGI, lifespan included.

Every app it runs also checks the audit log: each mutating request that succeeded must
have left an audit row with its request id (``X-Request-ID``), except on the routes
``server/requests.py`` names as not audited. The check runs when the app stops and
fails the test with the list of requests that wrote none.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.core.clock import Clock
from gpufleet.server.app import create_app
from gpufleet.server.context import AppContext
from gpufleet.server.db.tables import AuditLogRow
from gpufleet.server.requests import REQUEST_ID_HEADER, is_audited_route, route_template
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


@dataclass(frozen=True)
class Mutation:
    method: str
    route: str
    path: str
    status: int
    request_id: str


@dataclass
class MutationLedger:
    """The successful mutating requests the app answered, to match with audit rows."""

    mutations: list[Mutation] = field(default_factory=list)

    async def unaudited(self, ctx: AppContext) -> list[Mutation]:
        ids = [m.request_id for m in self.mutations]
        found: set[str] = set()
        async with ctx.db.session() as session:
            for start in range(0, len(ids), 500):
                rows = await session.scalars(
                    select(AuditLogRow.request_id).where(
                        AuditLogRow.request_id.in_(ids[start : start + 500])
                    )
                )
                found.update(r for r in rows if r is not None)
        return [m for m in self.mutations if m.request_id not in found]


class _RecordMutations:
    """Outermost middleware of the test app: notes each successful audited mutation."""

    def __init__(self, app: ASGIApp, *, ledger: MutationLedger) -> None:
        self.app = app
        self.ledger = ledger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        seen: dict[str, object] = {}

        async def note(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", []):
                    if name.decode().lower() == REQUEST_ID_HEADER.lower():
                        seen["request_id"] = value.decode()
            await send(message)

        await self.app(scope, receive, note)
        template = route_template(scope) or scope["path"]
        status = seen.get("status")
        request_id = seen.get("request_id")
        if not isinstance(status, int) or status >= 400 or not isinstance(request_id, str):
            return
        if is_audited_route(scope["method"], template):
            self.ledger.mutations.append(
                Mutation(scope["method"], template, scope["path"], status, request_id)
            )


class RunToEnd:
    """An ASGI app whose requests run to their end when the client gives up on them, as
    behind uvicorn (it lets a handler finish after the client went away). httpx's
    in-process transport would instead cancel the handler where it stands, inside a
    database transaction; an agent cancels its own long poll when a slot frees."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.ensure_future(self._app(scope, receive, send))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.shield(task)

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Wait for requests whose clients gave up to finish (before the app stops)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


@dataclass
class RunningApp:
    app: FastAPI
    ctx: AppContext
    client: httpx.AsyncClient  # authenticated as the platform owner
    owner_token: str
    ledger: MutationLedger = field(default_factory=MutationLedger)

    def anonymous(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://test"
        )

    @asynccontextmanager
    async def agent_http(self) -> AsyncIterator[httpx.AsyncClient]:
        """An unauthenticated client for an agent's long-running channel: requests it
        gives up on run to their end (``RunToEnd``), and are waited for on the way out."""
        detached = RunToEnd(self.app)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=detached), base_url="http://test"
        ) as client:
            try:
                yield client
            finally:
                await detached.drain()

    def with_token(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {token}"},
        )

    async def assert_mutations_audited(self) -> None:
        missing = await self.ledger.unaudited(self.ctx)
        if missing:
            lines = "\n".join(
                f"  {m.method} {m.route} ({m.path} → {m.status}, request {m.request_id})"
                for m in missing
            )
            raise AssertionError(
                f"{len(missing)} successful mutation(s) wrote no audit row:\n{lines}\n"
                "Every mutation is audited (record_audit in its service, in the same "
                "transaction); routes that are not mutations by a person are listed in "
                "gpufleet.server.requests.NOT_AUDITED_*."
            )


@asynccontextmanager
async def running_app(
    settings: ServerSettings, *, clock: Clock | None = None, check_audit: bool = True
) -> AsyncIterator[RunningApp]:
    app = create_app(settings, clock=clock)
    ledger = MutationLedger()
    app.add_middleware(_RecordMutations, ledger=ledger)
    async with LifespanManager(app, startup_timeout=60):
        ctx: AppContext = app.state.ctx
        assert ctx.bootstrap_token is not None, "tests start on an empty store"
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {ctx.bootstrap_token}"},
        ) as client:
            running = RunningApp(
                app=app, ctx=ctx, client=client, owner_token=ctx.bootstrap_token, ledger=ledger
            )
            yield running
            if check_audit:
                await running.assert_mutations_audited()
