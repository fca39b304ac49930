"""Slurm's power saving, through the owner of a cluster's size (``services/autoscale.py``):
``gpufleet slurm resume`` / ``suspend``, Slurm's ResumeProgram and SuspendProgram for
``State=CLOUD`` nodes, end here (``POST /api/v1/clusters/{id}/power``).

Slurm names the nodes. A resume gets each a machine through the cluster's provider and
answers at once; a node powered down before comes back as the same node (its history
kept). A suspend takes each node away through a step down (held, checked for jobs, its
machine given back); one that never came up goes at once; one under repair or in
acceptance stays.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.autoscaling import AutoscaleSource
from gpufleet.core.enums import NodeState
from gpufleet.core.errors import Conflict
from gpufleet.server.db.tables import AutoscaleActionRow, ClusterRow, NodeRow
from gpufleet.server.services.autoscale import (
    NEVER_CAME,
    nodes_in_acceptance,
    removal_refusal,
    start_scale_down,
    start_scale_up,
)


async def power_resume(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    names: Sequence[str],
    jobs: Sequence[str],
    actor: str,
    now: dt.datetime,
) -> AutoscaleActionRow | None:
    """Slurm's ResumeProgram asked for ``names`` (``State=CLOUD`` nodes): each gets a
    machine through the cluster's provider under its own name and identity — a node
    powered down before comes back as the same node. Nodes already up or on their way are
    left alone (slurmctld may run the program twice). None: nothing to do."""
    rows = {
        r.name: r
        for r in await session.scalars(
            select(NodeRow).where(NodeRow.cluster_id == cluster.id, NodeRow.name.in_(names))
        )
    }
    wanted = [n for n in dict.fromkeys(names) if n not in rows or _powered_down(rows[n])]
    if not wanted:
        return None
    reasons = [f"Slurm resumes {', '.join(wanted)}"] + (
        [f"for job(s) {', '.join(jobs[:10])}"] if jobs else []
    )
    fresh = [n for n in wanted if n not in rows]
    revive = [rows[n] for n in wanted if n in rows]
    return await start_scale_up(
        session, cluster=cluster, count=len(wanted), source=AutoscaleSource.SLURM,
        reasons=reasons, actor=actor, now=now, names=fresh, revive=revive,
    )  # fmt: skip


def _powered_down(row: NodeRow) -> bool:
    return NodeState(row.state) is NodeState.REMOVED


async def power_suspend(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    names: Sequence[str],
    actor: str,
    now: dt.datetime,
) -> AutoscaleActionRow | None:
    """Slurm's SuspendProgram powers ``names`` down: Slurm saw them idle (or down) for its
    SuspendTime. Each node in service with no open repair is taken away through a step
    down (held, checked for jobs, machine given back); one that never came up goes at
    once. A node under repair or acceptance stays (``Conflict`` when none may go)."""
    rows = list(
        await session.scalars(
            select(NodeRow).where(
                NodeRow.cluster_id == cluster.id,
                NodeRow.name.in_(names),
                NodeRow.state != NodeState.REMOVED.value,
            )
        )
    )
    if not rows:
        return None
    accepting = await nodes_in_acceptance(session, cluster.id)
    going: list[NodeRow] = []
    refused: list[str] = []
    for row in rows:
        why = await removal_refusal(session, row, busy=False, accepting=accepting)
        if why is None or NodeState(row.state) in NEVER_CAME:
            going.append(row)
        else:
            refused.append(why)
    if not going:
        raise Conflict("; ".join(refused))
    reasons = [f"Slurm powers down {', '.join(r.name for r in going)} (idle past SuspendTime)"]
    if refused:
        reasons.append("kept: " + "; ".join(refused))
    return await start_scale_down(
        session, cluster=cluster, nodes=going, busy={r.id: False for r in going},
        source=AutoscaleSource.SLURM, reasons=reasons, actor=actor, now=now,
        respect_minimum=False,
    )  # fmt: skip
