"""``create_app(settings)``: the control-plane server as an ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, _IncludedRouter, iter_route_contexts
from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from gpufleet import __version__
from gpufleet.core.clock import Clock, SystemClock
from gpufleet.core.enums import ProviderKind, SchedulerKind
from gpufleet.core.errors import InvalidInput
from gpufleet.server.context import AppContext
from gpufleet.server.db.engine import Database
from gpufleet.server.deps import AGENT_AUTH, Guard, get_caller
from gpufleet.server.drivers import DriverRegistry, bare_metal_providers, slurm_scheduler
from gpufleet.server.errors import (
    ERROR_RESPONSES,
    RouteTraits,
    document_errors,
    error_statuses,
    install_error_handlers,
)
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.ingest import ReportIngestor
from gpufleet.server.limits import BodySizeLimit
from gpufleet.server.metrics import HttpMetrics
from gpufleet.server.requests import RequestContext
from gpufleet.server.routers import (
    acceptance,
    access,
    accounting,
    agent,
    agent_commands,
    audit,
    auth,
    autoscale,
    checks,
    clusters,
    credentials,
    enrollment,
    events,
    faults,
    findings,
    health,
    hosts,
    metrics,
    node_commands,
    nodes,
    probes,
    projects,
    prometheus,
    providers,
    reliability,
    repairs,
    rollouts,
    stacks,
    tokens,
    users,
    volumes,
)
from gpufleet.server.services.auth import bootstrap_owner
from gpufleet.server.services.aws_providers import AwsProviders
from gpufleet.server.services.host_directory import DbHostDirectory
from gpufleet.server.services.keyring import Keyring
from gpufleet.server.services.kube_schedulers import KubeSchedulers
from gpufleet.server.settings import ServerSettings
from gpufleet.server.sim_wiring import SimBundle, build_sim
from gpufleet.server.web.router import install_console
from gpufleet.server.workers.acceptance.runner import AcceptanceLoop
from gpufleet.server.workers.accounting import AccountingLoop
from gpufleet.server.workers.autoscaler import AutoscalerLoop
from gpufleet.server.workers.base import LoopDeps, LoopService
from gpufleet.server.workers.checks.context import default_check_settings
from gpufleet.server.workers.checks.runner import CheckRunner
from gpufleet.server.workers.health import HealthLoop
from gpufleet.server.workers.node_commands import CommandExpiryLoop
from gpufleet.server.workers.provisioning import ProvisioningLoop
from gpufleet.server.workers.repairs.executor import RepairExecutor
from gpufleet.server.workers.repairs.planner import RepairPlanner
from gpufleet.server.workers.rollouts import RolloutLoop
from gpufleet.server.workers.slurmd_watch import SlurmdWatchLoop
from gpufleet.server.workers.telemetry import TelemetryPruneLoop

log = logging.getLogger(__name__)


def keyring_from_settings(settings: ServerSettings) -> Keyring:
    """The credential keyring; ``KeyringError`` (naming the setting) for a bad key."""
    return Keyring.load(
        secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
        secret_key_file=settings.secret_key_file,
        previous_keys=[k.get_secret_value() for k in settings.previous_secret_keys],
    )


StartupHook = Callable[[AppContext], Awaitable[None]]


def create_app(
    settings: ServerSettings,
    *,
    clock: Clock | None = None,
    drivers: DriverRegistry | None = None,
    startup_hooks: Sequence[StartupHook] = (),
) -> FastAPI:
    """Build the app. Nothing touches the store until the lifespan starts."""
    clock = clock or SystemClock()
    db = Database(settings.resolved_database_url())
    keyring = keyring_from_settings(settings)
    sim: SimBundle | None = None
    if drivers is None:
        sim = build_sim(settings, clock=clock)
        drivers = DriverRegistry(providers={"sim": sim.provider}, schedulers={"sim": sim.scheduler})
        directory = DbHostDirectory(db=db, keyring=keyring, clock=clock)
        drivers.providers.update(bare_metal_providers(settings, directory=directory))
        drivers.per_cluster[ProviderKind.AWS.value] = AwsProviders(db=db, keyring=keyring)
        slurm = slurm_scheduler(settings)
        if slurm is not None:
            drivers.schedulers["slurm"] = slurm
        # A kubernetes cluster with Slurm on its nodes (Slinky) drains through this one.
        drivers.per_cluster_schedulers[SchedulerKind.KUBERNETES.value] = KubeSchedulers(
            db=db, keyring=keyring, slurm=slurm
        )
    ctx = AppContext(
        settings=settings,
        db=db,
        drivers=drivers,
        ingest=ReportIngestor(
            db,
            staleness_s=settings.staleness_s,
            report_interval_s=settings.report_interval_s,
            clock=clock,
        ),
        clock=clock,
        public_url=settings.public_url or f"http://{settings.host}:{settings.port}",
        keyring=keyring,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await db.migrate()
        async with db.transaction() as session:
            created = await bootstrap_owner(session)
        if created is not None:
            ctx.bootstrap_token = created.token
            _save_bootstrap_token(settings, created.token)
        await ctx.ingest.start()
        for hook in startup_hooks:
            await hook(ctx)
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        if settings.run_workers:
            for loop in build_loops(ctx):
                tasks.append(asyncio.create_task(loop.run(stop), name=f"loop-{loop.name}"))
        if sim is not None and settings.sim_agents:
            tasks.append(asyncio.create_task(sim.runner.run(stop), name="sim-agents"))
        grpc_server = await _start_externalgrpc(ctx)
        ctx.ready = True
        try:
            yield
        finally:
            ctx.ready = False
            if grpc_server is not None:
                from gpufleet.server.externalgrpc.service import stop_server

                with contextlib.suppress(Exception):
                    await stop_server(grpc_server)
            stop.set()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, timeout=10)
            if sim is not None:
                await sim.runner.aclose()
            with contextlib.suppress(Exception):  # a pool that fails to close stops nothing
                await ctx.drivers.aclose()  # the per-cluster drivers' connection pools
            await ctx.ingest.stop()
            await db.dispose()

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        description="Control plane for production GPU clusters.",
        lifespan=lifespan,
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
    )
    app.state.ctx = ctx
    _hoist_body_defs(app)
    install_error_handlers(app)
    app.router.routes.extend(_route_table())
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HttpMetrics)  # latency by route template (server/metrics.py)
    app.add_middleware(RequestContext)  # outermost: every response has an X-Request-ID
    return app


API_PREFIX = "/api/v1"


@functools.cache
def _route_table() -> tuple[BaseRoute, ...]:
    """Every route of the API, the probes and the console, built once per process.

    FastAPI builds each route's parameter models when a router is included (about a
    second for ours on a shared 2-core machine); the routes hold nothing of one app (they
    reach its state through the request), so every app of a process shares them: tests
    start hundreds of apps.

    Each API module's router is included at the top (prefix ``/api/v1``), not inside one
    ``/api/v1`` router, and behind a gate on its paths' literal prefixes (``_Gated``):
    FastAPI matches an included router by trying every route in it, twice (once to find
    it, once to hand the request on), so one ``/api/v1`` router tried all ~200 routes of
    the API twice or three times a request (0.2-0.5 ms, a tenth of an agent report's time
    in the app). Now a request tries only the routers whose paths can match it.
    """
    scratch = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    scratch.include_router(probes.router)
    scratch.include_router(metrics.router)  # GET /metrics, for Prometheus
    for router in (
        auth.router,
        projects.router,
        tokens.router,
        clusters.router,
        nodes.router,
        faults.router,
        events.router,
        findings.router,
        repairs.router,
        checks.router,
        acceptance.router,
        accounting.router,
        reliability.router,
        stacks.router,
        rollouts.router,
        health.router,
        agent.router,
        agent_commands.router,
        node_commands.router,
        users.router,
        volumes.router,
        audit.router,
        access.router,
        credentials.router,
        hosts.router,
        providers.router,
        enrollment.router,
        autoscale.router,
        metrics.api_router,  # Prometheus's service discovery
        prometheus.router,  # the per-project query proxy
    ):
        scratch.include_router(router, prefix=API_PREFIX, responses=ERROR_RESPONSES)
    install_console(scratch)  # the web console: pages and /static (server/web/)
    return tuple(_gated(route) for route in scratch.router.routes)


class _Gated(_IncludedRouter):
    """An included router that answers "no match" at once for a path none of its routes
    can match: one that starts with none of their literal prefixes (the path up to its
    first parameter). Otherwise FastAPI's own matching, unchanged."""

    prefixes: tuple[str, ...] = ()

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and not get_route_path(scope).startswith(self.prefixes):
            return Match.NONE, {}
        return super().matches(scope)


def _gated(route: BaseRoute) -> BaseRoute:
    if not isinstance(route, _IncludedRouter):
        return route
    gated = _Gated(original_router=route.original_router, include_context=route.include_context)
    gated.prefixes = tuple(
        sorted({(c.path_format or "/").partition("{")[0] for c in iter_route_contexts([route])})
    )
    return gated


def _hoist_body_defs(app: FastAPI) -> None:
    """Routes that parse their own body (``routers/agent.py``) declare its schema with
    ``$defs``; move those into ``components.schemas`` where their ``$ref``s point. And
    every /api/v1 operation gets the 4xx it can answer (``errors.document_errors``)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                content = operation.get("requestBody", {}).get("content", {})
                for media in content.values():
                    for name, definition in media.get("schema", {}).pop("$defs", {}).items():
                        components.setdefault(name, definition)
        _document_error_statuses(app, schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document_error_statuses(app: FastAPI, schema: dict[str, Any]) -> None:
    paths = schema.get("paths", {})
    for context in iter_route_contexts(app.routes):
        route, path = context.original_route, context.path_format or ""
        if not isinstance(route, APIRoute) or not path.startswith("/api/"):
            continue
        traits = _route_traits(route)
        for method in context.methods or ():
            operation = paths.get(path, {}).get(method.lower())
            if operation is not None:
                document_errors(operation, error_statuses(method, traits))


def _route_traits(route: APIRoute) -> RouteTraits:
    calls: list[Any] = []
    params = False
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        calls.append(dependant.call)
        params = params or bool(
            dependant.path_params or dependant.query_params or dependant.header_params
        )
        pending.extend(dependant.dependencies)
    has_body = route.body_field is not None or "requestBody" in (route.openapi_extra or {})
    return RouteTraits(
        user_auth=any(isinstance(c, Guard) or c is get_caller for c in calls),
        agent_auth=any(c in AGENT_AUTH for c in calls),
        has_body=has_body,
        has_params=params,
    )


async def _start_externalgrpc(ctx: AppContext) -> Any:
    """Serve Cluster Autoscaler's externalgrpc CloudProvider when an address is set (the
    grpc.aio server; None when not). grpc is imported only then: a server without it
    starts without loading it."""
    settings = ctx.settings
    if settings.externalgrpc_address is None:
        return None
    from gpufleet.server.externalgrpc.groups import ClusterNodeGroups
    from gpufleet.server.externalgrpc.service import TlsFiles, add_port, create_server

    tls_files = (
        settings.externalgrpc_tls_key,
        settings.externalgrpc_tls_cert,
        settings.externalgrpc_tls_cacert,
    )
    tls = None
    if any(f is not None for f in tls_files):
        key, cert, cacert = tls_files
        if key is None or cert is None or cacert is None:
            raise InvalidInput(
                "externalgrpc TLS needs all three of externalgrpc_tls_key, "
                "externalgrpc_tls_cert and externalgrpc_tls_cacert"
            )
        tls = TlsFiles(key=key, cert=cert, cacert=cacert)
    backend = ClusterNodeGroups(db=ctx.db, clock=ctx.clock, drivers=ctx.drivers)
    server = create_server(backend)
    ctx.externalgrpc_port = add_port(server, address=settings.externalgrpc_address, tls=tls)
    await server.start()
    return server


def build_loops(ctx: AppContext) -> list[LoopService]:
    deps = LoopDeps(
        db=ctx.db,
        clock=ctx.clock,
        owner=ctx.settings.replica_id,
        lease_ttl_s=ctx.settings.lease_ttl_s,
    )
    return [
        ProvisioningLoop(
            deps,
            interval_s=ctx.settings.reconcile_interval_s,
            drivers=ctx.drivers,
            server_url=lambda: ctx.public_url,
        ),
        # Startup scripts and acceptance runs: right after provisioning, so a pass takes
        # a node that just came up as far as it can go.
        AcceptanceLoop(
            deps,
            interval_s=ctx.settings.reconcile_interval_s,
            drivers=ctx.drivers,
            failpoints=Failpoints.parse(ctx.settings.failpoints),
        ),
        AutoscalerLoop(deps, interval_s=ctx.settings.autoscale_interval_s, drivers=ctx.drivers),
        HealthLoop(
            deps,
            interval_s=max(ctx.settings.reconcile_interval_s, 2.0),
            staleness_s=ctx.settings.staleness_s,
        ),
        AccountingLoop(deps, interval_s=ctx.settings.accounting_interval_s, drivers=ctx.drivers),
        SlurmdWatchLoop(deps, interval_s=ctx.settings.slurmd_watch_interval_s, drivers=ctx.drivers),
        RepairPlanner(
            deps,
            interval_s=ctx.settings.repair_interval_s,
            drivers=ctx.drivers,
            default_policy=ctx.default_repair_policy,
        ),
        RepairExecutor(
            deps,
            interval_s=ctx.settings.repair_interval_s,
            drivers=ctx.drivers,
            server_url=lambda: ctx.public_url,
            default_policy=ctx.default_repair_policy,
            failpoints=Failpoints.parse(ctx.settings.failpoints),
            staleness_s=ctx.settings.staleness_s,
        ),
        # Stack rollouts: after the executor, so a node whose repair just ended is seen.
        RolloutLoop(
            deps,
            interval_s=ctx.settings.repair_interval_s,
            drivers=ctx.drivers,
            failpoints=Failpoints.parse(ctx.settings.failpoints),
        ),
        CommandExpiryLoop(deps, interval_s=max(ctx.settings.reconcile_interval_s, 5.0)),
        CheckRunner(
            deps,
            interval_s=ctx.settings.check_interval_s,
            drivers=ctx.drivers,
            settings=default_check_settings(
                data_dir=ctx.settings.data_dir,
                output_dir=ctx.settings.checks_output_dir,
                slurm_user=ctx.settings.checks_slurm_user,
                fabric=ctx.settings.checks_fabric,
                stand_ins=ctx.settings.checks_stand_in,
                staleness_s=ctx.settings.staleness_s,
            ),
        ),
        TelemetryPruneLoop(
            deps,
            interval_s=60.0,  # retention is hours: a pass a minute keeps each delete small
            node_keep_s=ctx.settings.telemetry_history_s,
            cluster_keep_s=ctx.settings.cluster_telemetry_history_s,
        ),
    ]


def _save_bootstrap_token(settings: ServerSettings, token: str) -> None:
    """Shown once, on the first start: the platform owner's first token."""
    if settings.bootstrap_token_file is not None:
        path = settings.bootstrap_token_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        path.write_text(token + "\n")
    if not settings.announce_bootstrap_token:
        return
    print(
        f"gpufleet: first start; bootstrap admin token (shown once):\nGPUFLEET_TOKEN={token}",
        flush=True,
    )
