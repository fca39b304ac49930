"""A cluster's autoscaling settings (``GET/PUT /api/v1/clusters/{id}/autoscale``): the
mode (who decides), the bounds (the cluster's ``autoscale_min``/``autoscale_max``) and
the policy's thresholds. A change is checked whole before anything is written, and is
an event and an audit row."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.autoscaling import AutoscaleMode, AutoscaleSettings
from gpufleet.core.enums import ClusterStatus, EventKind, SchedulerKind
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import AutoscalePolicyRow, ClusterRow
from gpufleet.server.schemas.autoscale import SetAutoscaleRequest
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.autoscale import settings_of
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.events import record_event

_MODES_FOR: dict[AutoscaleMode, frozenset[SchedulerKind]] = {
    AutoscaleMode.CLUSTER_AUTOSCALER: frozenset({SchedulerKind.KUBERNETES}),
    AutoscaleMode.SLURM: frozenset({SchedulerKind.SLURM}),
}


async def get_autoscale(
    session: AsyncSession, *, caller: Caller, cluster_id: str
) -> AutoscaleSettings:
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    return settings_of(cluster, await session.get(AutoscalePolicyRow, cluster.id))


async def set_autoscale(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    request: SetAutoscaleRequest,
    now: dt.datetime,
) -> AutoscaleSettings:
    """Change a cluster's autoscaling (admins). Only the fields given change; the result
    must make a whole policy (a mode other than ``off`` needs both bounds, the minimum
    not above the maximum, a mode its scheduler has). Nothing is written otherwise."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.CLUSTER_CREATE, cluster.project_id)
    if ClusterStatus(cluster.status) in (ClusterStatus.DELETING, ClusterStatus.DELETED):
        raise Conflict(f"cluster {cluster.name} is {cluster.status}; it cannot be changed")
    await session.refresh(cluster, with_for_update=True)
    given = request.model_fields_set - {"reason"}
    if not given:
        raise InvalidInput(
            "nothing to change: give one of mode, min_nodes, max_nodes, scale_up_after_s, "
            "scale_down_after_s, up_cooldown_s, down_cooldown_s, max_step"
        )
    row = await session.get(AutoscalePolicyRow, cluster.id, with_for_update=True)
    before = settings_of(cluster, row)
    updates: dict[str, Any] = {}
    for name in given:
        value = getattr(request, name)
        if value is None and name not in ("min_nodes", "max_nodes"):
            raise InvalidInput(f"{name} cannot be null", field=name)
        updates[name] = value
    after = before.model_copy(update=updates)
    _check_settings(cluster, after)
    cluster.autoscale_min, cluster.autoscale_max = after.min_nodes, after.max_nodes
    if row is None:
        row = AutoscalePolicyRow(cluster_id=cluster.id, last_decision="")
        session.add(row)
    row.mode = after.mode.value
    row.scale_up_after_s = after.scale_up_after_s
    row.scale_down_after_s = after.scale_down_after_s
    row.up_cooldown_s = after.up_cooldown_s
    row.down_cooldown_s = after.down_cooldown_s
    row.max_step = after.max_step
    row.updated_by = caller.actor
    row.updated_at = now
    old, new = _comparable(before), _comparable(after)
    changed = sorted(k for k in new if new[k] != old[k])
    if changed:
        cluster.updated_at = now
        record_event(
            session,
            kind=EventKind.AUTOSCALE_UPDATED,
            message=f"cluster {cluster.name}: autoscaling "
            + ", ".join(f"{k} {old[k]} → {new[k]}" for k in changed)
            + f" by {caller.actor}"
            + (f": {request.reason}" if request.reason else ""),
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            actor=caller.actor,
            data={"changed": changed, "before": old, "after": new, "reason": request.reason},
            ts=now,
        )
    record_audit(
        session,
        actor=caller.actor,
        action="cluster.autoscale",
        object_type="cluster",
        object_id=cluster.id,
        project_id=cluster.project_id,
        source_ip=caller.source_ip,
        detail={"changed": changed, "before": old, "after": new, "reason": request.reason},
        ts=now,
    )
    return settings_of(cluster, row)


def _comparable(settings: AutoscaleSettings) -> dict[str, Any]:
    return settings.model_dump(
        mode="json",
        include={
            "mode",
            "min_nodes",
            "max_nodes",
            "scale_up_after_s",
            "scale_down_after_s",
            "up_cooldown_s",
            "down_cooldown_s",
            "max_step",
        },
    )


def _check_settings(cluster: ClusterRow, settings: AutoscaleSettings) -> None:
    lo, hi = settings.min_nodes, settings.max_nodes
    if lo is not None and hi is not None and lo > hi:
        raise InvalidInput(f"min_nodes ({lo}) must not exceed max_nodes ({hi})", field="min_nodes")
    if settings.max_step < 1:
        raise InvalidInput("max_step must be at least 1", field="max_step")
    if settings.mode is AutoscaleMode.OFF:
        return
    if lo is None or hi is None:
        missing = "min_nodes" if lo is None else "max_nodes"
        raise InvalidInput(
            f"autoscaling mode {settings.mode.value} needs both min_nodes and max_nodes",
            field=missing,
        )
    allowed = _MODES_FOR.get(settings.mode)
    if allowed is not None and SchedulerKind(cluster.scheduler) not in allowed:
        raise InvalidInput(
            f"mode {settings.mode.value} is for {', '.join(sorted(allowed))} clusters; "
            f"cluster {cluster.name} runs {cluster.scheduler}",
            field="mode",
        )
