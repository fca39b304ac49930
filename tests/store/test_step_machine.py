"""The step-machine shape (``workers/base.py``): a row claimed by one pass, the guarded
apply that writes only while the claim (or the loaded status) still holds, and the
``{status: step}`` dispatch. A cluster row stands in for any leased row."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from contextlib import AbstractAsyncContextManager

import pytest
from sqlalchemy import update

from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import ClusterStatus, Health
from gpufleet.core.ids import new_id
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, ProjectRow
from gpufleet.server.workers.base import (
    Applied,
    Guard,
    LeaseGuard,
    StatusGuard,
    Step,
    StepContext,
    claim_row,
    dispatch,
    guarded_apply,
    hold_row,
)

READY = frozenset({ClusterStatus.READY.value})
TTL_S = 30.0


async def _cluster(db: Database, now: dt.datetime) -> str:
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
    return cluster.id


async def _claim(
    db: Database, cluster_id: str, clock: FakeClock, owner: str, statuses: frozenset[str] = READY
) -> str | None:
    return await claim_row(
        db,
        row_type=ClusterRow,
        row_id=cluster_id,
        statuses=statuses,
        owner=owner,
        ttl_s=TTL_S,
        now=clock.now(),
    )


def _apply(
    db: Database, cluster_id: str, clock: FakeClock, guard: Guard[ClusterRow]
) -> AbstractAsyncContextManager[Applied[ClusterRow] | None]:
    return guarded_apply(db, row_type=ClusterRow, row_id=cluster_id, guard=guard, clock=clock)


async def _detail(db: Database, cluster_id: str) -> str:
    async with db.session() as session:
        row = await session.get(ClusterRow, cluster_id)
        assert row is not None
        return row.status_detail


async def test_a_row_is_claimed_by_one_owner_until_its_claim_expires(database_url: str) -> None:
    db = Database(database_url)
    clock = FakeClock()
    try:
        cid = await _cluster(db, clock.now())
        assert await _claim(db, cid, clock, "a", frozenset({ClusterStatus.DELETING.value})) is None
        first = await _claim(db, cid, clock, "a")
        assert first is not None
        assert await _claim(db, cid, clock, "b") is None
        # Its owner claims it again (a new pass of the same replica): a new token.
        again = await _claim(db, cid, clock, "a")
        assert again is not None and again != first
        clock.advance(TTL_S + 1)
        taken = await _claim(db, cid, clock, "b")
        assert taken is not None and taken not in (first, again)
    finally:
        await db.dispose()


async def test_contending_replicas_claim_a_row_once(database_url: str) -> None:
    clock = FakeClock()
    replicas = [Database(database_url) for _ in range(5)]
    try:
        cid = await _cluster(replicas[0], clock.now())
        tokens = await asyncio.gather(
            *(_claim(db, cid, clock, f"r{i}") for i, db in enumerate(replicas))
        )
        assert sum(t is not None for t in tokens) == 1
    finally:
        for db in replicas:
            await db.dispose()


async def test_the_apply_writes_only_while_this_pass_holds_the_row(database_url: str) -> None:
    db = Database(database_url)
    clock = FakeClock()
    try:
        cid = await _cluster(db, clock.now())
        mine = await _claim(db, cid, clock, "a")
        assert mine is not None
        ours = LeaseGuard(token=mine, statuses=READY)
        clock.advance(5)
        async with _apply(db, cid, clock, ours) as applied:
            assert applied is not None
            assert applied.now == clock.now()  # stamped with the injected clock
            applied.row.status_detail = "written by a"
        assert await _detail(db, cid) == "written by a"

        # a stalls past its claim, b takes the row over: a's late apply writes nothing.
        clock.advance(TTL_S + 1)
        theirs = await _claim(db, cid, clock, "b")
        assert theirs is not None
        async with _apply(db, cid, clock, ours) as applied:
            assert applied is None
        async with _apply(db, cid, clock, LeaseGuard(token=theirs, statuses=READY)) as applied:
            assert applied is not None

        # A status guard: the row moved on since the step loaded it, so nothing is written.
        loaded_in = StatusGuard(statuses=READY)
        async with db.transaction() as session:
            await session.execute(
                update(ClusterRow)
                .where(ClusterRow.id == cid)
                .values(status=ClusterStatus.DELETING.value)
            )
        async with _apply(db, cid, clock, loaded_in) as applied:
            assert applied is None
        async with _apply(db, new_id(), clock, loaded_in) as applied:
            assert applied is None  # a row that is gone
    finally:
        await db.dispose()


async def test_a_step_context_applies_to_its_row_under_its_guard(database_url: str) -> None:
    db = Database(database_url)
    clock = FakeClock()
    try:
        cid = await _cluster(db, clock.now())
        ctx = StepContext(
            db=db, clock=clock, row_type=ClusterRow, row_id=cid, guard=StatusGuard(READY)
        )
        async with ctx.apply() as applied:
            assert applied is not None
            applied.row.status_detail = "through the context"
        assert await _detail(db, cid) == "through the context"
        lost = dataclasses.replace(ctx, guard=StatusGuard(frozenset({"deleted"})))
        async with lost.apply() as applied:
            assert applied is None
    finally:
        await db.dispose()


async def test_a_held_row_is_released_however_the_step_ends(database_url: str) -> None:
    db = Database(database_url)
    clock = FakeClock()
    try:
        cid = await _cluster(db, clock.now())

        def held(owner: str) -> AbstractAsyncContextManager[str | None]:
            return hold_row(
                db,
                row_type=ClusterRow,
                row_id=cid,
                statuses=READY,
                owner=owner,
                ttl_s=TTL_S,
                now=clock.now(),
            )

        with pytest.raises(RuntimeError):
            async with held("a") as token:
                assert token is not None
                async with held("b") as other:
                    assert other is None  # a holds it
                raise RuntimeError("the step failed")
        # Released: another replica claims it at once, without waiting out the TTL.
        async with held("b") as token:
            assert token is not None
    finally:
        await db.dispose()


@dataclasses.dataclass
class _Recorder:
    """A step as a small class."""

    seen: list[str]

    async def __call__(self, ctx: str, loaded: int) -> None:
        self.seen.append(f"class {ctx} {loaded}")


async def test_dispatch_runs_the_step_registered_for_the_status() -> None:
    seen: list[str] = []

    async def start(ctx: str, loaded: int) -> None:
        seen.append(f"start {ctx} {loaded}")

    steps: dict[ClusterStatus, Step[str, int]] = {
        ClusterStatus.PROVISIONING: start,
        ClusterStatus.READY: _Recorder(seen),
    }
    assert await dispatch(steps, key=ClusterStatus.PROVISIONING, ctx="ctx", loaded=1) is True
    assert await dispatch(steps, key=ClusterStatus.READY, ctx="ctx", loaded=2) is True
    # No step for a status: nothing to do.
    assert await dispatch(steps, key=ClusterStatus.DELETED, ctx="ctx", loaded=3) is False
    assert seen == ["start ctx 1", "class ctx 2"]
