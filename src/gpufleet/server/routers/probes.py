"""Liveness and readiness, for load balancers and Kubernetes probes (no auth)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gpufleet.server.deps import CtxDep

router = APIRouter(tags=["probes"])


@router.get("/healthz")
async def liveness() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
async def readiness(ctx: CtxDep) -> dict[str, str] | JSONResponse:
    if not ctx.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    try:
        await ctx.db.check()
    except Exception as exc:  # noqa: BLE001 - any store failure means "not ready", with the reason
        return JSONResponse({"status": "store unavailable", "detail": repr(exc)}, status_code=503)
    return {"status": "ready"}
