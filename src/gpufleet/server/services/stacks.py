"""Software stacks (``core.stacks``): the platform's catalog of them, one marked latest;
the stack a new cluster takes; what each node says it runs, and its skew from its
cluster's stack — shown on the node, and a ``stack-driver-skew`` finding for the GPU
driver (``FINDING_COMPONENTS``)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind, FindingSource, Severity
from gpufleet.core.errors import Conflict, NotFound
from gpufleet.core.models import Page
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.stacks import (
    COMPONENTS,
    FINDING_COMPONENTS,
    NodeSoftware,
    Skew,
    Stack,
    StackSpec,
    skew,
)
from gpufleet.server.db.tables import ClusterRow, FindingRow, NodeRow, StackRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.events import record_event
from gpufleet.server.services.findings import Sighting, clear_finding, open_or_fold_finding

SKEW_SIGNATURE = {"driver": "stack-driver-skew"}


def stack_of(row: StackRow) -> Stack:
    return Stack.model_validate(row)


async def list_stacks(session: AsyncSession) -> Page[Stack]:
    """Every stack, newest first (the latest marked)."""
    rows = await session.scalars(select(StackRow).order_by(StackRow.created_at.desc()))
    items = [stack_of(r) for r in rows]
    return Page[Stack](items=items, next_cursor=None)


async def get_stack_row(session: AsyncSession, name: str) -> StackRow:
    row = await session.get(StackRow, name)
    if row is None:
        raise NotFound(f"no stack named {name!r} (gpufleet stacks list)", field="stack")
    return row


async def create_stack(
    session: AsyncSession,
    *,
    caller: Caller,
    name: str,
    spec: StackSpec,
    notes: str,
    latest: bool,
    now: dt.datetime,
) -> Stack:
    """A new stack; ``latest``: new clusters take it from now on. Conflict for a name
    already taken (a stack never changes once made: make another)."""
    if await session.get(StackRow, name) is not None:
        raise Conflict(f"stack {name!r} exists; a stack never changes: name a new one")
    row = StackRow(
        name=name,
        **spec.model_dump(),
        latest=False,
        notes=notes,
        created_by=caller.actor,
        created_at=now,
    )
    session.add(row)
    await session.flush()
    record_audit(
        session,
        actor=caller.actor,
        action="stack.create",
        object_type="stack",
        object_id=name,
        project_id=None,
        detail={"spec": spec.model_dump(exclude_none=True), "latest": latest},
        ts=now,
    )
    if latest:
        await make_latest(session, caller=caller, name=name, now=now)
    return stack_of(row)


async def make_latest(
    session: AsyncSession, *, caller: Caller, name: str, now: dt.datetime
) -> Stack:
    """Mark ``name`` the latest stack (the one before it no longer is)."""
    row = await get_stack_row(session, name)
    await session.execute(
        update(StackRow)
        .where(StackRow.name != name, StackRow.latest.is_(True))
        .values(latest=False)
    )
    row.latest = True
    record_audit(
        session,
        actor=caller.actor,
        action="stack.latest",
        object_type="stack",
        object_id=name,
        project_id=None,
        detail={},
        ts=now,
    )
    await session.flush()
    return stack_of(row)


async def stack_for_new_cluster(session: AsyncSession, pinned: str | None) -> str | None:
    """The stack a new cluster records: the one pinned (NotFound if unknown), else the
    latest, else None (no stack defined yet)."""
    if pinned is not None:
        return (await get_stack_row(session, pinned)).name
    return await session.scalar(select(StackRow.name).where(StackRow.latest.is_(True)))


async def stack_user_data(session: AsyncSession, name: str | None) -> str | None:
    """The stack a new machine is to run, as the JSON its user data carries
    (``gpufleet_stack``: what an image build or cloud-init installs; the simulator's
    machines run it); None for a cluster without a stack."""
    row = None if name is None else await session.get(StackRow, name)
    if row is None:
        return None
    spec = StackSpec.model_validate(row, from_attributes=True)
    return json.dumps({"name": row.name, **spec.model_dump(exclude_none=True)}, sort_keys=True)


def software_of(node: NodeRow) -> NodeSoftware:
    return NodeSoftware.model_validate(node.software or {})


def stack_of_node(node: NodeRow, cluster: ClusterRow) -> str | None:
    """The stack the node should run: its own while a rollout moved it on (or rolled it
    back), else its cluster's."""
    return node.stack or cluster.stack


async def node_skew(session: AsyncSession, node: NodeRow, cluster: ClusterRow) -> list[Skew]:
    """What the node runs otherwise than its stack ([] without a stack)."""
    name = stack_of_node(node, cluster)
    if name is None:
        return []
    stack = await session.get(StackRow, name)
    if stack is None:
        return []
    return skew(StackSpec.model_validate(stack, from_attributes=True), software_of(node))


async def record_node_software(
    session: AsyncSession,
    *,
    node: NodeRow,
    project_id: str,
    software: NodeSoftware,
    now: dt.datetime,
) -> None:
    """Keep what the node's agent says it runs (an event when it changed), and open or
    clear its skew finding."""
    stored = software.model_dump(exclude_none=True)
    before = node.software or {}
    if stored == before:
        return
    node.software = stored
    changed = [
        f"{c} {before.get(c) or '-'} → {stored.get(c) or '-'}"
        for c in COMPONENTS
        if before.get(c) != stored.get(c)
    ]
    record_event(
        session,
        kind=EventKind.NODE_SOFTWARE,
        message=f"node {node.name} runs " + ", ".join(changed),
        project_id=project_id,
        cluster_id=node.cluster_id,
        node_id=node.id,
        actor=f"node:{node.name}",
        data={"before": before, "after": stored},
        ts=now,
    )
    cluster = await session.get(ClusterRow, node.cluster_id)
    if cluster is not None:
        await check_skew(session, node=node, cluster=cluster, project_id=project_id, now=now)


async def check_skew(
    session: AsyncSession,
    *,
    node: NodeRow,
    cluster: ClusterRow,
    project_id: str,
    now: dt.datetime,
) -> None:
    """Open (or keep) the skew finding of each ``FINDING_COMPONENTS`` the node runs
    otherwise than its cluster's stack; clear those it runs right again."""
    skews = {s.component: s for s in await node_skew(session, node, cluster)}
    catalog = get_catalog()
    for component in sorted(FINDING_COMPONENTS):
        signature_id = SKEW_SIGNATURE[component]
        open_row = await session.scalar(
            select(FindingRow).where(
                FindingRow.node_id == node.id,
                FindingRow.fold_key == signature_id,
                FindingRow.cleared_at.is_(None),
            )
        )
        found = skews.get(component)
        if found is None:
            if open_row is not None:
                clear_finding(
                    session, row=open_row, node=node, project_id=project_id, at=now,
                    actor=f"node:{node.name}", why=f"{component} matches stack {cluster.stack}",
                )  # fmt: skip
            continue
        signature = catalog.get(signature_id)
        assert signature is not None, signature_id  # the catalog test holds it
        evidence = (
            f"{component} {found.have or 'not reported'}; cluster {cluster.name}'s stack "
            f"{cluster.stack} pins {found.want}"
        )
        sighting = Sighting(
            key=signature_id,
            signature_id=signature_id,
            title=signature.title,
            severity=Severity(signature.severity),
            source=FindingSource.STACK,
            evidence=evidence,
            first_seen=now,
            last_seen=now,
            running_count=1,
            component=component,
        )
        open_or_fold_finding(
            session, node=node, project_id=project_id, open_row=open_row, sighting=sighting,
            actor=f"node:{node.name}", now=now, data=_skew_data(found),
        )  # fmt: skip


def _skew_data(found: Skew) -> dict[str, Any]:
    return {"component": found.component, "want": found.want, "have": found.have}
