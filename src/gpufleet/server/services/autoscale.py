"""Autoscaling, the one owner of a cluster's size once it is made: its settings, and each
change of size as an ``AutoscaleAction`` (``core.autoscaling``), whoever asked for it —
gpufleet's policy (``workers/autoscaler.py``), Kubernetes' Cluster Autoscaler (the
externalgrpc service) or Slurm's power saving (``gpufleet slurm resume``/``suspend``).

- **Up**: the nodes' rows are made at once (named by ``free_slots``, or as Slurm
  names them), the cluster's size grows, and the provisioning and acceptance loops bring
  them in; the action ends when all are in service (or one failed).
- **Down**: only nodes that may go (``removal_refusal``: in service, no open repair, not
  in acceptance, no job the last time the scheduler was read); the size shrinks at once,
  and the autoscaler loop holds each node, checks again that no job landed, and gives
  its machine back. A node that took work meanwhile stays, and the size grows back.

Every action is an event with its reasons; every status change goes through
``switch_autoscale_status`` (one event, one audit row).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.acceptance import OPEN_STATUSES as OPEN_ACCEPTANCE_STATUSES
from gpufleet.core.autoscale import AutoscalePolicy
from gpufleet.core.autoscaling import (
    AutoscaleAction,
    AutoscaleKind,
    AutoscaleMode,
    AutoscaleSettings,
    AutoscaleSource,
    AutoscaleStatus,
)
from gpufleet.core.enums import ClusterStatus, EventKind, NodeState
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.core.ids import new_id
from gpufleet.core.models import Page
from gpufleet.core.repair.models import OPEN_STATUSES as OPEN_REPAIR_STATUSES
from gpufleet.core.transitions import AUTOSCALE_ACTION
from gpufleet.server.db.tables import (
    AcceptanceRunRow,
    AutoscaleActionRow,
    AutoscalePolicyRow,
    ClusterRow,
    NodeRow,
    RepairRow,
)
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.clusters import (
    get_cluster_row_or_error,
    new_node_row,
    new_node_rows,
)
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_slots import free_slots
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.transitions import Subject, transition

DEFAULTS = AutoscaleSettings(cluster_id="")
FINAL = frozenset({AutoscaleStatus.SUCCEEDED, AutoscaleStatus.FAILED, AutoscaleStatus.CANCELLED})
# Clusters whose size may change: made, not on their way out.
SCALABLE = frozenset({ClusterStatus.READY, ClusterStatus.DEGRADED, ClusterStatus.ACCEPTANCE})
# Nodes that never took work (their machine not up, or failed to come): Slurm's
# SuspendProgram may power them down (a resume that timed out); they go at once.
NEVER_CAME = frozenset({NodeState.PROVISIONING, NodeState.FAILED})


def provider_id_of(cluster_id: str, node_name: str) -> str:
    """The Kubernetes ``spec.providerID`` of a node gpufleet made (its kubelet is started
    with ``--provider-id`` from the ``gpufleet_provider_id`` in its user data), which
    Cluster Autoscaler matches against the instances of a node group."""
    return f"gpufleet://{cluster_id}/{node_name}"


# -- settings -----------------------------------------------------------------------------


def settings_of(cluster: ClusterRow, row: AutoscalePolicyRow | None) -> AutoscaleSettings:
    if row is None:
        return DEFAULTS.model_copy(
            update={
                "cluster_id": cluster.id,
                "min_nodes": cluster.autoscale_min,
                "max_nodes": cluster.autoscale_max,
            }
        )
    return AutoscaleSettings(
        cluster_id=cluster.id,
        mode=AutoscaleMode(row.mode),
        min_nodes=cluster.autoscale_min,
        max_nodes=cluster.autoscale_max,
        scale_up_after_s=row.scale_up_after_s,
        scale_down_after_s=row.scale_down_after_s,
        up_cooldown_s=row.up_cooldown_s,
        down_cooldown_s=row.down_cooldown_s,
        max_step=row.max_step,
        last_up_at=row.last_up_at,
        last_down_at=row.last_down_at,
        last_decision=row.last_decision,
        updated_at=row.updated_at,
    )


def policy_of(settings: AutoscaleSettings) -> AutoscalePolicy:
    """The pure policy's settings; only for a cluster with both bounds."""
    assert settings.min_nodes is not None and settings.max_nodes is not None
    return AutoscalePolicy(
        min_nodes=settings.min_nodes,
        max_nodes=settings.max_nodes,
        scale_up_after_s=settings.scale_up_after_s,
        scale_down_after_s=settings.scale_down_after_s,
        up_cooldown_s=settings.up_cooldown_s,
        down_cooldown_s=settings.down_cooldown_s,
        max_step=settings.max_step,
    )


async def policy_row(session: AsyncSession, cluster: ClusterRow) -> AutoscalePolicyRow:
    """The cluster's policy row, made with the defaults (mode off) when it has none."""
    row = await session.get(AutoscalePolicyRow, cluster.id, with_for_update=True)
    if row is None:
        row = AutoscalePolicyRow(
            cluster_id=cluster.id,
            mode=AutoscaleMode.OFF.value,
            scale_up_after_s=DEFAULTS.scale_up_after_s,
            scale_down_after_s=DEFAULTS.scale_down_after_s,
            up_cooldown_s=DEFAULTS.up_cooldown_s,
            down_cooldown_s=DEFAULTS.down_cooldown_s,
            max_step=DEFAULTS.max_step,
            last_decision="",
            updated_by="system:autoscaler",
            updated_at=cluster.updated_at,
        )
        session.add(row)
        await session.flush()
    return row


# -- actions ------------------------------------------------------------------------------


def action_to_model(row: AutoscaleActionRow) -> AutoscaleAction:
    return AutoscaleAction(
        id=row.id,
        cluster_id=row.cluster_id,
        kind=AutoscaleKind(row.kind),
        status=AutoscaleStatus(row.status),
        source=AutoscaleSource(row.source),
        count=row.count,
        nodes=[str(n) for n in row.node_names],
        reasons=[str(r) for r in row.reasons],
        detail=row.detail,
        actor=row.actor,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
    )


async def list_autoscale_actions(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    limit: int,
    cursor: str | None,
) -> Page[AutoscaleAction]:
    """A cluster's actions, newest first (ids are time-ordered)."""
    cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    query = (
        select(AutoscaleActionRow)
        .where(AutoscaleActionRow.cluster_id == cluster.id)
        .order_by(AutoscaleActionRow.id.desc())
        .limit(limit + 1)
    )
    if cursor is not None:
        query = query.where(AutoscaleActionRow.id < cursor)
    rows = list(await session.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(items=[action_to_model(r) for r in rows], next_cursor=rows[-1].id if more else None)


def switch_autoscale_status(
    session: AsyncSession,
    *,
    action: AutoscaleActionRow,
    cluster: ClusterRow,
    target: AutoscaleStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> bool:
    """The one way an action's status changes (an event and an audit row)."""
    changed = transition(
        session,
        lifecycle=AUTOSCALE_ACTION,
        row=action,
        subject=Subject(
            object_id=action.id,
            label=f"cluster {cluster.name}: {action.kind.replace('_', ' ')} {action.id[-8:]}",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=None,
            ids={"action_id": action.id},
        ),
        target=target,
        actor=actor,
        reason=reason,
        now=now,
        data={"nodes": list(action.node_names)},
    )
    if changed:
        action.detail = reason
        action.updated_at = now
        if target in FINAL:
            action.finished_at = now
    return changed


async def nodes_in_acceptance(session: AsyncSession, cluster_id: str) -> set[str]:
    """Ids of the cluster's nodes in an acceptance run not yet over (an admin's run on
    nodes in service too, not only new or repaired nodes in state acceptance)."""
    runs = await session.scalars(
        select(AcceptanceRunRow.node_ids).where(
            AcceptanceRunRow.cluster_id == cluster_id,
            AcceptanceRunRow.status.in_([s.value for s in OPEN_ACCEPTANCE_STATUSES]),
        )
    )
    return {str(node_id) for ids in runs for node_id in ids or ()}


async def open_actions(session: AsyncSession, cluster_id: str) -> list[AutoscaleActionRow]:
    return list(
        await session.scalars(
            select(AutoscaleActionRow)
            .where(
                AutoscaleActionRow.cluster_id == cluster_id,
                AutoscaleActionRow.status == AutoscaleStatus.ACTING.value,
            )
            .order_by(AutoscaleActionRow.id)
        )
    )


async def live_node_count(session: AsyncSession, cluster_id: str) -> int:
    return int(
        await session.scalar(
            select(func.count())
            .select_from(NodeRow)
            .where(
                NodeRow.cluster_id == cluster_id,
                NodeRow.state.not_in([NodeState.REMOVING.value, NodeState.REMOVED.value]),
            )
        )
        or 0
    )


def _check_scalable(cluster: ClusterRow) -> None:
    if ClusterStatus(cluster.status) not in SCALABLE:
        raise Conflict(
            f"cluster {cluster.name} is {cluster.status}; its size changes only once it is "
            "made (ready, degraded or in acceptance)"
        )


async def start_scale_up(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    count: int,
    source: AutoscaleSource,
    reasons: Sequence[str],
    actor: str,
    now: dt.datetime,
    names: Sequence[str] | None = None,
    revive: Sequence[NodeRow] = (),
) -> AutoscaleActionRow:
    """Grow the cluster by ``count`` nodes: their rows now (provisioning), the size with
    them. ``names``: Slurm's own names for new nodes, and ``revive``: nodes powered down
    before that come back as themselves (power saving); else ``count`` new nodes. Refuses
    (``Conflict``) over the cluster's maximum or while it is not made; the caller holds
    the cluster row locked."""
    _check_scalable(cluster)
    if count < 1:
        raise InvalidInput(f"a step up adds at least one node, not {count}", field="delta")
    live = await live_node_count(session, cluster.id)
    if cluster.autoscale_max is not None and live + count > cluster.autoscale_max:
        raise Conflict(
            f"cluster {cluster.name} has {live} node(s); {count} more would pass its maximum "
            f"of {cluster.autoscale_max}"
        )
    if names is None and not revive:
        rows = new_node_rows(cluster, slots=await free_slots(session, cluster, count), now=now)
    else:
        # Slurm's names: the node is called in the scheduler what Slurm calls it.
        rows = [new_node_row(cluster, name=name, now=now) for name in names or ()]
        for row in rows:
            row.scheduler_name = row.name
    session.add_all(rows)
    for node in revive:
        _revive(session, cluster=cluster, node=node, actor=actor, now=now)
    rows = [*revive, *rows]
    return await _start_action(
        session, cluster=cluster, kind=AutoscaleKind.SCALE_UP, size=live + count, nodes=rows,
        progress={}, detail=f"{count} node(s) provisioning", source=source, reasons=reasons,
        actor=actor, now=now,
    )  # fmt: skip


def _revive(
    session: AsyncSession, *, cluster: ClusterRow, node: NodeRow, actor: str, now: dt.datetime
) -> None:
    """A node powered down before comes back as itself, on a new machine."""
    switch_node_state(
        session, node=node, project_id=cluster.project_id, target=NodeState.PROVISIONING,
        actor=actor, reason="powered up again: a new machine for the same node", now=now,
    )  # fmt: skip
    node.provider_instance_id = None
    node.provision_attempts = 0
    node.provision_requested_at = None
    node.hostname = node.serial = node.bmc_address = None
    node.last_report_at = None
    node.boot_id = None
    node.enroll_open_at = None
    node.token_hash = None
    node.removed_at = None
    node.idle_since = None
    node.state_detail = ""
    node.updated_at = now


async def removal_refusal(
    session: AsyncSession, node: NodeRow, *, busy: bool | None, accepting: set[str]
) -> str | None:
    """Why ``node`` may not be taken away now, or None. ``busy``: a job runs there per the
    scheduler's latest reading (None: it could not be read — then no); ``accepting``: the
    cluster's nodes in an acceptance run (``nodes_in_acceptance``)."""
    if NodeState(node.state) is not NodeState.IN_SERVICE:
        return f"node {node.name} is {node.state}, not in service"
    open_repair = await session.scalar(
        select(RepairRow.id).where(
            RepairRow.node_id == node.id,
            RepairRow.status.in_([s.value for s in OPEN_REPAIR_STATUSES]),
        )
    )
    if open_repair is not None:
        return f"node {node.name} has an open repair ({open_repair})"
    if node.id in accepting:
        return f"node {node.name} is in an acceptance run"
    if busy is None:
        return f"node {node.name}: its jobs could not be read; never removed blind"
    if busy:
        return f"node {node.name} runs a job"
    return None


async def start_scale_down(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    nodes: Sequence[NodeRow],
    busy: dict[str, bool | None],
    source: AutoscaleSource,
    reasons: Sequence[str],
    actor: str,
    now: dt.datetime,
    respect_minimum: bool = True,
) -> AutoscaleActionRow:
    """Take ``nodes`` out of the cluster: the size shrinks now, the autoscaler loop holds
    each, checks it once more, and gives its machine back. ``busy``: per node id, whether
    a job ran there when the scheduler was just read. Refuses (``Conflict``, naming each
    node and why) if any node may not go, or the cluster would fall under its minimum;
    then nothing is written. The caller holds the cluster row locked."""
    _check_scalable(cluster)
    if not nodes:
        raise InvalidInput("no node to remove", field="nodes")
    accepting = await nodes_in_acceptance(session, cluster.id)
    refusals = [
        why
        for node in nodes
        if NodeState(node.state) not in NEVER_CAME
        and (
            why := await removal_refusal(session, node, busy=busy.get(node.id), accepting=accepting)
        )
        is not None
    ]
    taken = {
        str(i)
        for a in await open_actions(session, cluster.id)
        if a.kind == AutoscaleKind.SCALE_DOWN.value
        for i in a.node_ids
    }
    refusals += [f"node {n.name} is already being removed" for n in nodes if n.id in taken]
    if refusals:
        raise Conflict("; ".join(refusals))
    live = await live_node_count(session, cluster.id)
    if (
        respect_minimum
        and cluster.autoscale_min is not None
        and live - len(nodes) < cluster.autoscale_min
    ):
        raise Conflict(
            f"cluster {cluster.name} has {live} node(s); removing {len(nodes)} would pass "
            f"its minimum of {cluster.autoscale_min}"
        )
    return await _start_action(
        session, cluster=cluster, kind=AutoscaleKind.SCALE_DOWN, size=max(0, live - len(nodes)),
        nodes=nodes, progress={n.id: "chosen" for n in nodes},
        detail=f"{len(nodes)} node(s) to hold, check and give back", source=source,
        reasons=reasons, actor=actor, now=now,
    )  # fmt: skip


async def _start_action(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    kind: AutoscaleKind,
    size: int,
    nodes: Sequence[NodeRow],
    progress: dict[str, str],
    detail: str,
    source: AutoscaleSource,
    reasons: Sequence[str],
    actor: str,
    now: dt.datetime,
) -> AutoscaleActionRow:
    """The cluster's new size and the action that gets it there, acting, with its event
    and audit row; the policy remembers when it last stepped that way."""
    cluster.size = size
    cluster.updated_at = now
    action = AutoscaleActionRow(
        id=new_id(),
        cluster_id=cluster.id,
        kind=kind.value,
        status=AutoscaleStatus.ACTING.value,
        source=source.value,
        count=len(nodes),
        node_ids=[n.id for n in nodes],
        node_names=[n.name for n in nodes],
        progress=progress,
        reasons=list(reasons),
        detail=detail,
        actor=actor,
        created_at=now,
        updated_at=now,
    )
    session.add(action)
    policy = await policy_row(session, cluster)
    if kind is AutoscaleKind.SCALE_UP:
        policy.last_up_at = now
    else:
        policy.last_down_at = now
    _record_start(session, cluster=cluster, action=action, now=now)
    return action


def _record_start(
    session: AsyncSession, *, cluster: ClusterRow, action: AutoscaleActionRow, now: dt.datetime
) -> None:
    verb = "adding" if action.kind == AutoscaleKind.SCALE_UP.value else "removing"
    names = ", ".join(action.node_names[:8]) + (" …" if len(action.node_names) > 8 else "")
    why = "; ".join(action.reasons) or "no reason given"
    record_event(
        session,
        kind=EventKind.AUTOSCALE_DECISION,
        message=f"cluster {cluster.name}: {verb} {action.count} node(s) ({names}) for "
        f"{action.source}: {why}",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        actor=action.actor,
        data={
            "action_id": action.id,
            "kind": action.kind,
            "source": action.source,
            "nodes": list(action.node_names),
            "reasons": list(action.reasons),
            "size": cluster.size,
        },
        ts=now,
    )
    record_audit(
        session,
        actor=action.actor,
        action=f"autoscale.{action.kind}",
        object_type="autoscale_action",
        object_id=action.id,
        project_id=cluster.project_id,
        detail={"nodes": list(action.node_names), "reasons": list(action.reasons)},
        ts=now,
    )
