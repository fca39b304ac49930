"""The findings service, the one writer of a finding's state: open-or-fold, clear, and
close for a repair (on both store dialects)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from apihelpers import create_project, nodes_of, ready_cluster
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.clock import utcnow
from gpufleet.core.enums import EventKind, FindingSource, Severity
from gpufleet.server.db.tables import ClusterRow, EventRow, FindingRow, NodeRow
from gpufleet.server.services.findings import (
    Sighting,
    clear_finding,
    close_findings_for_repair,
    open_findings,
    open_or_fold_finding,
)
from gpufleet.testing.app import RunningApp

T0 = utcnow().replace(microsecond=0) - dt.timedelta(hours=1)


def minutes(n: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=n)


def sighting(**changes: Any) -> Sighting:
    base = Sighting(
        key="xid-79/GPU-0",
        signature_id="xid-79",
        title="GPU has fallen off the bus",
        severity=Severity.CRITICAL,
        source=FindingSource.KERNEL_LOG,
        evidence="NVRM: Xid 79",
        first_seen=minutes(0),
        last_seen=minutes(0),
        gpu_index=0,
    )
    return dataclasses.replace(base, **changes)


@dataclasses.dataclass
class World:
    session: AsyncSession
    node: NodeRow
    project_id: str
    _open: dict[str | None, FindingRow] = dataclasses.field(default_factory=dict)

    def see(self, found: Sighting, *, actor: str = "node:n") -> FindingRow:
        """Open or fold ``found`` as a caller does: the open finding under its key first."""
        return open_or_fold_finding(
            self.session,
            node=self.node,
            project_id=self.project_id,
            open_row=self._open.get(found.key),
            sighting=found,
            actor=actor,
            now=found.last_seen,
        )

    async def refresh(self) -> None:
        await self.session.flush()
        rows = await open_findings(self.session, node_ids=[self.node.id])
        self._open = {r.fold_key: r for r in rows}

    async def events(self, kind: EventKind) -> list[EventRow]:
        await self.session.flush()
        return list(
            await self.session.scalars(
                select(EventRow)
                .where(EventRow.node_id == self.node.id, EventRow.kind == kind.value)
                .order_by(EventRow.id)
            )
        )


@asynccontextmanager
async def world(app: RunningApp) -> AsyncIterator[World]:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    node_id = (await nodes_of(app, cluster["id"]))[0]["id"]
    async with app.ctx.db.transaction() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        cluster_row = await session.get(ClusterRow, node.cluster_id)
        assert cluster_row is not None
        yield World(session, node, cluster_row.project_id)


async def test_an_agents_running_count_folds_by_the_larger_count(app: RunningApp) -> None:
    """The agent re-sends its running count of the episode: a fold keeps the larger one,
    so a count sent again (or an older, smaller one) never adds."""
    async with world(app) as w:
        first = w.see(sighting(running_count=3))
        await w.refresh()
        assert w.see(sighting(running_count=3, last_seen=minutes(1))) is first
        assert w.see(sighting(running_count=2, last_seen=minutes(2))) is first
        assert first.count == 3
        w.see(sighting(running_count=7, last_seen=minutes(3)))
        assert (first.count, first.last_seen) == (7, minutes(3))
        assert len(await w.events(EventKind.FINDING_OPENED)) == 1


async def test_a_sighting_without_a_running_count_is_one_more_occurrence(
    app: RunningApp,
) -> None:
    """An active check that fails again: count + 1 per failing run."""
    async with world(app) as w:
        check = sighting(key="check:dcgm:0:", source=FindingSource.ACTIVE_CHECK)
        row = w.see(check)
        assert row.count == 1
        await w.refresh()
        for n in (1, 2):
            assert w.see(dataclasses.replace(check, last_seen=minutes(n))) is row
        assert (row.count, row.last_seen) == (3, minutes(2))


async def test_a_fold_only_grows_last_seen_and_severity_and_keeps_evidence_when_none(
    app: RunningApp,
) -> None:
    async with world(app) as w:
        row = w.see(sighting(severity=Severity.WARNING, last_seen=minutes(5)))
        await w.refresh()
        w.see(sighting(severity=Severity.FATAL, last_seen=minutes(3), evidence=""))
        assert (row.severity, row.last_seen, row.evidence) == ("fatal", minutes(5), "NVRM: Xid 79")
        w.see(sighting(severity=Severity.INFO, last_seen=minutes(6), evidence="later"))
        assert (row.severity, row.last_seen, row.evidence) == ("fatal", minutes(6), "later")


async def test_a_clear_from_an_earlier_episode_is_ignored(app: RunningApp) -> None:
    async with world(app) as w:
        row = w.see(sighting(first_seen=minutes(5), last_seen=minutes(5)))
        earlier = clear_finding(
            w.session,
            row=row,
            node=w.node,
            project_id=w.project_id,
            at=minutes(6),
            actor="node:n",
            episode_began=minutes(0),
        )
        assert earlier is False and row.cleared_at is None
        assert await w.events(EventKind.FINDING_CLEARED) == []
        own = clear_finding(
            w.session,
            row=row,
            node=w.node,
            project_id=w.project_id,
            at=minutes(4),  # a clock behind: never cleared before it began
            actor="node:n",
            episode_began=minutes(5),
            last_sighting=minutes(4),
        )
        assert own is True
        assert (row.cleared_at, row.last_seen) == (minutes(5), minutes(5))
        [event] = await w.events(EventKind.FINDING_CLEARED)
        assert (event.actor, event.data["finding_id"]) == ("node:n", row.id)


async def test_a_clear_moves_last_seen_only_by_the_sighting_it_carries(app: RunningApp) -> None:
    """A passing check or a repair is not a sighting of the fault: last_seen stays when it
    was last observed; the agent's clear carries its last observation."""
    async with world(app) as w:
        by_check = w.see(sighting(key="a", last_seen=minutes(2)))
        by_agent = w.see(sighting(key="b", last_seen=minutes(2)))
        for row, seen in ((by_check, None), (by_agent, minutes(9))):
            clear_finding(
                w.session,
                row=row,
                node=w.node,
                project_id=w.project_id,
                at=minutes(10),
                actor="system:checks",
                why="check run r passed there",
                last_sighting=seen,
                data={"check_run_id": "r"},
            )
        assert (by_check.cleared_at, by_check.last_seen) == (minutes(10), minutes(2))
        assert (by_agent.cleared_at, by_agent.last_seen) == (minutes(10), minutes(9))
        event = (await w.events(EventKind.FINDING_CLEARED))[0]
        assert event.message.endswith("cleared (check run r passed there)")
        assert event.data["reason"] == "check run r passed there"
        assert event.data["check_run_id"] == "r"


async def test_a_repair_closes_only_what_it_could_have_fixed(app: RunningApp) -> None:
    async with world(app) as w:
        before = w.see(sighting(key="before", last_seen=minutes(1)))
        after = w.see(sighting(key="after", last_seen=minutes(8)))
        closed = await close_findings_for_repair(
            w.session,
            node=w.node,
            project_id=w.project_id,
            actor="system:repairs",
            why="repair r verified",
            now=minutes(10),
            seen_before=minutes(5),
        )
        assert closed == [before]
        assert (before.cleared_at, before.last_seen, after.cleared_at) == (
            minutes(10),
            minutes(1),
            None,
        )
        [event] = await w.events(EventKind.FINDING_CLEARED)
        assert (event.actor, event.data["reason"]) == ("system:repairs", "repair r verified")
        await close_findings_for_repair(
            w.session,
            node=w.node,
            project_id=w.project_id,
            actor="system:repairs",
            why="removed",
            now=minutes(11),
        )
        assert after.cleared_at == minutes(11)
        assert await open_findings(w.session, node_ids=[w.node.id]) == []
