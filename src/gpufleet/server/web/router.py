"""The web console: server-rendered pages over the same service functions as the API.

``install_console(app)`` adds the pages (``/``, ``/login``, ``/projects/...``,
``/clusters/...``) and the static files (``/static``). See docs/console.md.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles

from gpufleet.server.web import (
    checks,
    cluster,
    config,
    fallback,
    live,
    login,
    members,
    nodes,
    overview,
    reliability,
    repairs,
    rollouts,
    utilization,
)


def console_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)
    for module in (
        login,
        overview,
        cluster,
        utilization,
        reliability,
        config,
        nodes,
        repairs,
        checks,
        rollouts,
        members,
        live,
        fallback,  # last: a path no page matched
    ):
        router.include_router(module.router)
    return router


def install_console(app: FastAPI) -> None:
    app.mount(
        "/static",
        StaticFiles(packages=[("gpufleet.server.web", "static")]),
        name="console-static",
    )
    app.include_router(console_router())
