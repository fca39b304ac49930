"""The repair executor on the step-machine shape: a step for every active status, and a
step whose repair moved on since it was loaded writes nothing."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from gpufleet.core.enums import NodeState, RepairStatus
from gpufleet.core.repair.models import ACTIVE_STATUSES
from gpufleet.server.db.tables import AuditLogRow, EventRow, NodeRow, RepairRow
from gpufleet.server.services.repairs import switch_repair_status
from gpufleet.server.workers.repairs.cordoning import cordon
from gpufleet.server.workers.repairs.executor import STEPS, RepairExecutor
from gpufleet.testing.fleet import SimFleet, sim_fleet


def test_every_active_status_has_a_step_and_no_other_does() -> None:
    assert set(STEPS) == set(ACTIVE_STATUSES)


async def _written(fleet: SimFleet) -> tuple[int, int]:
    async with fleet.app.ctx.db.session() as session:
        events = await session.scalar(select(func.count()).select_from(EventRow))
        audits = await session.scalar(select(func.count()).select_from(AuditLogRow))
    return int(events or 0), int(audits or 0)


async def test_a_step_whose_repair_moved_on_writes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        await fleet.inject("train-001", "xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for("train-001"), what="proposal")
        approved = await fleet.app.client.post(
            f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "bad GPU"}
        )
        assert approved.status_code == 200, approved.text
        executor = fleet.loop(RepairExecutor)
        assert await executor.step_once(repair["id"]) is RepairStatus.APPROVED
        loaded = await executor.load(repair["id"])
        assert loaded is not None and loaded.repair.status == RepairStatus.CORDONING.value
        ctx = executor.context(loaded)

        # Behind the step's back (an admin, another pass), the repair ends.
        async with fleet.app.ctx.db.transaction() as session:
            row = await session.get(RepairRow, repair["id"], with_for_update=True)
            assert row is not None
            switch_repair_status(
                session, repair=row, project_id=loaded.cluster.project_id,
                node_name=loaded.node.name, target=RepairStatus.FAILED, actor="test",
                reason="ended elsewhere", now=fleet.clock.now(),
            )  # fmt: skip
        before = await _written(fleet)

        await cordon(ctx, loaded)
        assert not await ctx.transition(loaded, RepairStatus.DRAINING, "too late")
        await ctx.note(loaded, "too late")

        assert await _written(fleet) == before
        assert await fleet.status_of(repair["id"]) == "failed"
        async with fleet.app.ctx.db.session() as session:
            node = await session.get(NodeRow, loaded.node.id)
        assert node is not None and node.state == NodeState.IN_SERVICE.value
        # A fresh load sees the ended repair: nothing left to do.
        assert await executor.load(repair["id"]) is None
