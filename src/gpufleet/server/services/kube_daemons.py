"""The self-healing daemon of Slurm on Kubernetes: a slurmd pod that its controller
restarted (the kubelet restarted its container in place) or replaced (a new pod, a new
uid) is an event on its node's timeline, ``node.daemon`` like the agent's own restarts
of slurmd, with ``data.source = "kubernetes"``.

The last state seen of each node's slurmd pod is the newest such event (its ``data``):
nothing else is stored, so a server restart (or another replica taking the loop's
lease) compares with what was recorded and records each change once. The first sighting
of a node's slurmd pod is recorded too, as the baseline.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import EventKind
from gpufleet.server.db.tables import ClusterRow, EventRow, NodeRow
from gpufleet.server.services.events import record_event

SOURCE = "kubernetes"
ACTOR = "slurmd-watch"
# How far back the newest state of each node is looked for (a cluster's nodes each have
# a few of the watch's events).
_LOOKBACK_EVENTS = 20_000


@dataclass(frozen=True, slots=True)
class SlurmdPod:
    """A slurmd pod as the watch saw it (from ``KubePod``)."""

    kube_node: str
    pod: str  # namespace/name
    uid: str | None
    restarts: int
    slurm_node: str
    last_termination: str | None = None


async def last_seen(session: AsyncSession, *, cluster_id: str) -> dict[str, dict[str, Any]]:
    """Each node's last recorded slurmd pod state (the newest ``node.daemon`` event from
    Kubernetes), by node id."""
    rows = await session.scalars(
        select(EventRow)
        .where(
            EventRow.cluster_id == cluster_id,
            EventRow.kind == EventKind.NODE_DAEMON.value,
            EventRow.actor == ACTOR,  # the watch's own, not the agents' restarts
        )
        .order_by(EventRow.id.desc())
        .limit(_LOOKBACK_EVENTS)
    )
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.node_id and row.node_id not in seen and (row.data or {}).get("source") == SOURCE:
            seen[row.node_id] = dict(row.data)
    return seen


async def record_slurmd_pods(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    nodes: Sequence[NodeRow],
    pods: Iterable[SlurmdPod],
    now: dt.datetime,
) -> int:
    """Record what changed since the last state of each node's slurmd pod. Returns the
    events written. A pod on a node gpufleet does not manage is left out."""
    by_name = {(n.scheduler_name or n.name): n for n in nodes}
    before = await last_seen(session, cluster_id=cluster.id)
    written = 0
    for pod in pods:
        node = by_name.get(pod.kube_node)
        if node is None:
            continue
        message = _change(node.name, pod, before.get(node.id))
        if message is None:
            continue
        record_event(
            session,
            kind=EventKind.NODE_DAEMON,
            message=message,
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=node.id,
            actor=ACTOR,
            data={
                "source": SOURCE,
                "daemon": "slurmd",
                "pod": pod.pod,
                "uid": pod.uid or "",
                "restarts": pod.restarts,
                "slurm_node": pod.slurm_node,
            },
            ts=now,
        )
        written += 1
    return written


def _change(node: str, pod: SlurmdPod, before: dict[str, Any] | None) -> str | None:
    where = f"slurmd of Slurm node {pod.slurm_node} on node {node}"
    if before is None:
        return f"{where} runs in pod {pod.pod} ({pod.restarts} restart(s) so far): watched"
    if before.get("uid") != (pod.uid or "") or before.get("pod") != pod.pod:
        return (
            f"{where} was replaced by its controller: pod {before.get('pod')} → {pod.pod} "
            "(the self-healing daemon)"
        )
    restarts = int(before.get("restarts") or 0)
    if pod.restarts > restarts:
        why = f"; it last ended: {pod.last_termination}" if pod.last_termination else ""
        return (
            f"{where} was restarted by Kubernetes in pod {pod.pod} (restarts {restarts} → "
            f"{pod.restarts}{why}; the self-healing daemon)"
        )
    return None
