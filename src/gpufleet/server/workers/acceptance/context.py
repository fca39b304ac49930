"""What an acceptance step is given (``AcceptanceContext``), and what several steps share.

A step gets the context and the run as the runner loaded it (``Loaded``). Its apply is
``ctx.locked()``: the run re-read under lock while it is still in the stage the step
loaded it in (``StageGuard``), with its cluster (``Tx``); None when the run moved on and
the step must write nothing. Only the acceptance loop moves a run's stage, and it holds
its loop lease: a stage guard is enough, the run needs no claim of its own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.acceptance import AcceptanceSuite
from gpufleet.core.enums import AcceptanceStage, NodeState
from gpufleet.server.db.tables import AcceptanceRunRow, CheckRunRow, ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.acceptance import ACTOR, held_by_startup
from gpufleet.server.services.acceptance_report import CheckEntry
from gpufleet.server.services.checks import ENDED
from gpufleet.server.services.node_holds import Release, record_release
from gpufleet.server.workers.acceptance.planning import localising
from gpufleet.server.workers.base import StepContext


@dataclass(frozen=True)
class StageGuard:
    """The run is still in one of ``stages`` (the stage its step loaded it in)."""

    stages: frozenset[AcceptanceStage]

    def __call__(self, row: AcceptanceRunRow) -> bool:
        return row.stage in self.stages


def stage_guard(stage: AcceptanceStage) -> StageGuard:
    return StageGuard(stages=frozenset({stage}))


@dataclass
class Loaded:
    """A run as its step saw it when it started, with its cluster."""

    run: AcceptanceRunRow
    cluster: ClusterRow

    @property
    def suite(self) -> AcceptanceSuite:
        return AcceptanceSuite.model_validate(self.run.suite)


@dataclass
class Tx:
    """An apply in progress: the run re-read under lock, and its cluster."""

    session: AsyncSession
    run: AcceptanceRunRow
    cluster: ClusterRow
    now: dt.datetime


@dataclass(frozen=True, kw_only=True)
class AcceptanceContext(StepContext[AcceptanceRunRow]):
    """One step of one run: the loop's drivers and failpoints, and the run, guarded by
    the stage it was loaded in."""

    drivers: DriverRegistry
    failpoints: Failpoints

    @contextlib.asynccontextmanager
    async def locked(self, *, lock_cluster: bool = False) -> AsyncIterator[Tx | None]:
        """The apply: the run re-read under lock (and its cluster, locked too with
        ``lock_cluster``), or None when the run left the stage the step saw."""
        async with self.apply() as applied:
            if applied is None:
                yield None
                return
            cluster = await applied.session.get(
                ClusterRow, applied.row.cluster_id, with_for_update=lock_cluster
            )
            assert cluster is not None  # a run goes with its cluster (ON DELETE CASCADE)
            yield Tx(session=applied.session, run=applied.row, cluster=cluster, now=applied.now)

    async def check_rows(self, entries: Sequence[CheckEntry]) -> dict[str, CheckRunRow]:
        """The check runs of ``entries``, by id (not stored back: read only)."""
        ids = [e.check_run_id for e in entries if e.check_run_id]
        if not ids:
            return {}
        async with self.db.session() as session:
            rows = {
                r.id: r
                for r in await session.scalars(select(CheckRunRow).where(CheckRunRow.id.in_(ids)))
            }
            # A localisation child that ended without writing back (cancelled, timed out):
            # its parent has said all it will; mark it so in this copy (not stored).
            children = {r.id: child for r in rows.values() if (child := localising(r))}
            if children:
                done = set(
                    await session.scalars(
                        select(CheckRunRow.id).where(
                            CheckRunRow.id.in_(list(children.values())),
                            CheckRunRow.status.in_([s.value for s in ENDED]),
                        )
                    )
                )
                for parent_id, child_id in children.items():
                    if child_id in done:
                        row = rows[parent_id]
                        session.expunge(row)
                        loc = {**row.result["localisation"], "status": "ended"}
                        row.result = {**row.result, "localisation": loc}
            return rows

    async def names(self, node_ids: Sequence[str]) -> dict[str, str]:
        async with self.db.session() as session:
            rows = await session.execute(
                select(NodeRow.id, NodeRow.name).where(NodeRow.id.in_(list(node_ids)))
            )
            return {node_id: name for node_id, name in rows}

    async def booting(self, cluster_id: str) -> int:
        """Machines of the cluster still coming up (not counting starts held by a failed
        startup script: those are out of this run, named in the cluster's detail)."""
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(NodeRow.id).where(
                        NodeRow.cluster_id == cluster_id,
                        NodeRow.state == NodeState.PROVISIONING.value,
                    )
                )
            )
            held = await held_by_startup(session, node_ids=ids)
        return len([i for i in ids if i not in held])


def release_node(
    session: AsyncSession,
    node: NodeRow,
    cluster: ClusterRow,
    release: Release,
    reason: str,
    *,
    kept_detail: str,
    now: dt.datetime,
) -> None:
    """After ``release_in_scheduler``: in service, or cordoned with ``kept_detail``
    and whose drain keeps it out."""
    record_release(
        session, node=node, project_id=cluster.project_id, release=release, actor=ACTOR,
        reason=reason, now=now,
    )  # fmt: skip
    kept = release.kept_by
    node.state_detail = (
        "" if kept is None else f"{kept_detail}; drained by someone else ({kept!r})"
    )[:4000]
