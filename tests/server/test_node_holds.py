"""The node-hold service, on both stores and the sim scheduler: a hold drains the node
with gpufleet's reason and moves it with an event and an audit row per state; a release
undoes only gpufleet's drain, and leaves someone else's on the node (then the node is
cordoned, never in service); an unreadable scheduler leaves everything as it was."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from apihelpers import create_cluster, create_project, ready_cluster, run_loops
from sqlalchemy import select

from gpufleet.core.enums import EventKind, NodeState
from gpufleet.core.errors import DriverError
from gpufleet.core.holds import acceptance_hold, manual_hold, parse_hold_reason, repair_hold
from gpufleet.core.ids import new_id
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.schedulers.base import SchedJob, SchedNode, SchedNodeState, Scheduler
from gpufleet.server.db.tables import AuditLogRow, ClusterRow, EventRow, NodeRow
from gpufleet.server.services.node_holds import (
    NodeListing,
    Release,
    allocated_before_boot,
    can_hold,
    foreign_hold_reason,
    hold_for_acceptance,
    hold_in_scheduler,
    record_hold,
    record_release,
    release_in_scheduler,
)
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.sim.world import SimWorld
from gpufleet.testing.app import RunningApp

# Far from the wall clock: a row stamped with utcnow() cannot pass for this one.
NOW = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
ACTOR = "test:holds"
OPERATOR = "ops: bad cable, ticket 4711"


async def _fleet(app: RunningApp) -> tuple[ClusterRow, NodeRow, Scheduler, SimWorld]:
    """A ready cluster's first node (in service), its scheduler and the sim world."""
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    async with app.ctx.db.session() as session:
        cluster_row = await session.get(ClusterRow, cluster["id"])
        node = await session.scalar(select(NodeRow).where(NodeRow.cluster_id == cluster["id"]))
    assert cluster_row is not None and node is not None
    assert node.state == NodeState.IN_SERVICE.value
    provider = app.ctx.drivers.provider("sim")
    assert isinstance(provider, SimProvider)
    return cluster_row, node, scheduler_for(app.ctx.drivers, cluster_row), provider.world


async def _written(app: RunningApp, node_id: str) -> tuple[list[EventRow], list[AuditLogRow]]:
    async with app.ctx.db.session() as session:
        events = await session.scalars(
            select(EventRow)
            .where(EventRow.node_id == node_id, EventRow.ts == NOW)
            .order_by(EventRow.id)
        )
        audits = await session.scalars(
            select(AuditLogRow)
            .where(AuditLogRow.object_id == node_id, AuditLogRow.ts == NOW)
            .order_by(AuditLogRow.id)
        )
        return list(events), list(audits)


async def _state(app: RunningApp, node_id: str) -> str:
    async with app.ctx.db.session() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        return node.state


async def _record(app: RunningApp, node: NodeRow, cluster: ClusterRow, **kw: Any) -> Any:
    """``record_hold`` (given ``targets``) or ``record_release`` (given ``release``) in a
    transaction that re-reads the node under lock, as every caller's apply does."""
    async with app.ctx.db.transaction() as session:
        row = await session.get(NodeRow, node.id, with_for_update=True)
        assert row is not None
        common = {"node": row, "project_id": cluster.project_id, "actor": ACTOR, "now": NOW}
        if "release" in kw:
            return record_release(session, **common, **kw)
        return record_hold(session, **common, **kw)


async def test_a_hold_drains_with_our_reason_and_moves_the_node_with_events_and_audit(
    app: RunningApp,
) -> None:
    cluster, node, scheduler, world = await _fleet(app)
    reason = manual_hold(action="drain", actor="user:alice", note="fan noise")
    assert await hold_in_scheduler(scheduler, node.name, reason=reason)
    status = world.node_status(node.name, cluster_id=cluster.id)
    assert status.drained and status.reason == reason.text
    assert parse_hold_reason(status.reason) == reason

    await _record(
        app, node, cluster, targets=(NodeState.CORDONED, NodeState.DRAINING), reason="drain: x"
    )
    assert await _state(app, node.id) == NodeState.DRAINING.value
    events, audits = await _written(app, node.id)
    assert [(e.kind, e.actor, e.data["from"], e.data["to"]) for e in events] == [
        (EventKind.NODE_STATE.value, ACTOR, "in_service", "cordoned"),
        (EventKind.NODE_STATE.value, ACTOR, "cordoned", "draining"),
    ]
    assert all(e.data["reason"] == "drain: x" for e in events)
    assert [(a.actor, a.object_type, a.detail["to"]) for a in audits] == [
        (ACTOR, "node", "cordoned"),
        (ACTOR, "node", "draining"),
    ]

    # Held again: the scheduler keeps the first reason; the node is already there.
    again = repair_hold(new_id(), signature_id="xid-79", action="reboot")
    assert await hold_in_scheduler(scheduler, node.name, reason=again)
    assert world.node_status(node.name, cluster_id=cluster.id).reason == reason.text
    await _record(app, node, cluster, targets=(NodeState.DRAINING,), reason="again")
    assert len((await _written(app, node.id))[0]) == 2


async def test_a_release_undoes_our_drain_and_puts_the_node_in_service(app: RunningApp) -> None:
    cluster, node, scheduler, world = await _fleet(app)
    reason = repair_hold(new_id(), signature_id=None, action="reboot")
    await hold_in_scheduler(scheduler, node.name, reason=reason)
    await _record(app, node, cluster, targets=(NodeState.CORDONED,), reason="held")

    release = await release_in_scheduler(scheduler, node.name)
    assert release == Release() and release.settled
    assert not world.node_status(node.name, cluster_id=cluster.id).drained
    assert await _record(app, node, cluster, release=release, reason="verified") is (
        NodeState.IN_SERVICE
    )
    events, audits = await _written(app, node.id)
    assert [(e.data["to"], e.data["reason"]) for e in events] == [
        ("cordoned", "held"),
        ("in_service", "verified"),
    ]
    assert len(audits) == 2


async def test_someone_elses_drain_is_left_alone_and_the_node_stays_out(
    app: RunningApp,
) -> None:
    cluster, node, scheduler, world = await _fleet(app)
    world.drain_node(node.name, reason=OPERATOR, cluster_id=cluster.id)
    await _record(app, node, cluster, targets=(NodeState.DRAINING,), reason="held")
    assert await foreign_hold_reason(scheduler, node.name) == OPERATOR

    release = await release_in_scheduler(scheduler, node.name)
    assert release.kept_by == OPERATOR and release.settled
    assert release.error is not None and "refusing to resume" in release.error
    status = world.node_status(node.name, cluster_id=cluster.id)
    assert status.drained and status.reason == OPERATOR  # their drain stays

    target = await _record(app, node, cluster, release=release, reason="passed acceptance")
    assert target is NodeState.CORDONED
    assert await _state(app, node.id) == NodeState.CORDONED.value
    events, _ = await _written(app, node.id)
    assert events[-1].data["reason"] == f"passed acceptance; kept out by {OPERATOR!r}"

    # Our hold on top keeps their reason, so it can never pass for ours.
    await hold_in_scheduler(scheduler, node.name, reason=manual_hold(action="cordon",
                            actor="user:a", note="n"))  # fmt: skip
    assert world.node_status(node.name, cluster_id=cluster.id).reason == OPERATOR


async def test_an_unreadable_scheduler_fails_closed(app: RunningApp) -> None:
    cluster, node, scheduler, world = await _fleet(app)
    await hold_in_scheduler(
        scheduler, node.name, reason=repair_hold(new_id(), signature_id="s", action="reboot")
    )
    await _record(app, node, cluster, targets=(NodeState.CORDONED,), reason="held")
    world.set_scheduler_available(False)
    with pytest.raises(DriverError, match="not responding"):
        await hold_in_scheduler(scheduler, node.name, reason=manual_hold(
            action="drain", actor="user:a", note="n"))  # fmt: skip
    release = await release_in_scheduler(scheduler, node.name)
    assert release.kept_by is None and release.error is not None and not release.settled
    assert await foreign_hold_reason(scheduler, node.name) is None
    with pytest.raises(ValueError, match="still held"):
        await _record(app, node, cluster, release=release, reason="verified")
    assert await _state(app, node.id) == NodeState.CORDONED.value
    world.set_scheduler_available(True)
    assert world.node_status(node.name, cluster_id=cluster.id).drained


async def test_a_hold_records_only_held_states(app: RunningApp) -> None:
    cluster, node, _, _ = await _fleet(app)
    with pytest.raises(ValueError, match="in_service is not a held state"):
        await _record(app, node, cluster, targets=(NodeState.IN_SERVICE,), reason="x")
    assert (await _written(app, node.id))[0] == []


class _NoDrain:
    """A scheduler without ``SupportsDrain`` (as Kubernetes would be before cordons)."""

    kind = "nodrain"

    async def list_nodes(self) -> list[SchedNode]:
        return []

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        return []

    async def pending_gpu_demand(self) -> int:
        return 0

    async def accounting_since(self, since: dt.datetime) -> list[SchedJob]:
        return []


async def test_a_scheduler_that_cannot_drain_holds_nothing() -> None:
    scheduler: Scheduler = _NoDrain()
    assert isinstance(scheduler, Scheduler) and not can_hold(scheduler)
    reason = manual_hold(action="drain", actor="user:a", note="n")
    assert await hold_in_scheduler(scheduler, "n1", reason=reason) is False
    assert await release_in_scheduler(scheduler, "n1") == Release()


class _PowerSaving(_NoDrain):
    """Slurm's power saving as the lab showed it: ``cloud1`` resumed for a job (allocated,
    no slurmd yet), ``cloud2`` powered down and idle, ``lab-001`` up. A drain is recorded;
    on ``cloud1`` it would requeue the job, as slurmctld does."""

    kind = "powersave"

    def __init__(self, *, readable: bool = True) -> None:
        self.readable = readable
        self.drained: list[str] = []
        self.reads = 0

    async def list_nodes(self) -> list[SchedNode]:
        self.reads += 1
        await asyncio.sleep(0)  # a read others can wait on, as a real one
        if not self.readable:
            raise DriverError("slurm: slurmctld not responding")
        return [
            SchedNode("cloud1", SchedNodeState.UNKNOWN, gpus=8, gpus_allocated=2,
                      job_ids=("7001",), powered_down=True),
            SchedNode("cloud2", SchedNodeState.IDLE, gpus=8, powered_down=True),
            SchedNode("lab-001", SchedNodeState.IDLE, gpus=8),
        ]  # fmt: skip

    async def drain(self, node: str, *, reason: str) -> None:
        self.drained.append(node)

    async def resume(self, node: str) -> None:
        return None


def _read_each_time(scheduler: Scheduler) -> NodeListing:
    """A listing that reads the scheduler's nodes at every question (no pass to share)."""
    return NodeListing(lambda: scheduler, max_age_s=-1.0)


async def test_acceptance_does_not_drain_a_node_resumed_for_a_job() -> None:
    scheduler = _PowerSaving()
    own = _read_each_time(scheduler)
    reason = acceptance_hold()
    assert await allocated_before_boot(own, "cloud1")
    assert not await allocated_before_boot(own, "cloud2")  # nothing waits there
    assert not await allocated_before_boot(own, "lab-001")
    assert not await hold_for_acceptance(own, "cloud1", reason=reason)
    assert await hold_for_acceptance(own, "cloud2", reason=reason)
    assert await hold_for_acceptance(own, "lab-001", reason=reason)
    assert scheduler.drained == ["cloud2", "lab-001"]
    # unreadable: drained as ever (and the drain says what is wrong, in a real driver)
    blind = _PowerSaving(readable=False)
    assert await hold_for_acceptance(_read_each_time(blind), "cloud1", reason=reason)
    assert blind.drained == ["cloud1"]


async def test_the_holds_of_one_pass_read_the_scheduler_once() -> None:
    scheduler = _PowerSaving()
    reason = acceptance_hold()
    names = ["cloud1", "cloud2", "lab-001"] * 100
    listing = NodeListing(lambda: scheduler)
    held = await asyncio.gather(*(hold_for_acceptance(listing, n, reason=reason) for n in names))
    assert scheduler.reads == 1  # 300 holds, one read (without sharing it: 300)
    assert held == [False, True, True] * 100  # the same answers as a read each
    assert sorted(set(scheduler.drained)) == ["cloud2", "lab-001"]
    # An older list is read again (a long pass).
    stale = NodeListing(lambda: scheduler, max_age_s=0.0)
    for name in ("cloud1", "cloud2"):
        await hold_for_acceptance(stale, name, reason=reason)
    assert scheduler.reads == 3
    # A scheduler that does not answer is asked once for the pass, not once a node; every
    # node is drained as with a read each.
    blind = _PowerSaving(readable=False)
    blind_listing = NodeListing(lambda: blind)
    await asyncio.gather(*(hold_for_acceptance(blind_listing, n, reason=reason) for n in names))
    assert blind.reads == 1 and len(blind.drained) == len(names)


async def test_provisioning_reads_the_scheduler_once_a_pass_for_all_its_nodes(
    app: RunningApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, size=6, acceptance_tests=True)
    async with app.ctx.db.session() as session:
        row = await session.get(ClusterRow, cluster["id"])
    assert row is not None
    scheduler = scheduler_for(app.ctx.drivers, row)
    reads: list[str] = []
    listed = type(scheduler).list_nodes

    async def counted(self: Any) -> list[SchedNode]:
        reads.append("list")
        return await listed(self)

    monkeypatch.setattr(type(scheduler), "list_nodes", counted)
    await run_loops(app)  # machines asked for, each node held early
    assert len(reads) == 1, reads
    reads.clear()
    await run_loops(app)  # machines up: each node held for acceptance
    async with app.ctx.db.session() as session:
        states = list(
            await session.scalars(select(NodeRow.state).where(NodeRow.cluster_id == cluster["id"]))
        )
    assert states == [NodeState.ACCEPTANCE.value] * 6, states
    assert len(reads) == 1, reads
