"""Autoscaling as the API, the client and the CLI see it: a cluster's settings and the
actions taken (``core/autoscale.py`` is the policy itself, pure).

Who decides a cluster's size (``AutoscaleMode``):

- ``off``: nobody; the size is what an admin made it.
- ``gpufleet``: gpufleet's own policy, from the work that waits and the nodes that idle.
- ``cluster-autoscaler``: Kubernetes' Cluster Autoscaler, through the ``externalgrpc``
  CloudProvider service gpufleet serves; gpufleet keeps the bounds and the safety rules.
- ``slurm``: Slurm's power saving calls ``gpufleet slurm resume`` / ``suspend`` for
  ``State=CLOUD`` nodes; gpufleet keeps the bounds and the safety rules.

Whoever decides, gpufleet alone acts: every change of size is an ``AutoscaleAction`` with
its reasons, and a node is only ever removed when it runs no job, has no open repair and
is not in acceptance.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class AutoscaleMode(StrEnum):
    OFF = "off"
    GPUFLEET = "gpufleet"
    CLUSTER_AUTOSCALER = "cluster-autoscaler"
    SLURM = "slurm"


class AutoscaleKind(StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"


class AutoscaleStatus(StrEnum):
    """acting → succeeded | failed; a step down whose nodes all took work meanwhile is
    cancelled (nothing was removed)."""

    ACTING = "acting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AutoscaleSource(StrEnum):
    """Who asked for the action."""

    POLICY = "policy"  # gpufleet's own autoscaler
    CLUSTER_AUTOSCALER = "cluster-autoscaler"  # NodeGroupIncreaseSize / DeleteNodes
    SLURM = "slurm"  # ResumeProgram / SuspendProgram
    ADMIN = "admin"


class PowerAction(StrEnum):
    RESUME = "resume"
    SUSPEND = "suspend"


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


Seconds = Annotated[float, Field(ge=0, le=7 * 86400)]


class AutoscaleSettings(_Domain):
    """``GET/PUT /api/v1/clusters/{id}/autoscale``. ``min_nodes``/``max_nodes`` are the
    cluster's ``autoscale_min``/``autoscale_max``; a mode other than ``off`` needs both."""

    cluster_id: str
    mode: AutoscaleMode = AutoscaleMode.OFF
    min_nodes: int | None = None
    max_nodes: int | None = None
    scale_up_after_s: float = 120.0  # GPU work pending this long asks for nodes
    scale_down_after_s: float = 1800.0  # a node idle this long may go
    up_cooldown_s: float = 300.0  # between two steps up
    down_cooldown_s: float = 600.0  # after any step, before a step down
    max_step: int = 8  # nodes added or removed by one step
    last_up_at: dt.datetime | None = None
    last_down_at: dt.datetime | None = None
    last_decision: str = ""  # the policy's last reasons, whether or not it acted
    updated_at: dt.datetime | None = None


class AutoscaleAction(_Domain):
    id: str
    cluster_id: str
    kind: AutoscaleKind
    status: AutoscaleStatus
    source: AutoscaleSource
    count: int  # nodes asked for (up) or to remove (down)
    nodes: list[str]  # the nodes it made or removes, by name
    reasons: list[str]
    detail: str = ""  # what it waits for, what failed
    actor: str
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None = None


class PowerResult(_Domain):
    """``POST /api/v1/clusters/{id}/power``: the action started, or none when there was
    nothing to do (every node already up or on its way, or already gone), and why."""

    action: AutoscaleAction | None = None
    detail: str
