"""The host inventory: import (all or nothing, idempotent by hostname), list, show, bind a
node to its host, and the host lifecycle's one switch function.

A host belongs to a project (its cluster, if any, and its credential are of the same
project). Its state (``core.inventory.HostState``) changes only through
``switch_host_state``, which goes through ``transition()``: one event, one audit row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.inventory import (
    BmcType,
    Host,
    HostImportResult,
    HostRole,
    HostSpec,
    HostState,
)
from gpufleet.core.rbac import Permission
from gpufleet.core.transitions import HOST
from gpufleet.server.db.tables import ClusterRow, CredentialRow, HostRow, NodeRow, ProjectRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.projects import get_project_row_for
from gpufleet.server.services.transitions import Subject, transition

# The columns an import sets from a row (cluster and credential resolved to ids).
_PLAIN = ("serial", "bmc_address", "port", "system_id", "host_key", "rack", "leaf_switch", "pdu")


def initial_state(role: HostRole) -> HostState:
    return HostState.SPARE if role is HostRole.SPARE else HostState.IN_SERVICE


def host_row_to_host(row: HostRow, *, credential: str | None) -> Host:
    return Host(
        id=row.id,
        project_id=row.project_id,
        hostname=row.hostname,
        serial=row.serial,
        bmc_type=BmcType(row.bmc_type),
        bmc_address=row.bmc_address,
        port=row.port,
        system_id=row.system_id,
        host_key=row.host_key,
        credential=credential,
        rack=row.rack,
        leaf_switch=row.leaf_switch,
        pdu=row.pdu,
        cluster_id=row.cluster_id,
        role=HostRole(row.role),
        state=HostState(row.state),
        node_id=row.node_id,
        claim_token=row.claim_token,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def hosts_to_models(session: AsyncSession, rows: Sequence[HostRow]) -> list[Host]:
    ids = {r.credential_id for r in rows if r.credential_id}
    names: dict[str, str] = {}
    if ids:
        found = await session.execute(
            select(CredentialRow.id, CredentialRow.name).where(CredentialRow.id.in_(ids))
        )
        names = {str(i): str(n) for i, n in found}
    return [host_row_to_host(r, credential=names.get(r.credential_id or "")) for r in rows]


def switch_host_state(
    session: AsyncSession,
    *,
    host: HostRow,
    target: HostState,
    actor: str,
    reason: str,
    now: dt.datetime,
    data: dict[str, Any] | None = None,
) -> bool:
    """The one way a host's state changes (an event and an audit row)."""
    changed = transition(
        session,
        lifecycle=HOST,
        row=host,
        subject=Subject(
            object_id=host.id,
            label=f"host {host.hostname}",
            project_id=host.project_id,
            cluster_id=host.cluster_id,
            node_id=host.node_id,
            ids={"host_id": host.id},
        ),
        target=target,
        actor=actor,
        reason=reason,
        now=now,
        data=data,
    )
    if changed:
        host.updated_at = now
    return changed


def take_out_of_service(
    session: AsyncSession, *, host: HostRow, actor: str, reason: str, now: dt.datetime
) -> None:
    """The machine runs no node of ours any more and is flagged for hardware service:
    nothing claims it again until someone sets it back (``gpufleet hosts set-state``)."""
    switch_host_state(
        session, host=host, target=HostState.OUT_OF_SERVICE, actor=actor, reason=reason, now=now
    )
    host.node_id = None


async def get_host_row_or_error(session: AsyncSession, *, project: ProjectRow, ref: str) -> HostRow:
    """A host of the project by id or hostname."""
    by_name = HostRow.hostname == ref
    match = or_(HostRow.id == ref, by_name) if is_id(ref) else by_name
    row = await session.scalar(select(HostRow).where(HostRow.project_id == project.id, match))
    if row is None:
        raise NotFound(f"host {ref!r} not found in project {project.name}", field="host")
    return row


async def list_hosts(
    session: AsyncSession, *, caller: Caller, project_ref: str, cluster_id: str | None = None
) -> list[Host]:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.HOST_READ
    )
    query = select(HostRow).where(HostRow.project_id == project.id)
    if cluster_id is not None:
        query = query.where(HostRow.cluster_id == cluster_id)
    rows = (await session.scalars(query.order_by(HostRow.hostname))).all()
    return await hosts_to_models(session, rows)


async def get_host(
    session: AsyncSession, *, caller: Caller, project_ref: str, host_ref: str
) -> Host:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.HOST_READ
    )
    row = await get_host_row_or_error(session, project=project, ref=host_ref)
    return (await hosts_to_models(session, [row]))[0]


def _row_error(index: int, spec: HostSpec, field: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"row {index + 1} ({spec.hostname}): {field}: {message}; nothing was imported",
        field=f"hosts.{index}.{field}",
    )


async def _clusters_by_ref(session: AsyncSession, project_id: str) -> dict[str, str]:
    rows = await session.execute(
        select(ClusterRow.id, ClusterRow.name).where(
            ClusterRow.project_id == project_id,
            ClusterRow.status.not_in([ClusterStatus.DELETING.value, ClusterStatus.DELETED.value]),
        )
    )
    out: dict[str, str] = {}
    for cluster_id, name in rows:
        out[str(cluster_id)] = str(cluster_id)
        out[str(name)] = str(cluster_id)
    return out


async def import_hosts(
    session: AsyncSession,
    *,
    caller: Caller,
    project_ref: str,
    specs: Sequence[HostSpec],
    now: dt.datetime,
) -> HostImportResult:
    """Create or update every row by hostname, all or nothing: a bad row raises
    ``InvalidInput`` naming the row (1-based) and the field, and nothing is written."""
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.HOST_MANAGE
    )
    clusters = await _clusters_by_ref(session, project.id)
    credentials = {
        str(name): str(cid)
        for cid, name in await session.execute(
            select(CredentialRow.id, CredentialRow.name).where(
                CredentialRow.project_id == project.id
            )
        )
    }
    hostnames = [s.hostname for s in specs]
    existing = {
        r.hostname: r
        for r in (
            await session.scalars(select(HostRow).where(HostRow.hostname.in_(hostnames)))
        ).all()
    }
    seen: dict[str, int] = {}
    resolved: list[tuple[HostSpec, str | None, str | None]] = []
    for index, spec in enumerate(specs):  # every check first: nothing written on a bad row
        if spec.hostname in seen:
            raise _row_error(
                index, spec, "hostname", f"also on row {seen[spec.hostname] + 1} of this import"
            )
        seen[spec.hostname] = index
        other = existing.get(spec.hostname)
        if other is not None and other.project_id != project.id:
            raise _row_error(index, spec, "hostname", "already in another project's inventory")
        cluster_id = None
        if spec.cluster is not None:
            cluster_id = clusters.get(spec.cluster)
            if cluster_id is None:
                raise _row_error(
                    index, spec, "cluster", f"no cluster {spec.cluster!r} in project {project.name}"
                )
        credential_id = None
        if spec.credential is not None:
            credential_id = credentials.get(spec.credential)
            if credential_id is None:
                raise _row_error(
                    index,
                    spec,
                    "credential",
                    f"no credential {spec.credential!r} in project {project.name} "
                    "(store it first: gpufleet credentials set)",
                )
        if spec.bmc_type is BmcType.SSH and not spec.host_key:
            raise _row_error(
                index, spec, "host_key", "an ssh host needs its pinned host key (ssh-ed25519 ...)"
            )
        if other is not None and other.node_id is not None and other.cluster_id != cluster_id:
            raise _row_error(
                index, spec, "cluster", "the host runs a node of another cluster; release it first"
            )
        resolved.append((spec, cluster_id, credential_id))
    result: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": []}
    for spec, cluster_id, credential_id in resolved:
        row = existing.get(spec.hostname)
        if row is None:
            row = HostRow(
                id=new_id(),
                project_id=project.id,
                hostname=spec.hostname,
                bmc_type=spec.bmc_type.value,
                credential_id=credential_id,
                cluster_id=cluster_id,
                role=spec.role.value,
                state=initial_state(spec.role).value,
                node_id=None,
                claim_token=None,
                created_at=now,
                updated_at=now,
                **{name: getattr(spec, name) for name in _PLAIN},
            )
            session.add(row)
            result["created"].append(spec.hostname)
            continue
        wanted: dict[str, Any] = {
            "bmc_type": spec.bmc_type.value,
            "credential_id": credential_id,
            "cluster_id": cluster_id,
            "role": spec.role.value,
            **{name: getattr(spec, name) for name in _PLAIN},
        }
        changes = {k: v for k, v in wanted.items() if getattr(row, k) != v}
        if not changes:
            result["unchanged"].append(spec.hostname)
            continue
        for key, value in changes.items():
            setattr(row, key, value)
        row.updated_at = now
        # A free host follows its new role into the pool or out of it.
        if "role" in changes and row.node_id is None and row.claim_token is None:
            target = initial_state(spec.role)
            if HostState(row.state) in (HostState.SPARE, HostState.IN_SERVICE):
                switch_host_state(
                    session, host=row, target=target, actor=caller.actor,
                    reason=f"role set to {spec.role.value} by an import", now=now,
                )  # fmt: skip
        result["updated"].append(spec.hostname)
    try:
        await session.flush()
    except IntegrityError:
        # Another import wrote one of these hostnames since this one looked: nothing of
        # this one is kept (the transaction rolls back).
        raise Conflict(
            "another import added one of these hostnames at the same time; nothing was "
            "imported: run the import again",
            field="hosts",
        ) from None
    record_audit(
        session,
        actor=caller.actor,
        action="host.import",
        object_type="host",
        object_id=None,
        project_id=project.id,
        detail={k: len(v) for k, v in result.items()} | {"hostnames": hostnames[:50]},
        ts=now,
    )
    return HostImportResult(**result)


async def bind_node_to_host(
    session: AsyncSession,
    *,
    host: HostRow,
    node: NodeRow,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> None:
    """Record that ``node`` runs on ``host`` (and on no other host)."""
    others = (
        await session.scalars(
            select(HostRow).where(HostRow.node_id == node.id, HostRow.id != host.id)
        )
    ).all()
    for other in others:
        other.node_id = None
        other.updated_at = now
    host.node_id = node.id
    host.cluster_id = node.cluster_id
    host.updated_at = now
    # The node takes the host's topology and BMC: the operator's inventory is the truth
    # about the physical machine; what the provider said stays where the inventory is silent
    # (the serial excepted: the agent reads it off the machine itself).
    node.serial = node.serial or host.serial
    node.bmc_address = host.bmc_address or node.bmc_address
    node.rack = host.rack or node.rack
    node.leaf_switch = host.leaf_switch or node.leaf_switch
    node.pdu = host.pdu or node.pdu
    if HostState(host.state) is not HostState.IN_SERVICE:
        switch_host_state(
            session, host=host, target=HostState.IN_SERVICE, actor=actor, reason=reason,
            now=now, data={"node_id": node.id},
        )  # fmt: skip


async def bind_host(
    session: AsyncSession,
    *,
    caller: Caller,
    project_ref: str,
    host_ref: str,
    node_id: str,
    now: dt.datetime,
) -> Host:
    """Bind a node of the project's clusters to this host (explicitly, by an admin)."""
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.HOST_MANAGE
    )
    host = await get_host_row_or_error(session, project=project, ref=host_ref)
    node = await session.get(NodeRow, node_id) if is_id(node_id) else None
    cluster = await session.get(ClusterRow, node.cluster_id) if node is not None else None
    if node is None or cluster is None or cluster.project_id != project.id:
        raise NotFound(f"node {node_id!r} not found in project {project.name}", field="node_id")
    if HostState(host.state) is HostState.OUT_OF_SERVICE:
        raise Conflict(
            f"host {host.hostname} is out of service (flagged for hardware service); "
            "once fixed, set it in_service or spare (gpufleet hosts set-state)",
            field="host",
        )
    if host.cluster_id is not None and host.cluster_id != node.cluster_id:
        raise Conflict(
            f"host {host.hostname} belongs to another cluster than node {node.name}",
            field="node_id",
        )
    await bind_node_to_host(
        session, host=host, node=node, actor=caller.actor,
        reason=f"bound to node {node.name}", now=now,
    )  # fmt: skip
    record_audit(
        session,
        actor=caller.actor,
        action="host.bind",
        object_type="host",
        object_id=host.id,
        project_id=project.id,
        detail={"hostname": host.hostname, "node_id": node.id},
        ts=now,
    )
    return (await hosts_to_models(session, [host]))[0]


async def set_host_state(
    session: AsyncSession,
    *,
    caller: Caller,
    project_ref: str,
    host_ref: str,
    target: HostState,
    reason: str,
    now: dt.datetime,
) -> Host:
    """An admin moves a host: out of service (maintenance; its node binding ends), back
    to the spare pool (its old claim forgotten) or into service. ``claimed`` is only ever
    reached through a failover's claim."""
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.HOST_MANAGE
    )
    host = await get_host_row_or_error(session, project=project, ref=host_ref)
    if target is HostState.CLAIMED:
        raise InvalidInput(
            "a host is claimed only by a failover; set in_service, spare or out_of_service",
            field="state",
        )
    if target is HostState.SPARE and host.node_id is not None:
        raise Conflict(
            f"host {host.hostname} runs node {host.node_id}; take it out of service first",
            field="state",
        )
    changed = switch_host_state(
        session, host=host, target=target, actor=caller.actor,
        reason=reason or f"set to {target.value} by hand", now=now,
    )  # fmt: skip
    if not changed:  # already there: the request is still on the record
        record_audit(
            session, actor=caller.actor, action="host.state", object_type="host",
            object_id=host.id, project_id=project.id, ts=now,
            detail={"from": target.value, "to": target.value, "reason": reason, "unchanged": True},
        )  # fmt: skip
    if target is HostState.OUT_OF_SERVICE:
        host.node_id = None
    if target is HostState.SPARE:
        host.claim_token = None  # a new failover may take it; the old token is spent
    return (await hosts_to_models(session, [host]))[0]


async def bind_by_hostname(
    session: AsyncSession, *, nodes: Sequence[NodeRow], now: dt.datetime
) -> int:
    """Bind each node to the host of its hostname, where that host is free and in the
    node's cluster (or in no cluster of another project). Called when agents first report
    their hostname. Returns how many were bound."""
    by_name = {n.hostname: n for n in nodes if n.hostname}
    if not by_name:
        return 0
    hosts = (
        await session.scalars(select(HostRow).where(HostRow.hostname.in_(list(by_name))))
    ).all()
    bound = 0
    for host in hosts:
        node = by_name[host.hostname]
        if host.node_id == node.id or HostState(host.state) is HostState.OUT_OF_SERVICE:
            continue
        if host.node_id is not None or (host.cluster_id not in (None, node.cluster_id)):
            continue
        cluster = await session.get(ClusterRow, node.cluster_id)
        if cluster is None or cluster.project_id != host.project_id:
            continue
        await bind_node_to_host(
            session, host=host, node=node, actor="system:inventory",
            reason=f"node {node.name} reported hostname {host.hostname}", now=now,
        )  # fmt: skip
        bound += 1
    return bound
