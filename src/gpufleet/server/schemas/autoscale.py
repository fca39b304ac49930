"""Bodies of the autoscaling endpoints (``routers/autoscale.py``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from gpufleet.core.autoscaling import AutoscaleMode, PowerAction
from gpufleet.server.schemas.clusters import MAX_CLUSTER_SIZE, AutoscaleMax, AutoscaleMin
from gpufleet.server.schemas.common import Request

WEEK_S = 7 * 86400.0
Seconds = Annotated[float, Field(ge=0, le=WEEK_S, allow_inf_nan=False)]
ReasonText = Annotated[str, StringConstraints(max_length=500)]
# A Slurm node name (ResumeProgram's hostlist, expanded by the CLI).
NodeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


class SetAutoscaleRequest(Request):
    """Only the fields given change; ``min_nodes``/``max_nodes`` null removes a bound."""

    mode: AutoscaleMode | None = None
    min_nodes: AutoscaleMin | None = None
    max_nodes: AutoscaleMax | None = None
    scale_up_after_s: Seconds | None = None
    scale_down_after_s: Seconds | None = None
    up_cooldown_s: Seconds | None = None
    down_cooldown_s: Seconds | None = None
    max_step: Annotated[int, Field(ge=1, le=MAX_CLUSTER_SIZE, strict=True)] | None = None
    reason: ReasonText = ""


class PowerJob(Request):
    """One job of Slurm's resume file: what it waits for (kept with the action)."""

    job_id: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    nodes: Annotated[list[NodeName], Field(max_length=MAX_CLUSTER_SIZE)] = []
    partition: Annotated[str, StringConstraints(max_length=128)] = ""
    features: Annotated[str, StringConstraints(max_length=512)] = ""


class PowerRequest(Request):
    """``gpufleet slurm resume|suspend``: Slurm's ResumeProgram/SuspendProgram."""

    action: PowerAction
    nodes: Annotated[list[NodeName], Field(min_length=1, max_length=MAX_CLUSTER_SIZE)]
    jobs: Annotated[list[PowerJob], Field(max_length=1024)] = []
    reason: ReasonText = ""
