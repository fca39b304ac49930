"""Loop leases: one active replica per loop, handed over when the holder goes silent."""

from __future__ import annotations

import asyncio
import datetime as dt

from gpufleet.core.clock import FakeClock, as_utc
from gpufleet.server.db.engine import Database
from gpufleet.server.db.leases import acquire_lease, lease_holder, release_lease
from gpufleet.server.workers.base import LoopDeps, LoopService
from gpufleet.testing.waits import eventually


async def test_only_one_owner_holds_a_lease_until_it_expires(database_url: str) -> None:
    db = Database(database_url)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    try:
        a = await acquire_lease(db, name="loop:x", owner="a", ttl_s=10, now=now)
        assert a is not None
        assert await acquire_lease(db, name="loop:x", owner="b", ttl_s=10, now=now) is None
        # The holder renews and keeps its token.
        later = now + dt.timedelta(seconds=5)
        assert await acquire_lease(db, name="loop:x", owner="a", ttl_s=10, now=later) == a
        # b takes over only once a has been silent past the TTL.
        expired = later + dt.timedelta(seconds=11)
        b = await acquire_lease(db, name="loop:x", owner="b", ttl_s=10, now=expired)
        assert b is not None and b != a
        assert (await lease_holder(db, name="loop:x")) is not None
        holder = await lease_holder(db, name="loop:x")
        assert holder is not None and holder[0] == "b"
        # a's old token can no longer release b's lease.
        await release_lease(db, name="loop:x", token=a)
        holder = await lease_holder(db, name="loop:x")
        assert holder is not None and holder[0] == "b"
        await release_lease(db, name="loop:x", token=b)
        assert await lease_holder(db, name="loop:x") is None
    finally:
        await db.dispose()


async def test_contending_replicas_get_exactly_one_lease(database_url: str) -> None:
    replicas = [Database(database_url) for _ in range(5)]
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    try:
        tokens = await asyncio.gather(
            *(
                acquire_lease(db, name="loop:race", owner=f"r{i}", ttl_s=30, now=now)
                for i, db in enumerate(replicas)
            )
        )
        assert sum(t is not None for t in tokens) == 1
    finally:
        for db in replicas:
            await db.dispose()


class _Counting(LoopService):
    name = "counting"

    def __init__(self, deps: LoopDeps) -> None:
        super().__init__(deps, interval_s=0.01)
        self.ran = 0

    async def run_once(self) -> None:
        self.ran += 1


async def test_loops_on_two_replicas_run_on_one(database_url: str) -> None:
    clock = FakeClock()
    dbs = [Database(database_url), Database(database_url)]
    loops = [
        _Counting(LoopDeps(db=db, clock=clock, owner=f"replica-{i}", lease_ttl_s=15))
        for i, db in enumerate(dbs)
    ]
    stop = asyncio.Event()
    try:
        tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
        # Twenty passes of the holder: the other asked for the lease as often meanwhile.
        await eventually(lambda: max(loop.ran for loop in loops) >= 20, what="twenty passes")
        # Counted before stopping: the holder releases its lease as it stops, and the
        # other may then take it over for a last pass (as a standby replica should).
        ran = sorted(loop.ran for loop in loops)
        stop.set()
        await asyncio.gather(*tasks)
        assert ran[0] == 0 and ran[1] > 0, ran
    finally:
        for db in dbs:
            await db.dispose()


async def test_a_holder_writes_its_lease_again_only_after_a_third_of_the_ttl(
    database_url: str,
) -> None:
    clock = FakeClock()
    db = Database(database_url)
    holder = _Counting(LoopDeps(db=db, clock=clock, owner="a", lease_ttl_s=15))
    standby = _Counting(LoopDeps(db=db, clock=clock, owner="b", lease_ttl_s=15))

    async def expiry() -> float:
        held = await lease_holder(db, name="loop:counting")
        assert held is not None and held[0] == "a", held
        return (as_utc(held[1]) - start).total_seconds()

    try:
        start = clock.now()
        assert await holder.holds_lease()
        assert await expiry() == 15
        clock.advance(4.9)  # less than a third of 15 s: the pass needs no write
        assert await holder.holds_lease()
        assert await expiry() == 15
        assert not await standby.holds_lease()  # still a's for 10 s more
        clock.advance(0.2)  # a third has passed: renewed, 15 s from now
        assert await holder.holds_lease()
        assert await expiry() == 20.1
        # Silent past the expiry (killed): the standby takes over, and the old holder,
        # back, finds the lease gone (its write would have come too late).
        clock.advance(15.1)
        assert await standby.holds_lease()
        assert not await holder.holds_lease()
    finally:
        await db.dispose()
