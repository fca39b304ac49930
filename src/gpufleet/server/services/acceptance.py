"""Acceptance runs: create (provisioning, repair, an admin's request), list, show, report.

A run holds the cluster's suite as it was when the run began. The acceptance loop
(``workers/acceptance/``) carries it out: node-level checks first, then the
cluster-wide ones over the nodes that passed, then the report, then the nodes' and the
cluster's new states. See docs/acceptance.md.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.acceptance import (
    OPEN_STATUSES,
    AcceptanceNode,
    AcceptanceRun,
    AcceptanceScope,
    AcceptanceStatus,
    AcceptanceSuite,
    AcceptanceTrigger,
    canonical_json,
    content_hash,
    suite_or_default,
)
from gpufleet.core.enums import AcceptanceStage, ClusterStatus, EventKind, NodeState
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Page
from gpufleet.core.rbac import Permission
from gpufleet.server.db.tables import AcceptanceRunRow, ClusterRow, NodeRow, NodeStartupRow
from gpufleet.server.schemas.acceptance import RunAcceptanceRequest
from gpufleet.server.services.acceptance_report import render_html
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.clusters import get_cluster_row_or_error, switch_cluster_status
from gpufleet.server.services.events import record_event

ACTOR = "system:acceptance"
OPEN = [s.value for s in OPEN_STATUSES]
# Nodes a manual run may test: they report and are not in a repair's hands.
MANUAL_STATES = frozenset(
    {
        NodeState.ACCEPTANCE,
        NodeState.IN_SERVICE,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.DRAINED,
    }
)


def create_acceptance_run(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    scope: AcceptanceScope,
    trigger: AcceptanceTrigger,
    node_ids: Sequence[str],
    actor: str,
    now: dt.datetime,
    node_names: Sequence[str] = (),
    repair_id: str | None = None,
    suite: AcceptanceSuite | None = None,
) -> AcceptanceRunRow:
    """A run, ``pending``; the acceptance loop starts its checks. No network, no flush
    needed: it can sit in any transaction (the repair step's, the provisioning loop's)."""
    chosen = suite or suite_or_default(cluster.acceptance_suite)
    row = AcceptanceRunRow(
        id=new_id(),
        cluster_id=cluster.id,
        scope=scope.value,
        trigger=trigger.value,
        status=AcceptanceStatus.PENDING.value,
        stage=AcceptanceStage.NODE.value,
        node_ids=list(dict.fromkeys(node_ids)),
        check_run_ids=[],
        suite=chosen.model_dump(mode="json"),
        results={
            "checks": [],
            "nodes": {n: {"outcome": "pending", "reasons": []} for n in dict.fromkeys(node_ids)},
        },
        repair_id=repair_id,
        detail="waiting for the acceptance loop",
        report=None,
        report_sha256=None,
        created_by=actor,
        created_at=now,
        started_at=None,
        finished_at=None,
        updated_at=now,
    )
    session.add(row)
    shown = ", ".join(list(node_names)[:8]) + (
        f" and {len(node_names) - 8} more" if len(node_names) > 8 else ""
    )
    record_event(
        session,
        kind=EventKind.ACCEPTANCE_STARTED,
        message=f"cluster {cluster.name}: acceptance ({trigger.value}) requested on "
        f"{shown or f'{len(row.node_ids)} node(s)'}: " + ", ".join(c.label for c in chosen.checks),
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        node_id=row.node_ids[0] if len(row.node_ids) == 1 else None,
        actor=actor,
        data={"acceptance_run_id": row.id, "trigger": trigger.value, "nodes": len(row.node_ids)},
        ts=now,
    )
    return row


async def request_acceptance_run(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    request: RunAcceptanceRequest,
    now: dt.datetime,
) -> AcceptanceRun:
    """An admin runs the suite now (``POST /clusters/{id}/acceptance``), on the nodes named
    or on every node that reports and is not under repair. Nodes in acceptance are
    gated by the outcome (pass: in service; fail: cordoned); nodes in service stay in
    service whatever it says (a failed check raises a finding; the repair planner takes it
    from there). Runs on nodes that run jobs only where the check runner finds them idle,
    unless ``force``."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.NODE_ACTION, cluster.project_id)
    if ClusterStatus(cluster.status) in (
        ClusterStatus.DELETING,
        ClusterStatus.DELETED,
        ClusterStatus.FAILED,
    ):
        raise Conflict(f"cluster {cluster.name} is {cluster.status}", field="cluster_id")
    rows = list(
        await session.scalars(
            select(NodeRow)
            .where(NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value)
            .order_by(NodeRow.name)
        )
    )
    if request.nodes is not None:
        by_ref = {r.id: r for r in rows} | {r.name: r for r in rows}
        chosen = []
        for ref in request.nodes:
            node = by_ref.get(ref)
            if node is None:
                raise InvalidInput(f"cluster {cluster.name} has no node {ref!r}", field="nodes")
            if NodeState(node.state) not in MANUAL_STATES:
                raise InvalidInput(
                    f"node {node.name} is {node.state}: acceptance runs on nodes in "
                    + ", ".join(sorted(s.value for s in MANUAL_STATES)),
                    field="nodes",
                )
            chosen.append(node)
    else:
        chosen = [r for r in rows if NodeState(r.state) in MANUAL_STATES]
    busy = await _under_open_run(session, cluster_id=cluster.id)
    clash = [n.name for n in chosen if n.id in busy]
    if clash:
        raise Conflict(
            f"an acceptance run is already under way on {', '.join(clash[:8])}; wait for it "
            "(or run the others by naming them)",
            field="nodes",
        )
    if not chosen:
        raise InvalidInput(
            f"cluster {cluster.name} has no node to test (none reports and is out of repair)",
            field="nodes",
        )
    await session.refresh(cluster, with_for_update=True)
    row = create_acceptance_run(
        session,
        cluster=cluster,
        scope=AcceptanceScope.CLUSTER if request.nodes is None else AcceptanceScope.NODE,
        trigger=AcceptanceTrigger.MANUAL,
        node_ids=[n.id for n in chosen],
        node_names=[n.name for n in chosen],
        actor=caller.actor,
        now=now,
    )
    if request.force:
        row.results = {**row.results, "force": True}
    record_audit(
        session,
        actor=caller.actor,
        action="acceptance.run",
        object_type="acceptance_run",
        object_id=row.id,
        project_id=cluster.project_id,
        source_ip=caller.source_ip,
        detail={
            "nodes": [n.name for n in chosen],
            "reason": request.reason,
            "force": request.force,
        },
        ts=now,
    )
    await session.flush()
    return run_row_to_model(row, names={n.id: n.name for n in chosen}, with_nodes=True)


async def _under_open_run(session: AsyncSession, *, cluster_id: str) -> set[str]:
    out: set[str] = set()
    for node_ids in await session.scalars(
        select(AcceptanceRunRow.node_ids).where(
            AcceptanceRunRow.cluster_id == cluster_id, AcceptanceRunRow.status.in_(OPEN)
        )
    ):
        out.update(str(n) for n in node_ids or [])
    return out


def run_row_to_model(
    row: AcceptanceRunRow, *, names: dict[str, str], with_nodes: bool = False
) -> AcceptanceRun:
    results: dict[str, Any] = row.results or {}
    per_node: dict[str, Any] = results.get("nodes") or {}
    failed = [
        names.get(n, n) for n in row.node_ids if (per_node.get(n) or {}).get("outcome") == "fail"
    ]
    nodes = (
        [
            AcceptanceNode(
                node_id=n,
                name=names.get(n, n),
                outcome=str((per_node.get(n) or {}).get("outcome", "pending")),
                reasons=[str(r) for r in (per_node.get(n) or {}).get("reasons", [])],
            )
            for n in row.node_ids
        ]
        if with_nodes
        else None
    )
    return AcceptanceRun(
        id=row.id,
        cluster_id=row.cluster_id,
        scope=AcceptanceScope(row.scope),
        trigger=AcceptanceTrigger(row.trigger),
        status=AcceptanceStatus(row.status),
        stage=AcceptanceStage(row.stage),
        node_ids=list(row.node_ids),
        check_run_ids=list(row.check_run_ids),
        repair_id=row.repair_id,
        detail=row.detail,
        failed_nodes=sorted(failed),
        nodes=nodes,
        suite=suite_or_default(row.suite),
        report_sha256=row.report_sha256,
        created_by=row.created_by,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


async def node_names(session: AsyncSession, node_ids: Sequence[str]) -> dict[str, str]:
    if not node_ids:
        return {}
    rows = await session.execute(
        select(NodeRow.id, NodeRow.name).where(NodeRow.id.in_(list(set(node_ids))))
    )
    return {node_id: name for node_id, name in rows}


async def get_run_row_or_error(
    session: AsyncSession, *, caller: Caller, run_id: str
) -> tuple[AcceptanceRunRow, ClusterRow]:
    found = None
    if is_id(run_id):
        found = (
            await session.execute(
                select(AcceptanceRunRow, ClusterRow)
                .join(ClusterRow, ClusterRow.id == AcceptanceRunRow.cluster_id)
                .where(AcceptanceRunRow.id == run_id)
            )
        ).first()
    if found is None or not caller.can(Permission.CLUSTER_READ, found[1].project_id):
        raise NotFound(f"acceptance run {run_id!r} not found", field="acceptance_id")
    return found[0], found[1]


async def get_acceptance_run(
    session: AsyncSession, *, caller: Caller, run_id: str
) -> AcceptanceRun:
    row, _cluster = await get_run_row_or_error(session, caller=caller, run_id=run_id)
    names = await node_names(session, row.node_ids)
    return run_row_to_model(row, names=names, with_nodes=True)


async def list_acceptance_runs(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    trigger: AcceptanceTrigger | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[AcceptanceRun]:
    """A cluster's runs, newest first (``cursor``: the last id of the previous page)."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[AcceptanceRunRow] = select(AcceptanceRunRow).where(
        AcceptanceRunRow.cluster_id == cluster.id
    )
    if trigger is not None:
        query = query.where(AcceptanceRunRow.trigger == trigger.value)
    if cursor is not None:
        query = query.where(AcceptanceRunRow.id < cursor)
    rows = list(
        (await session.scalars(query.order_by(AcceptanceRunRow.id.desc()).limit(limit + 1))).all()
    )
    page = rows[:limit]
    names = await node_names(session, [n for r in page for n in r.node_ids])
    return Page[AcceptanceRun](
        items=[run_row_to_model(r, names=names) for r in page],
        next_cursor=page[-1].id if len(rows) > limit else None,
    )


async def get_report(
    session: AsyncSession, *, caller: Caller, run_id: str, as_html: bool
) -> tuple[bytes, str]:
    """The finished run's report: (bytes, SHA-256 of the JSON form). 409 while it runs."""
    row, _cluster = await get_run_row_or_error(session, caller=caller, run_id=run_id)
    if row.report is None or row.report_sha256 is None:
        raise Conflict(
            f"acceptance run {row.id} is {row.status} (stage {row.stage}): the report is "
            "written when it ends",
            field="acceptance_id",
        )
    data = canonical_json(row.report)
    digest = content_hash(row.report)
    if digest != row.report_sha256:  # the store changed what was written: say so loudly
        raise Conflict(
            f"acceptance run {row.id}: the stored report no longer matches its hash "
            f"{row.report_sha256}",
            field="acceptance_id",
        )
    if as_html:
        return render_html(row.report, sha256=digest).encode("utf-8"), digest
    return data, digest


# -- the cluster's status as its nodes come through startup and acceptance ------------------


async def held_by_startup(session: AsyncSession, *, node_ids: Sequence[str]) -> dict[str, str]:
    """Node id → error, for nodes whose latest start failed in a startup script."""
    if not node_ids:
        return {}
    latest: dict[str, NodeStartupRow] = {}
    for row in await session.scalars(
        select(NodeStartupRow)
        .where(NodeStartupRow.node_id.in_(list(node_ids)))
        .order_by(NodeStartupRow.created_at, NodeStartupRow.id)
    ):
        latest[row.node_id] = row
    return {n: r.error for n, r in latest.items() if r.status == "failed"}


async def settle_cluster_status(
    session: AsyncSession, *, cluster: ClusterRow, actor: str, now: dt.datetime
) -> None:
    """Move a cluster that is coming up (provisioning or acceptance) on by its nodes, in
    the caller's transaction (cluster row locked):

    - a node still booting (machine not up, or its startup scripts running): provisioning;
    - every machine up, some node still in acceptance (or an acceptance run open):
      acceptance;
    - no node left to test: ready when ``size`` nodes are in service; failed when every
      node failed to provision; where no node is in service and none is to be repaired
      (startup scripts failed everywhere), it stays, saying why; otherwise degraded,
      naming the nodes that are out (acceptance failed: cordoned, a repair is
      recommended; startup script failed: held in provisioning; no machine: failed).
      Clusters that opted out skip acceptance.

    A cluster that is ready or degraded is left alone here (``settle_degraded``).
    """
    status = ClusterStatus(cluster.status)
    if status not in (ClusterStatus.PROVISIONING, ClusterStatus.ACCEPTANCE):
        return
    rows = list(
        await session.scalars(
            select(NodeRow).where(
                NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value
            )
        )
    )
    if not rows:
        return
    provisioning = [r for r in rows if r.state == NodeState.PROVISIONING.value]
    held = await held_by_startup(session, node_ids=[r.id for r in provisioning])
    booting = [r for r in provisioning if r.id not in held]
    testing = [r for r in rows if r.state == NodeState.ACCEPTANCE.value]
    open_runs = bool(
        await session.scalar(
            select(AcceptanceRunRow.id).where(
                AcceptanceRunRow.cluster_id == cluster.id,
                AcceptanceRunRow.trigger != AcceptanceTrigger.REPAIR.value,
                AcceptanceRunRow.stage != AcceptanceStage.DONE.value,
            )
        )
    )
    in_service = [r for r in rows if r.state == NodeState.IN_SERVICE.value]
    failed = [r for r in rows if r.state == NodeState.FAILED.value]
    out = [r for r in rows if r not in in_service and r not in failed and r.id not in held]
    if booting:
        detail = f"{len(rows) - len(booting)}/{len(rows)} machines up" + (
            f"; {len(testing)} node(s) in acceptance" if testing else ""
        )
        _detail(cluster, detail + _held_text(rows, held), now)
        return
    if cluster.acceptance_tests and (testing or open_runs):
        reason = f"every machine is up; acceptance running on {len(testing)} node(s)"
        _to(session, cluster, ClusterStatus.ACCEPTANCE, actor, reason, now)
        _detail(cluster, _acceptance_text(testing) + _held_text(rows, held), now)
        return
    if failed and len(failed) == len(rows):
        _to(session, cluster, ClusterStatus.FAILED, actor, "every node failed to provision", now)
        return
    if len(in_service) >= cluster.size:
        passed = "passed acceptance" if cluster.acceptance_tests else "up (acceptance opted out)"
        _to(
            session,
            cluster,
            ClusterStatus.READY,
            actor,
            f"all {cluster.size} nodes in service: {passed}",
            now,
        )
        _detail(cluster, "", now)
        return
    if not in_service and not out:
        # Nothing usable and nothing to repair: scripts that fail (or machines that never
        # came) are fixed by a person, then retried. Stay, and say why.
        detail = "; ".join(
            p
            for p in (
                _held_text(rows, held).removeprefix("; "),
                f"no machine for {_names(failed)} (provisioning failed)" if failed else "",
            )
            if p
        )
        _detail(cluster, detail, now)
        return
    parts = []
    if out:
        parts.append(
            "acceptance failed on "
            + _names(out)
            + " (cordoned; the failed checks are findings, so a repair is recommended)"
        )
    parts.append(_held_text(rows, held).removeprefix("; "))
    if failed:
        parts.append(f"no machine for {_names(failed)} (provisioning failed)")
    detail = "; ".join(p for p in parts if p)
    _to(
        session,
        cluster,
        ClusterStatus.DEGRADED,
        actor,
        f"{len(in_service)}/{cluster.size} nodes in service: {detail}",
        now,
    )
    _detail(cluster, detail, now)


async def settle_degraded(
    session: AsyncSession, *, cluster: ClusterRow, actor: str, now: dt.datetime
) -> None:
    """A degraded cluster whose nodes are all back in service (repaired and accepted
    again) is ready."""
    if ClusterStatus(cluster.status) is not ClusterStatus.DEGRADED:
        return
    states = list(
        await session.scalars(
            select(NodeRow.state).where(
                NodeRow.cluster_id == cluster.id, NodeRow.state != NodeState.REMOVED.value
            )
        )
    )
    in_service = sum(1 for s in states if s == NodeState.IN_SERVICE.value)
    if in_service >= cluster.size and in_service == len(states):
        _to(
            session,
            cluster,
            ClusterStatus.READY,
            actor,
            f"all {cluster.size} nodes in service again",
            now,
        )
        _detail(cluster, "", now)


def _to(
    session: AsyncSession,
    cluster: ClusterRow,
    target: ClusterStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> None:
    switch_cluster_status(
        session, cluster=cluster, target=target, actor=actor, reason=reason, now=now
    )


def _detail(cluster: ClusterRow, detail: str, now: dt.datetime) -> None:
    if (cluster.status_detail or "") != detail:
        cluster.status_detail = detail[:4000]
        cluster.updated_at = now


def _names(rows: Sequence[NodeRow]) -> str:
    names = sorted(r.name for r in rows)
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def _held_text(rows: Sequence[NodeRow], held: dict[str, str]) -> str:
    if not held:
        return ""
    bad = [r for r in rows if r.id in held]
    first = held[bad[0].id] if bad else ""
    return f"; startup scripts failed on {_names(bad)} ({first})"


def _acceptance_text(testing: Sequence[NodeRow]) -> str:
    return f"acceptance running on {len(testing)} node(s)" if testing else "acceptance running"
