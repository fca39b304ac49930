"""``check_providers``: reach every inventory host of a cluster (an aws cluster: every
node's instance) through a provider's ``check_reach``, changing nothing (``gpufleet
providers check``).

Three steps, no network call inside a transaction: read the cluster and its hosts; run
the checks, at most ``CHECK_CONCURRENCY`` at once, each bounded by the driver's own
timeouts (the driver opens the host's credential for the call, through the host
directory); then write one audit row, since the check used the hosts' credentials.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import select

from gpufleet.core.enums import NodeState, ProviderKind
from gpufleet.core.errors import GpufleetError, InvalidInput
from gpufleet.core.providers import HostReach, Power, ProvidersCheckResult
from gpufleet.core.rbac import Permission
from gpufleet.providers.base import PowerState, Provider, SupportsReachCheck
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, HostRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error

log = logging.getLogger(__name__)

# BMCs are small computers and an SSH login costs a handshake: 16 hosts at once keeps a
# check of a few hundred hosts to a few driver timeouts without flooding a management LAN.
CHECK_CONCURRENCY = 16

_POWER: dict[PowerState, Power] = {
    PowerState.ON: "on",
    PowerState.OFF: "off",
    PowerState.UNKNOWN: "unknown",
}


@dataclass(frozen=True, slots=True)
class _Target:
    host_id: str
    hostname: str
    bmc_type: str


async def check_providers(
    db: Database,
    *,
    caller: Caller,
    cluster_id: str,
    provider: ProviderKind | None,
    drivers: DriverRegistry,
    now: dt.datetime,
) -> ProvidersCheckResult:
    """Every host of the cluster in the inventory, as ``provider`` (default: the
    cluster's own) reaches it; for an aws cluster, every node's instance (``hostname`` the
    node's name, ``host_id`` the instance id). An unreachable host is a row with
    ``reachable=False``.

    Raises:
        NotFound: no such cluster for the caller.
        Forbidden: the caller is not an admin of the cluster's project.
        InvalidInput: the provider is not configured on this server, or has no reach
            check (``sim``).
    """
    async with db.session() as session:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        require(caller, Permission.HOST_READ, cluster.project_id)
        kind = provider or ProviderKind(cluster.provider)
        driver = _driver(drivers, cluster, kind)
        if not isinstance(driver, SupportsReachCheck):
            raise InvalidInput(
                f"provider {kind.value!r} has no reach check: its machines are not reached "
                "through a BMC, SSH or a cloud API. Check the cluster's hosts as the "
                "provider that drives them: ipmi, redfish or ssh",
                field="provider",
            )
        if kind.value in drivers.per_cluster:
            # A cloud cluster's machines are its nodes' instances, not inventory hosts.
            rows = (
                await session.execute(
                    select(NodeRow.provider_instance_id, NodeRow.name, NodeRow.id)
                    .where(
                        NodeRow.cluster_id == cluster.id,
                        NodeRow.state != NodeState.REMOVED.value,
                        NodeRow.provider_instance_id.is_not(None),
                    )
                    .order_by(NodeRow.name)
                )
            ).all()
            targets = [_Target(host_id=str(r[0]), hostname=r[1], bmc_type=kind.value) for r in rows]
        else:
            rows = (
                await session.execute(
                    select(HostRow.id, HostRow.hostname, HostRow.bmc_type)
                    .where(HostRow.cluster_id == cluster.id)
                    .order_by(HostRow.hostname)
                )
            ).all()
            targets = [_Target(host_id=r[0], hostname=r[1], bmc_type=r[2]) for r in rows]
        project_id = cluster.project_id
    gate = asyncio.Semaphore(CHECK_CONCURRENCY)

    async def one(target: _Target) -> HostReach:
        async with gate:
            return await _reach(driver, target, kind=kind)

    hosts = list(await asyncio.gather(*(one(t) for t in targets)))
    unreachable = sum(1 for h in hosts if not h.reachable)
    async with db.transaction() as session:
        record_audit(
            session,
            actor=caller.actor,
            action="providers.check",
            object_type="cluster",
            object_id=cluster_id,
            project_id=project_id,
            detail={"provider": kind.value, "hosts": len(hosts), "unreachable": unreachable},
            ts=now,
        )
    return ProvidersCheckResult(cluster_id=cluster_id, provider=kind, hosts=hosts)


def _driver(drivers: DriverRegistry, cluster: ClusterRow, kind: ProviderKind) -> Provider:
    if kind.value not in drivers.per_cluster:
        return drivers.provider(kind.value)
    if kind.value != cluster.provider:
        raise InvalidInput(
            f"cluster {cluster.name} is on provider {cluster.provider}: it has no "
            f"{kind.value} configuration to check its machines with",
            field="provider",
        )
    return drivers.provider_for(cluster)


async def _reach(driver: SupportsReachCheck, target: _Target, *, kind: ProviderKind) -> HostReach:
    def row(*, reachable: bool, power: Power, detail: str) -> HostReach:
        return HostReach(
            hostname=target.hostname,
            host_id=target.host_id,
            reachable=reachable,
            power=power,
            detail=detail,
        )

    if target.bmc_type != kind.value:
        # Another driver's address (an IPMI BMC asked over Redfish) would only fail
        # confusingly: say what the host is instead.
        return row(
            reachable=False,
            power="unknown",
            detail=f"not checked: its bmc_type is {target.bmc_type}, not {kind.value}",
        )
    try:
        seen = await driver.check_reach(target.host_id)
    except GpufleetError as exc:  # e.g. its credential cannot be opened: names no secret
        return row(reachable=False, power="unknown", detail=exc.message)
    except Exception:
        log.exception("providers check: %s host %s failed", kind.value, target.host_id)
        return row(reachable=False, power="unknown", detail="check failed (see the server log)")
    return row(reachable=seen.reachable, power=_POWER[seen.power], detail=seen.detail)
