from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

import gpufleet.server.services.findings as findings_services
from gpufleet.core.models import Finding, Page
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.common import CURSOR_DESCRIPTION, CURSOR_PATTERN
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/findings", tags=["findings"])


@router.get("")
async def list_findings(
    caller: Annotated[Caller, Allow(Permission.FINDING_READ)],
    ctx: CtxDep,
    cluster: str | None = Query(default=None, max_length=36),
    node: str | None = Query(default=None, max_length=36),
    gpu: str | None = Query(default=None, max_length=80, description="GPU UUID"),
    signature: str | None = Query(default=None, max_length=80),
    open: bool | None = Query(default=None, description="true: open only; false: cleared only"),
    cursor: str | None = Query(
        default=None, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Page[Finding]:
    async with ctx.db.reader() as session:
        return await findings_services.list_findings(
            session,
            caller=caller,
            cluster_id=cluster,
            node_id=node,
            gpu_uuid=gpu,
            signature_id=signature,
            is_open=open,
            cursor=cursor,
            limit=limit,
        )
