"""Active check runs: create, list, show, cancel; the one function that changes a run's
status.

A run is created ``pending``; the check runner (``workers/checks/``) takes it from there:
it skips nodes that run a job (unless forced), starts the commands through a backend,
follows them, judges the output and sets the outcome. Creating a run touches no network,
so ``create_check_run`` can sit inside any transaction (the acceptance suite's too).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.models import CheckKind
from gpufleet.checks.runners import normalise_params
from gpufleet.core.enums import CheckStatus, ClusterStatus, EventKind, NodeState
from gpufleet.core.errors import Forbidden, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.core.transitions import CHECK_RUN
from gpufleet.server.db.tables import CheckRunRow, ClusterRow, NodeRow
from gpufleet.server.schemas.checks import (
    CheckRun,
    CheckRunNode,
    CreateCheckRunRequest,
    SkippedNode,
)
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.events import record_event
from gpufleet.server.services.transitions import Subject, transition

PURPOSES = ("on_demand", "acceptance", "localisation")
ENDED = frozenset(
    {CheckStatus.PASSED, CheckStatus.FAILED, CheckStatus.ERROR, CheckStatus.CANCELLED}
)
# Nodes a check may run on. Not provisioning (no agent yet), not failed or on the way out.
CHECKABLE_STATES = frozenset(
    {
        NodeState.ACCEPTANCE,
        NodeState.IN_SERVICE,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.DRAINED,
        NodeState.REPAIRING,
    }
)
_CLOSED_CLUSTERS = frozenset({ClusterStatus.DELETING.value, ClusterStatus.DELETED.value})


async def create_check_run(
    session: AsyncSession,
    *,
    actor: str,
    cluster: ClusterRow,
    kind: CheckKind,
    node_ids: Sequence[str],
    params: Mapping[str, object] | None = None,
    force: bool = False,
    purpose: str = "on_demand",
    parent_id: str | None = None,
    now: dt.datetime,
    source_ip: str | None = None,
) -> CheckRunRow:
    """Record a check run, ``pending``; the check runner starts it.

    ``node_ids`` must be nodes of ``cluster`` in a state a check can run in
    (``CHECKABLE_STATES``). ``force``: run even where a job runs (the caller has checked
    that the actor may). Acceptance runs never wait for idle nodes: their nodes take no
    work yet. An event is written; on-demand runs get an audit row too.

    Raises:
        InvalidInput: no nodes, a node not of this cluster or not checkable, bad
            ``params`` (``params.<key>``), an unknown purpose or parent.
        Conflict: the cluster is being deleted.
    """
    if purpose not in PURPOSES:
        raise InvalidInput(f"purpose must be one of {', '.join(PURPOSES)}", field="purpose")
    if cluster.status in _CLOSED_CLUSTERS:
        raise InvalidInput(f"cluster {cluster.name} is {cluster.status}", field="cluster")
    wanted = list(dict.fromkeys(node_ids))
    if not wanted:
        raise InvalidInput("a check needs at least one node", field="nodes")
    rows = {
        r.id: r
        for r in await session.scalars(
            select(NodeRow).where(NodeRow.cluster_id == cluster.id, NodeRow.id.in_(wanted))
        )
    }
    missing = [n for n in wanted if n not in rows]
    if missing:
        raise InvalidInput(
            f"node {missing[0]!r} is not a node of cluster {cluster.name}", field="nodes"
        )
    for node_id in wanted:
        node = rows[node_id]
        if NodeState(node.state) not in CHECKABLE_STATES:
            raise InvalidInput(
                f"node {node.name} is {node.state}: checks run on nodes in "
                f"{', '.join(sorted(s.value for s in CHECKABLE_STATES))}",
                field="nodes",
            )
    values = normalise_params(kind, params, nodes=len(wanted))
    if parent_id is not None:
        parent = await session.get(CheckRunRow, parent_id)
        if parent is None or parent.cluster_id != cluster.id:
            raise InvalidInput(f"no check run {parent_id!r} in this cluster", field="parent_id")
    row = CheckRunRow(
        id=new_id(),
        cluster_id=cluster.id,
        kind=kind.value,
        params=values,
        node_ids=wanted,
        status=CheckStatus.PENDING.value,
        requested_by=actor,
        result={},
        raw_output="",
        created_at=now,
        updated_at=now,
        started_at=None,
        finished_at=None,
        purpose=purpose,
        parent_id=parent_id,
        forced=force,
        backend=None,
        progress={},
        skipped=[],
        detail="",
        deadline_at=None,
    )
    session.add(row)
    names = [rows[n].name for n in wanted]
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    record_event(
        session,
        kind=EventKind.CHECK_REQUESTED,
        message=f"check {kind.value} ({purpose}) requested on {shown}"
        + (" (forced onto busy nodes)" if force else ""),
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        node_id=wanted[0] if len(wanted) == 1 else None,
        actor=actor,
        data={
            "check_run_id": row.id,
            "kind": kind.value,
            "purpose": purpose,
            "params": values,
            "nodes": names,
            "forced": force,
            "parent_id": parent_id,
        },
        ts=now,
    )
    if purpose == "on_demand":
        record_audit(
            session,
            actor=actor,
            action="check.run",
            object_type="check_run",
            object_id=row.id,
            project_id=cluster.project_id,
            source_ip=source_ip,
            detail={"kind": kind.value, "nodes": names, "params": values, "forced": force},
            ts=now,
        )
    await session.flush()
    return row


async def request_check_run(
    session: AsyncSession, *, caller: Caller, request: CreateCheckRunRequest, now: dt.datetime
) -> CheckRun:
    """``POST /checks``: members run checks on their project's nodes; only admins force
    a check onto nodes that run jobs."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=request.cluster)
    require(caller, Permission.CHECK_RUN, cluster.project_id)
    if request.force and not caller.can(Permission.NODE_ACTION, cluster.project_id):
        raise Forbidden(
            "only a project admin may force a check onto nodes that run jobs", field="force"
        )
    params: dict[str, Any] = dict(request.params)
    if request.level is not None:
        if request.check is not CheckKind.DCGM_DIAG:
            raise InvalidInput("level applies to dcgm-diag only", field="level")
        params["level"] = request.level
    if request.nodes is None:
        node_ids = list(
            await session.scalars(
                select(NodeRow.id)
                .where(
                    NodeRow.cluster_id == cluster.id,
                    NodeRow.state == NodeState.IN_SERVICE.value,
                )
                .order_by(NodeRow.name)
            )
        )
        if not node_ids:
            raise InvalidInput(
                f"cluster {cluster.name} has no node in service; name the nodes", field="nodes"
            )
    else:
        node_ids = await resolve_nodes(session, cluster=cluster, refs=request.nodes)
    row = await create_check_run(
        session,
        actor=caller.actor,
        cluster=cluster,
        kind=request.check,
        node_ids=node_ids,
        params=params,
        force=request.force,
        now=now,
        source_ip=caller.source_ip,
    )
    return await check_run_to_model(session, row, with_result=True)


async def resolve_nodes(
    session: AsyncSession, *, cluster: ClusterRow, refs: Sequence[str]
) -> list[str]:
    """Node ids for names or ids of ``cluster``'s nodes (removed ones left out)."""
    rows = list(
        await session.scalars(
            select(NodeRow).where(
                NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value
            )
        )
    )
    by_ref = {r.id: r.id for r in rows} | {r.name: r.id for r in rows}
    out: list[str] = []
    for ref in refs:
        node_id = by_ref.get(ref)
        if node_id is None:
            raise InvalidInput(f"cluster {cluster.name} has no node {ref!r}", field="nodes")
        out.append(node_id)
    return list(dict.fromkeys(out))


async def check_run_to_model(
    session: AsyncSession,
    row: CheckRunRow,
    *,
    with_result: bool,
    names: dict[str, str] | None = None,
) -> CheckRun:
    if names is None:
        names = await node_names(session, row.node_ids)
    result = dict(row.result or {})
    outcome = result.get("outcome")
    return CheckRun(
        id=row.id,
        cluster_id=row.cluster_id,
        kind=CheckKind(row.kind),
        purpose=row.purpose,
        parent_id=row.parent_id,
        status=CheckStatus(row.status),
        outcome=outcome if isinstance(outcome, str) else None,
        params=dict(row.params or {}),
        nodes=[CheckRunNode(id=n, name=names.get(n, n)) for n in row.node_ids],
        skipped=[SkippedNode.model_validate(s) for s in row.skipped or []],
        forced=row.forced,
        backend=row.backend,
        requested_by=row.requested_by,
        detail=row.detail,
        result=result if with_result else None,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        deadline_at=row.deadline_at,
    )


async def node_names(session: AsyncSession, node_ids: Sequence[str]) -> dict[str, str]:
    if not node_ids:
        return {}
    rows = await session.execute(
        select(NodeRow.id, NodeRow.name).where(NodeRow.id.in_(list(node_ids)))
    )
    return {node_id: name for node_id, name in rows}


async def get_check_run_row_or_error(
    session: AsyncSession, *, caller: Caller, run_id: str
) -> tuple[CheckRunRow, ClusterRow]:
    found = None
    if is_id(run_id):
        found = (
            await session.execute(
                select(CheckRunRow, ClusterRow)
                .join(ClusterRow, ClusterRow.id == CheckRunRow.cluster_id)
                .where(CheckRunRow.id == run_id)
            )
        ).first()
    if found is None or not caller.can(Permission.CHECK_READ, found[1].project_id):
        raise NotFound(f"check run {run_id!r} not found", field="check_id")
    return found[0], found[1]


async def get_check_run(session: AsyncSession, *, caller: Caller, run_id: str) -> CheckRun:
    row, _cluster = await get_check_run_row_or_error(session, caller=caller, run_id=run_id)
    return await check_run_to_model(session, row, with_result=True)


async def get_check_output(session: AsyncSession, *, caller: Caller, run_id: str) -> str:
    row, _cluster = await get_check_run_row_or_error(session, caller=caller, run_id=run_id)
    return row.raw_output


async def list_check_runs(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str | None = None,
    status: Sequence[CheckStatus] | None = None,
    kind: CheckKind | None = None,
    parent_id: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[CheckRun]:
    """Newest first; ``cursor`` is the last run id of the previous page."""
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[CheckRunRow] = select(CheckRunRow).join(
        ClusterRow, ClusterRow.id == CheckRunRow.cluster_id
    )
    visible = [
        p for p in (caller.visible_project_ids() or []) if caller.can(Permission.CHECK_READ, p)
    ]
    if caller.visible_project_ids() is not None:
        query = query.where(ClusterRow.project_id.in_(visible))
    if cluster_id is not None:
        query = query.where(CheckRunRow.cluster_id == cluster_id)
    if status:
        query = query.where(CheckRunRow.status.in_([s.value for s in status]))
    if kind is not None:
        query = query.where(CheckRunRow.kind == kind.value)
    if parent_id is not None:
        query = query.where(CheckRunRow.parent_id == parent_id)
    if cursor:
        query = query.where(CheckRunRow.id < cursor)
    rows = list(
        (await session.scalars(query.order_by(CheckRunRow.id.desc()).limit(limit + 1))).all()
    )
    names = await node_names(session, [n for r in rows[:limit] for n in r.node_ids])
    items = [
        await check_run_to_model(session, r, with_result=False, names=names) for r in rows[:limit]
    ]
    return Page[CheckRun](items=items, next_cursor=items[-1].id if len(rows) > limit else None)


async def cancel_check_run(
    session: AsyncSession, *, caller: Caller, run_id: str, now: dt.datetime
) -> CheckRun:
    """Cancel a run. A pending one ends at once; a running one is marked, and the check
    runner's next pass stops its commands (removes its Slurm job and reservation) and
    ends it as cancelled. An ended run is left as it is."""
    row, cluster = await get_check_run_row_or_error(session, caller=caller, run_id=run_id)
    require(caller, Permission.CHECK_RUN, cluster.project_id)
    locked = await session.get(CheckRunRow, row.id, with_for_update=True, populate_existing=True)
    assert locked is not None
    was = CheckStatus(locked.status)
    if was is CheckStatus.PENDING and "localiser" not in (locked.progress or {}):
        switch_check_status(
            session,
            run=locked,
            project_id=cluster.project_id,
            target=CheckStatus.CANCELLED,
            actor=caller.actor,
            reason=f"cancelled by {caller.actor} before it started",
            now=now,
        )
    elif was not in ENDED:
        # Its commands (or Slurm job, or probe runs) are stopped by the runner's next
        # pass, which then ends the run as cancelled.
        locked.progress = {**(locked.progress or {}), "cancel": f"cancelled by {caller.actor}"}
        locked.detail = f"cancelling (asked by {caller.actor})"
        locked.updated_at = now
    record_audit(  # an ended run changes nothing, but the ask is on record too
        session,
        actor=caller.actor,
        action="check.cancel",
        object_type="check_run",
        object_id=locked.id,
        project_id=cluster.project_id,
        source_ip=caller.source_ip,
        detail={"from": was.value, "changed": was not in ENDED},
        ts=now,
    )
    return await check_run_to_model(session, locked, with_result=True)


def switch_check_status(
    session: AsyncSession,
    *,
    run: CheckRunRow,
    project_id: str,
    target: CheckStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
    data: dict[str, Any] | None = None,
) -> bool:
    """The one way a run changes status: checked against ``CHECK_TRANSITIONS``, evented,
    audited. An ended run's lease is released. False if unchanged."""
    subject = Subject(
        object_id=run.id,
        label=f"check {run.kind} {run.id}",
        project_id=project_id,
        cluster_id=run.cluster_id,
        node_id=run.node_ids[0] if len(run.node_ids) == 1 else None,
        ids={"check_run_id": run.id},
    )
    if not transition(
        session, lifecycle=CHECK_RUN, row=run, subject=subject, target=target, actor=actor,
        reason=reason, now=now, data=data,
    ):  # fmt: skip
        return False
    run.updated_at = now
    if target is CheckStatus.RUNNING and run.started_at is None:
        run.started_at = now
    if target in ENDED:
        run.finished_at = now
        run.lock_owner = run.lock_token = None
        run.lock_expires_at = None
    run.detail = reason
    return True
