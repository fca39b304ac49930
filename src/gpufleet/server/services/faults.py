"""Faults injected into simulated nodes (``gpufleet inject``): the demo's and tests' way to
make a node fail on purpose and watch the finding arrive.

The fault goes into the sim world through the node's provider; the node's simulated agent
is woken by the world and reports the finding at once, through the real agent protocol,
so what follows (finding, health, events) is exactly what a real node would cause.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.core.enums import EventKind, Severity
from gpufleet.core.errors import Conflict, DriverError, InvalidInput
from gpufleet.core.faults import Fault
from gpufleet.core.rbac import Permission
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.core.signatures.models import Signature
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.schemas.faults import InjectFaultRequest
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.events import record_event
from gpufleet.server.services.nodes import get_node_row_or_error
from gpufleet.sim.faults import SimFault
from gpufleet.sim.world import SimWorld

REAL_NODE_HINT = (
    "inject works on sim nodes; on a real node use `gpufleet inject --log PATH "
    "--signature ID` on the node itself, writing to the log file its agent follows"
)


def _signature_or_error(signature_id: str) -> Signature:
    signature = get_signature(signature_id)
    if signature is None:
        raise InvalidInput(
            f"unknown signature {signature_id!r}; use an id from the signature catalog "
            "(e.g. xid-79, xid-48, thermal-slowdown, ib-link-down)",
            field="signature",
        )
    return signature


async def _sim_node(
    db: Database, *, caller: Caller, drivers: DriverRegistry, node_id: str
) -> tuple[NodeRow, ClusterRow, SimWorld, str]:
    async with db.session() as session:
        node, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
    require(caller, Permission.NODE_ACTION, cluster.project_id)
    provider = drivers.providers.get(cluster.provider)
    if not isinstance(provider, SimProvider):
        raise Conflict(f"node {node.name} is on provider {cluster.provider!r}: {REAL_NODE_HINT}")
    if node.provider_instance_id is None:
        raise Conflict(f"node {node.name} has no machine yet (state {node.state}); try later")
    return node, cluster, provider.world, node.provider_instance_id


def _to_fault(fault: SimFault, *, node: NodeRow, world: SimWorld, title: str) -> Fault:
    instance = world.get_instance(fault.instance_id)
    gpu = None
    if instance is not None and fault.gpu_index is not None:
        gpu = next((g for g in instance.gpus if g.index == fault.gpu_index), None)
    signature = get_signature(fault.signature_id)
    return Fault(
        id=fault.fault_id,
        node_id=node.id,
        node_name=node.name,
        signature=fault.signature_id,
        title=title,
        severity=signature.severity if signature is not None else Severity.CRITICAL,
        gpu_index=fault.gpu_index,
        gpu_uuid=gpu.uuid if gpu else None,
        count=fault.count,
        origin=fault.origin,
        sticky=fault.sticky,
        started_at=fault.started_at,
        clears_at=fault.clears_at,
        cleared_at=fault.cleared_at,
    )


async def inject_fault(
    db: Database,
    *,
    caller: Caller,
    drivers: DriverRegistry,
    node_id: str,
    request: InjectFaultRequest,
) -> Fault:
    """Make the sim node fail with ``request.signature``. Admin only (``node.action``).

    Raises NotFound (node), Forbidden (role), InvalidInput (signature, gpu_index) and
    Conflict (not a sim node, no machine yet, machine gone).
    """
    node, cluster, world, instance_id = await _sim_node(
        db, caller=caller, drivers=drivers, node_id=node_id
    )
    signature = _signature_or_error(request.signature)
    if request.gpu_index is not None and request.gpu_index >= node.expected_gpus:
        raise InvalidInput(
            f"node {node.name} has GPUs 0..{node.expected_gpus - 1}; "
            f"gpu_index {request.gpu_index} is out of range",
            field="gpu_index",
        )
    try:
        # In a thread, like every sim provider call: the mutation writes the world's journal.
        fault = await asyncio.to_thread(
            world.inject_fault,
            instance_id,
            signature_id=signature.id,
            gpu_index=request.gpu_index,
            sticky=request.sticky,
        )
    except DriverError as exc:
        raise Conflict(f"cannot inject into node {node.name}: {exc}") from None
    where = "" if fault.gpu_index is None else f" GPU {fault.gpu_index}"
    detail = {
        "signature": signature.id,
        "gpu_index": fault.gpu_index,
        "fault_id": fault.fault_id,
        "sticky": request.sticky,
    }
    await _record(
        db,
        caller=caller,
        node=node,
        cluster=cluster,
        kind=EventKind.FAULT_INJECTED,
        action="node.fault.inject",
        message=f"node {node.name}{where}: fault {signature.id} injected by {caller.actor}",
        detail=detail,
    )
    return _to_fault(fault, node=node, world=world, title=signature.title)


async def clear_fault(
    db: Database,
    *,
    caller: Caller,
    drivers: DriverRegistry,
    node_id: str,
    signature_id: str,
    gpu_index: int | None,
) -> list[Fault]:
    """Clear the node's open faults of ``signature_id``; the faults cleared (maybe none)."""
    node, cluster, world, instance_id = await _sim_node(
        db, caller=caller, drivers=drivers, node_id=node_id
    )
    signature = _signature_or_error(signature_id)
    try:
        cleared = await asyncio.to_thread(
            world.clear_fault, instance_id, signature_id=signature.id, gpu_index=gpu_index
        )
    except DriverError as exc:
        raise Conflict(f"cannot clear a fault on node {node.name}: {exc}") from None
    detail = {"signature": signature.id, "fault_ids": [f.fault_id for f in cleared]}
    if cleared:
        await _record(
            db,
            caller=caller,
            node=node,
            cluster=cluster,
            kind=EventKind.FAULT_CLEARED,
            action="node.fault.clear",
            message=f"node {node.name}: fault {signature.id} cleared by {caller.actor}",
            detail=detail,
        )
    else:  # nothing to clear: no event, but the ask is on record
        async with db.transaction() as session:
            record_audit(
                session,
                actor=caller.actor,
                action="node.fault.clear",
                object_type="node",
                object_id=node.id,
                project_id=cluster.project_id,
                source_ip=caller.source_ip,
                detail=detail,
            )
    return [_to_fault(f, node=node, world=world, title=signature.title) for f in cleared]


async def list_faults(
    db: Database, *, caller: Caller, drivers: DriverRegistry, node_id: str
) -> list[Fault]:
    """The sim node's open faults, injected and background."""
    async with db.session() as session:
        node, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
    provider = drivers.providers.get(cluster.provider)
    if not isinstance(provider, SimProvider) or node.provider_instance_id is None:
        return []
    world = provider.world
    out = []
    for fault in world.faults_of(node.provider_instance_id):
        signature = get_signature(fault.signature_id)
        title = signature.title if signature is not None else fault.signature_id
        out.append(_to_fault(fault, node=node, world=world, title=title))
    return out


async def _record(
    db: Database,
    *,
    caller: Caller,
    node: NodeRow,
    cluster: ClusterRow,
    kind: EventKind,
    action: str,
    message: str,
    detail: dict[str, Any],
) -> None:
    """The event on the node's timeline and the audit row of a fault action."""
    async with db.transaction() as session:
        record_event(
            session,
            kind=kind,
            message=message,
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=node.id,
            actor=caller.actor,
            data=detail,
        )
        record_audit(
            session,
            actor=caller.actor,
            action=action,
            object_type="node",
            object_id=node.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail=detail,
        )
