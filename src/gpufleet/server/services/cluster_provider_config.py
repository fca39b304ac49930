"""``GET``/``PUT /clusters/{id}/provider-config``: show and change a cluster's provider
configuration (checked by ``provider_configs.check_provider_config``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus, EventKind, ProviderKind
from gpufleet.core.errors import Conflict
from gpufleet.core.providers import ClusterProviderConfig
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import ClusterRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.events import record_event
from gpufleet.server.services.provider_configs import (
    check_provider_config,
    stored_provider_config,
)


def provider_config_of(row: ClusterRow) -> ClusterProviderConfig:
    config = stored_provider_config(row)
    if config is None:
        raise Conflict(
            f"cluster {row.name}: its stored provider configuration is not valid for "
            f"provider {row.provider}; set it again (PUT .../provider-config)",
            field="provider_config",
        )
    return ClusterProviderConfig(
        cluster_id=row.id, cluster_name=row.name, provider=ProviderKind(row.provider),
        config=config,
    )  # fmt: skip


async def get_provider_config(
    session: AsyncSession, *, caller: Caller, cluster_id: str
) -> ClusterProviderConfig:
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    return provider_config_of(row)


async def set_provider_config(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    raw: Mapping[str, object],
    reason: str,
    now: dt.datetime,
) -> ClusterProviderConfig:
    """Replace the cluster's provider configuration (project admins: the permission that
    changes a cluster's other settings). The next driver call uses it; a machine already
    launched keeps where it was launched. One event and one audit row, neither with a
    secret (the configuration holds none).

    Raises:
        NotFound / Forbidden: no such cluster for the caller / not an admin.
        Conflict: the cluster is being deleted.
        InvalidInput: see ``check_provider_config``; nothing is written.
    """
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.CLUSTER_CREATE, row.project_id)
    if ClusterStatus(row.status) in (ClusterStatus.DELETING, ClusterStatus.DELETED):
        raise Conflict(f"cluster {row.name} is {row.status}; it cannot be changed")
    await session.refresh(row, with_for_update=True)
    config = await check_provider_config(
        session, project_id=row.project_id, kind=ProviderKind(row.provider), raw=raw
    )
    before = dict(row.provider_config or {})
    after = config.model_dump(mode="json")
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        row.provider_config = after
        row.updated_at = now
        record_event(
            session,
            kind=EventKind.CLUSTER_UPDATED,
            message=f"cluster {row.name}: provider configuration ({', '.join(changed)}) "
            f"changed by {caller.actor}" + (f": {reason}" if reason else ""),
            project_id=row.project_id,
            cluster_id=row.id,
            actor=caller.actor,
            data={"changed": [f"provider_config.{k}" for k in changed], "reason": reason},
            ts=now,
        )
    record_audit(  # every mutation is audited, one that changed nothing too
        session,
        actor=caller.actor,
        action="cluster.provider_config",
        object_type="cluster",
        object_id=row.id,
        project_id=row.project_id,
        source_ip=caller.source_ip,
        detail={
            "provider": row.provider,
            "changed": changed,
            "reason": reason,
            "before": before,
            "after": after,
        },
        ts=now,
    )
    return provider_config_of(row)
