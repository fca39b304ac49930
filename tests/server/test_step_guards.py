"""The guards of the acceptance and provisioning applies: a step that loaded its row in
one state writes nothing once the row has moved on (``workers/base.guarded_apply``)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import update

from gpufleet.core.acceptance import AcceptanceScope, AcceptanceStatus, AcceptanceTrigger
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import AcceptanceStage, ClusterStatus, Health, NodeState
from gpufleet.core.ids import new_id
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import AcceptanceRunRow, ClusterRow, NodeRow, ProjectRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.failpoints import Failpoints
from gpufleet.server.services.acceptance import create_acceptance_run
from gpufleet.server.workers.acceptance.context import AcceptanceContext, stage_guard
from gpufleet.server.workers.acceptance.finishing import finish
from gpufleet.server.workers.provisioning import MachineGuard


async def _run(db: Database, now: dt.datetime) -> str:
    """A manual acceptance run over no node, in stage ``node``."""
    project = ProjectRow(id=new_id(), name=f"p-{new_id()[:8]}", description="", created_at=now)
    cluster = ClusterRow(
        id=new_id(), project_id=project.id, name="c", scheduler="sim", provider="sim",
        gpu_model="H100", gpus_per_node=8, size=1, status=ClusterStatus.READY.value,
        health=Health.HEALTHY.value, startup_scripts=[], labels={}, provider_config={},
        created_at=now, updated_at=now,
    )  # fmt: skip
    async with db.transaction() as session:
        session.add(project)
        await session.flush()
        session.add(cluster)
        await session.flush()
        run = create_acceptance_run(
            session, cluster=cluster, scope=AcceptanceScope.NODE,
            trigger=AcceptanceTrigger.MANUAL, node_ids=[], actor="test", now=now,
        )  # fmt: skip
    return run.id


def _context(
    db: Database, clock: FakeClock, run_id: str, stage: AcceptanceStage
) -> AcceptanceContext:
    return AcceptanceContext(
        db=db, clock=clock, row_type=AcceptanceRunRow, row_id=run_id, guard=stage_guard(stage),
        drivers=DriverRegistry(), failpoints=Failpoints(),
    )  # fmt: skip


async def _get(db: Database, run_id: str) -> AcceptanceRunRow:
    async with db.session() as session:
        run = await session.get(AcceptanceRunRow, run_id)
        assert run is not None
        return run


async def test_an_acceptance_step_writes_only_while_the_run_is_in_the_stage_it_saw(
    database_url: str,
) -> None:
    db = Database(database_url)
    clock = FakeClock()
    try:
        run_id = await _run(db, clock.now())
        # Loaded in ``node``; the run moved to ``cluster`` before the step applied.
        async with db.transaction() as session:
            await session.execute(
                update(AcceptanceRunRow)
                .where(AcceptanceRunRow.id == run_id)
                .values(stage=AcceptanceStage.CLUSTER.value)
            )
        await finish(_context(db, clock, run_id, AcceptanceStage.NODE), AcceptanceStatus.ERROR, "x")
        stale = await _get(db, run_id)
        assert (stale.status, stale.stage, stale.report) == ("pending", "cluster", None)

        await finish(
            _context(db, clock, run_id, AcceptanceStage.CLUSTER), AcceptanceStatus.ERROR, "late"
        )
        ended = await _get(db, run_id)
        assert (ended.status, ended.stage, ended.detail) == ("error", "gating", "late")
        assert ended.report is not None and ended.report_sha256
    finally:
        await db.dispose()


def _node(state: NodeState, instance_id: str | None) -> NodeRow:
    return NodeRow(id="n", name="n", state=state.value, provider_instance_id=instance_id)


@pytest.mark.parametrize(
    ("guard", "node", "holds"),
    [
        (MachineGuard("i-1"), _node(NodeState.PROVISIONING, "i-1"), True),
        (MachineGuard("i-1"), _node(NodeState.PROVISIONING, "i-2"), False),  # a new machine
        (MachineGuard("i-1"), _node(NodeState.ACCEPTANCE, "i-1"), False),  # moved on
        (MachineGuard("i-1", provisioning=False), _node(NodeState.IN_SERVICE, "i-1"), True),
        (MachineGuard("i-1", provisioning=False), _node(NodeState.IN_SERVICE, None), False),
    ],
)
def test_a_provisioning_apply_holds_while_the_node_has_the_machine_it_saw(
    guard: MachineGuard, node: NodeRow, holds: bool
) -> None:
    assert guard(node) is holds
