"""Every lifecycle, every (from, to), through its service's one switch function on a real
store: an allowed move writes exactly one event and one audit row, both stamped with the
fake clock; a move the table does not allow raises ``InvalidTransition`` naming the
allowed targets and writes nothing; a move to the current state writes nothing."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.acceptance import AcceptanceScope, AcceptanceTrigger
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import ClusterStatus, Health, NodeState, RepairAction
from gpufleet.core.errors import InvalidTransition
from gpufleet.core.ids import new_id
from gpufleet.core.repair.models import RepairKind, RepairSource
from gpufleet.core.transitions import LIFECYCLES, Lifecycle
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import (
    AuditLogRow,
    AutoscaleActionRow,
    CheckRunRow,
    ClusterRow,
    EventRow,
    HostRow,
    NodeRow,
    ProjectRow,
    RolloutNodeRow,
    RolloutRow,
    StackRow,
)
from gpufleet.server.services.acceptance import create_acceptance_run
from gpufleet.server.services.acceptance_status import (
    switch_acceptance_stage,
    switch_acceptance_status,
)
from gpufleet.server.services.autoscale import switch_autoscale_status
from gpufleet.server.services.checks import switch_check_status
from gpufleet.server.services.clusters import switch_cluster_status
from gpufleet.server.services.command_records import switch_command_status
from gpufleet.server.services.hosts import switch_host_state
from gpufleet.server.services.node_commands import enqueue_command
from gpufleet.server.services.nodes import switch_node_state
from gpufleet.server.services.repairs import create_repair, switch_repair_status
from gpufleet.server.services.rollouts import switch_rollout_node_status, switch_rollout_status
from gpufleet.server.services.startup_scripts import (
    StartupTrigger,
    start_startup,
    switch_startup_status,
)

# Far from the wall clock: a row stamped with utcnow() cannot pass for the fake one.
START = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
ACTOR = "test:transitions"


@dataclass
class World:
    project: ProjectRow
    cluster: ClusterRow
    node: NodeRow


Switch = Callable[[AsyncSession, World, Any, Any, dt.datetime], bool]
Make = Callable[[AsyncSession, World, dt.datetime], Awaitable[Any]]


async def _cluster(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    return world.cluster


async def _node(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    return world.node


async def _repair(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    return create_repair(
        session, cluster=world.cluster, node=world.node, kind=RepairKind.NODE,
        source=RepairSource.POLICY, action=RepairAction.REBOOT, signature_id="xid-79",
        reason="fell off the bus", rule="test", evidence={}, finding_ids=[], actor=ACTOR,
        now=now,
    )  # fmt: skip


async def _check_run(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    row = CheckRunRow(
        id=new_id(), cluster_id=world.cluster.id, kind="dcgm-diag", params={"level": 1},
        node_ids=[world.node.id], status="pending", requested_by=ACTOR, result={},
        raw_output="", created_at=now, updated_at=now, purpose="on_demand", progress={},
        skipped=[], detail="",
    )  # fmt: skip
    session.add(row)
    return row


async def _command(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    return await enqueue_command(
        session, node_id=world.node.id, argv=["true"], timeout_s=10, purpose="test",
        requested_by=ACTOR, now=now,
    )  # fmt: skip


async def _acceptance(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    return create_acceptance_run(
        session, cluster=world.cluster, scope=AcceptanceScope.NODE,
        trigger=AcceptanceTrigger.MANUAL, node_ids=[world.node.id], actor=ACTOR, now=now,
    )  # fmt: skip


async def _startup(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    return start_startup(
        session, node=world.node, cluster=world.cluster, scripts=["true"],
        trigger=StartupTrigger.PROVISION, key="i-1@boot", actor=ACTOR, now=now,
    )  # fmt: skip


async def _autoscale(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    row = AutoscaleActionRow(
        id=new_id(), cluster_id=world.cluster.id, kind="scale_up", status="acting",
        source="policy", count=1, node_ids=[], node_names=[], progress={}, reasons=[],
        detail="", actor=ACTOR, created_at=now, updated_at=now,
    )  # fmt: skip
    session.add(row)
    return row


async def _host(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    row = HostRow(
        id=new_id(), project_id=world.project.id, hostname=f"h-{new_id()}", bmc_type="ipmi",
        bmc_address="10.0.0.1", cluster_id=world.cluster.id, role="spare", state="spare",
        created_at=now, updated_at=now,
    )  # fmt: skip
    session.add(row)
    return row


async def _rollout(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    name = f"s-{new_id()}"
    session.add(StackRow(name=name, driver="580.95.05", latest=False, notes="",
                         created_by=ACTOR, created_at=now))  # fmt: skip
    await session.flush()
    row = RolloutRow(
        id=new_id(), cluster_id=world.cluster.id, from_stack=None, to_stack=name,
        status="scheduled", window={"at": "02:00", "tz": "UTC", "duration_s": 3600},
        max_unavailable="1", failure_budget=1, failures=0, on_window_close="wait",
        reservation="", reserved_for="", detail="", created_by=ACTOR, created_at=now,
        updated_at=now,
    )  # fmt: skip
    session.add(row)
    await session.flush()
    return row


_ROLLOUT_OF: dict[str, RolloutRow] = {}  # a rollout node's id → its rollout


async def _rollout_node(session: AsyncSession, world: World, now: dt.datetime) -> Any:
    rollout = await _rollout(session, world, now)
    row = RolloutNodeRow(
        id=new_id(), rollout_id=rollout.id, node_id=world.node.id, position=0,
        status="pending", from_stack=None, attempts=0, detail="", updated_at=now,
    )  # fmt: skip
    session.add(row)
    _ROLLOUT_OF[row.id] = rollout
    return row


def _p(world: World) -> str:
    return world.project.id


# lifecycle name → (make its row, move it through its service's switch function)
CASES: dict[str, tuple[Make, Switch]] = {
    "cluster": (_cluster, lambda s, _w, row, t, now: switch_cluster_status(
        s, cluster=row, target=t, actor=ACTOR, reason="test", now=now)),
    "node": (_node, lambda s, w, row, t, now: switch_node_state(
        s, node=row, project_id=_p(w), target=t, actor=ACTOR, reason="test", now=now)),
    "repair": (_repair, lambda s, w, row, t, now: switch_repair_status(
        s, repair=row, project_id=_p(w), node_name=w.node.name, target=t, actor=ACTOR,
        reason="test", now=now)),
    "check_run": (_check_run, lambda s, w, row, t, now: switch_check_status(
        s, run=row, project_id=_p(w), target=t, actor=ACTOR, reason="test", now=now)),
    "node_command": (_command, lambda s, w, row, t, now: switch_command_status(
        s, row=row, project_id=_p(w), target=t, actor=ACTOR, reason="test", now=now)),
    "acceptance_run": (_acceptance, lambda s, w, row, t, now: switch_acceptance_status(
        s, run=row, project_id=_p(w), target=t, actor=ACTOR, reason="test", now=now)),
    "acceptance_stage": (_acceptance, lambda s, w, row, t, now: switch_acceptance_stage(
        s, run=row, project_id=_p(w), target=t, actor=ACTOR, reason="test", now=now)),
    "startup_run": (_startup, lambda s, w, row, t, now: switch_startup_status(
        s, run=row, node=w.node, project_id=_p(w), target=t, actor=ACTOR, reason="test",
        now=now)),
    "host": (_host, lambda s, _w, row, t, now: switch_host_state(
        s, host=row, target=t, actor=ACTOR, reason="test", now=now)),
    "autoscale_action": (_autoscale, lambda s, w, row, t, now: switch_autoscale_status(
        s, action=row, cluster=w.cluster, target=t, actor=ACTOR, reason="test", now=now)),
    "rollout": (_rollout, lambda s, w, row, t, now: switch_rollout_status(
        s, rollout=row, cluster=w.cluster, target=t, actor=ACTOR, reason="test", now=now)),
    "rollout_node": (_rollout_node, lambda s, w, row, t, now: switch_rollout_node_status(
        s, entry=row, rollout=_ROLLOUT_OF[row.id], cluster=w.cluster, node_name=w.node.name,
        target=t, actor=ACTOR, reason="test", now=now)),
}  # fmt: skip


def test_every_lifecycle_has_a_case() -> None:
    assert set(CASES) == set(LIFECYCLES)


async def _world(session: AsyncSession, now: dt.datetime) -> World:
    project = ProjectRow(id=new_id(), name="p-transitions", description="", created_at=now)
    cluster = ClusterRow(
        id=new_id(), project_id=project.id, name="c", scheduler="sim", provider="sim",
        gpu_model="H100", gpus_per_node=8, size=1, status=ClusterStatus.READY.value,
        health=Health.HEALTHY.value, startup_scripts=[], labels={}, provider_config={},
        created_at=now, updated_at=now,
    )  # fmt: skip
    node = NodeRow(
        id=new_id(), cluster_id=cluster.id, name="c-000", state=NodeState.IN_SERVICE.value,
        health=Health.HEALTHY.value, expected_gpus=8, created_at=now, updated_at=now,
    )  # fmt: skip
    session.add(project)
    await session.flush()
    session.add(cluster)
    await session.flush()
    session.add(node)
    await session.flush()
    return World(project=project, cluster=cluster, node=node)


def _written(session: AsyncSession) -> tuple[list[EventRow], list[AuditLogRow]]:
    return (
        [r for r in session.new if isinstance(r, EventRow)],
        [r for r in session.new if isinstance(r, AuditLogRow)],
    )


@pytest.mark.parametrize("name", sorted(LIFECYCLES))
async def test_every_move_of_a_lifecycle(name: str, database_url: str) -> None:
    lifecycle: Lifecycle[Any] = LIFECYCLES[name]
    make, switch = CASES[name]
    clock = FakeClock(start=START)
    db = Database(database_url)
    allowed_moves = 0
    try:
        async with db.transaction() as session:
            world = await _world(session, clock.now())
            row = await make(session, world, clock.now())
            await session.flush()
            states: list[StrEnum] = list(lifecycle.states)
            for current in states:
                for target in states:
                    setattr(row, lifecycle.column, current.value)
                    await session.flush()
                    clock.advance(1)
                    now = clock.now()
                    allowed = lifecycle.table[current]
                    where = f"{name}: {current} → {target}"
                    if target is current:
                        assert switch(session, world, row, target, now) is False, where
                        assert _written(session) == ([], []), where
                    elif target in allowed:
                        assert switch(session, world, row, target, now) is True, where
                        assert getattr(row, lifecycle.column) == target.value, where
                        events, audits = _written(session)
                        assert len(events) == 1 and len(audits) == 1, where
                        (event,), (audit,) = events, audits
                        assert (event.ts, audit.ts) == (now, now), where
                        assert event.kind == lifecycle.event_kind.value, where
                        assert (event.data["from"], event.data["to"]) == (current, target)
                        assert audit.action == lifecycle.audit_action, where
                        assert audit.object_type == lifecycle.object_type, where
                        assert audit.object_id == row.id and audit.actor == ACTOR, where
                        allowed_moves += 1
                    else:
                        with pytest.raises(InvalidTransition) as info:
                            switch(session, world, row, target, now)
                        message = info.value.message
                        assert f"from {current.value} to {target.value}" in message, where
                        named = ", ".join(sorted(s.value for s in allowed)) or "none"
                        assert f"(allowed: {named})" in message, where
                        assert getattr(row, lifecycle.column) == current.value, where
                        assert _written(session) == ([], []), where
                    await session.flush()
            row_id = row.id
        # What the store kept: one audit row per allowed move, none on the wall clock.
        async with db.session() as session:
            stamps = list(
                await session.scalars(
                    select(AuditLogRow.ts).where(
                        AuditLogRow.object_id == row_id,
                        AuditLogRow.action == lifecycle.audit_action,
                    )
                )
            )
            assert len(stamps) == allowed_moves > 0
            assert all(START < ts <= clock.now() for ts in stamps)
            events = await session.scalar(
                select(func.count()).select_from(EventRow).where(EventRow.ts > START)
            )
            assert events == allowed_moves
    finally:
        await db.dispose()
