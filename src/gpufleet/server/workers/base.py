"""What every background worker shares: loop services and the step-machine shape.

**Loop services.** ``run_once()`` is one pass, so tests drive a loop step by step.
``run()`` repeats it, holding the loop's lease; a pass that raises is logged and the loop
goes on.

**Step machines** (check runs, repairs, acceptance) move one row at a time through its
lifecycle, load → act → apply (STYLE §7):

- *load*: a short read of the row (and what the step needs next to it). A machine that
  runs on several replicas at once claims the row first (``hold_row``: the lease columns
  ``lock_owner``/``lock_token``/``lock_expires_at``); one whose loop lease already makes
  it the only writer guards on the status it loaded instead.
- *act*: scheduler, provider and agent calls, with no transaction open.
- *apply*: ``guarded_apply``, a new transaction that re-reads the row under lock and
  yields it only while the guard still holds (this pass's token, the status the step
  saw); otherwise it yields None and the step writes nothing.

Steps are plain async functions (or small classes with ``__call__``) taking a context
object and the loaded row, registered in a ``{status: step}`` table that ``dispatch``
reads; the context (a ``StepContext`` subclass) carries the store, the clock, the
drivers and settings the machine needs, the row's id and its guard. No step class
inherits from another: a reader finds a status's step in the table, and everything the
step may use in its context.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Hashable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeAlias, TypeVar

from sqlalchemy import CursorResult, or_, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import class_mapper

from gpufleet.core.clock import Clock
from gpufleet.core.ids import new_id
from gpufleet.server.db.engine import Database
from gpufleet.server.db.leases import acquire_lease, release_lease
from gpufleet.server.db.tables import Base
from gpufleet.server.metrics import observe_loop_pass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopDeps:
    """What every loop needs: the store, a clock, and who this replica is."""

    db: Database
    clock: Clock
    owner: str  # this replica's id, recorded in the lease
    lease_ttl_s: float


class LoopService(ABC):
    name: str = "loop"

    def __init__(self, deps: LoopDeps, *, interval_s: float) -> None:
        self.db = deps.db
        self.clock = deps.clock
        self.owner = deps.owner
        self.lease_ttl_s = deps.lease_ttl_s
        self.interval_s = interval_s
        self._lease_token: str | None = None
        self._renew_at: dt.datetime | None = None  # the held lease needs no write before
        self.passes = 0

    @abstractmethod
    async def run_once(self) -> None:
        """One pass: load → act → apply. Must be safe to repeat and to interrupt."""

    async def holds_lease(self) -> bool:
        """Whether this replica holds the loop's lease, taking or renewing it as needed.

        A lease this replica wrote less than a third of its TTL ago (by the store's
        clock) is still its own for two thirds of the TTL at least, since no other
        replica takes it before it expires: the pass runs without a write. Renewing at
        every pass was a write a pass for every loop of every replica, most of an idle
        server's work. A pass must still end within two thirds of the TTL to end inside
        the lease it started in (10 s of the default 15 s)."""
        now = self.clock.now()
        if self._renew_at is not None and now < self._renew_at:  # set only while held
            return True
        self._lease_token = await acquire_lease(
            self.db,
            name=f"loop:{self.name}",
            owner=self.owner,
            ttl_s=self.lease_ttl_s,
            now=now,
        )
        held = self._lease_token is not None
        self._renew_at = now + dt.timedelta(seconds=self.lease_ttl_s / 3) if held else None
        return held

    async def run(self, stop: asyncio.Event) -> None:
        due = time.monotonic()  # when this pass should start: lateness is the loop's lag
        try:
            while not stop.is_set():
                started = time.monotonic()
                result, ran = "standby", False
                try:
                    if await self.holds_lease():
                        ran = True
                        await self.run_once()
                        self.passes += 1
                        result = "ok"
                except Exception:  # one failing pass never kills the process
                    result = "failed"
                    log.exception("loop %s: pass failed", self.name)
                ended = time.monotonic()
                observe_loop_pass(
                    self.name,
                    interval_s=self.interval_s,
                    lag_s=started - due,
                    duration_s=ended - started if ran else None,
                    result=result,
                )
                due = ended + self.interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
        finally:
            if self._lease_token is not None:
                with contextlib.suppress(Exception):
                    await release_lease(self.db, name=f"loop:{self.name}", token=self._lease_token)


# -- step machines -----------------------------------------------------------------------


class StepRow(Protocol):
    """A row a step machine drives (``CheckRunRow``, ``RepairRow``, ``AcceptanceRunRow``)."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...


class LeasedRow(StepRow, Protocol):
    """A row with the claim columns (``db.tables._Leased``)."""

    @property
    def lock_owner(self) -> str | None: ...

    @property
    def lock_token(self) -> str | None: ...

    @property
    def lock_expires_at(self) -> dt.datetime | None: ...


# Any mapped row. (Bound to the declarative base, not to ``StepRow``: mypy cannot yet see
# a mapped class meet a protocol where the class is a base's type argument.)
RowT = TypeVar("RowT", bound=Base)
LeasedT = TypeVar("LeasedT", bound=LeasedRow)
CtxT = TypeVar("CtxT")
LoadedT = TypeVar("LoadedT")
KeyT = TypeVar("KeyT", bound=Hashable)

# What an apply re-checks on the row it re-read; False: the step lost the row, write nothing.
Guard: TypeAlias = Callable[[RowT], bool]
# A step: given the machine's context and the row as loaded, act, then apply.
Step: TypeAlias = Callable[[CtxT, LoadedT], Awaitable[None]]


@dataclass(frozen=True)
class LeaseGuard:
    """The row is still claimed by this pass and in one of ``statuses``. The token is new
    for every claim, so it alone says the claim (and its owner) still holds."""

    token: str
    statuses: frozenset[str]

    def __call__(self, row: LeasedRow) -> bool:
        return row.lock_token == self.token and row.status in self.statuses


@dataclass(frozen=True)
class StatusGuard:
    """The row is still in one of ``statuses`` (the status the step loaded it in): for a
    machine whose loop lease already makes it the only writer of its rows."""

    statuses: frozenset[str]

    def __call__(self, row: StepRow) -> bool:
        return row.status in self.statuses


@dataclass
class Applied(Generic[RowT]):
    """An apply in progress: the row re-read under lock, in ``session``, at ``now``."""

    session: AsyncSession
    row: RowT
    now: dt.datetime


@contextlib.asynccontextmanager
async def guarded_apply(
    db: Database, *, row_type: type[RowT], row_id: str, guard: Guard[RowT], clock: Clock
) -> AsyncIterator[Applied[RowT] | None]:
    """The apply of load → act → apply: a transaction that re-reads the row under lock
    (``FOR UPDATE`` on PostgreSQL) and yields it while ``guard`` holds, else None."""
    async with db.transaction() as session:
        row = await session.get(row_type, row_id, with_for_update=True, populate_existing=True)
        if row is None or not guard(row):
            yield None
            return
        yield Applied(session=session, row=row, now=clock.now())


async def claim_row(
    db: Database,
    *,
    row_type: type[LeasedT],
    row_id: str,
    statuses: Collection[str],
    owner: str,
    ttl_s: float,
    now: dt.datetime,
) -> str | None:
    """Claim the row for one pass: a token when it is in one of ``statuses`` and its
    claim is free, expired or ``owner``'s already; None when another replica holds it.
    One UPDATE, so two replicas never both win (SQLite and PostgreSQL alike)."""
    columns = class_mapper(row_type).columns
    token = new_id()
    async with db.transaction() as session:
        result = await session.execute(
            update(row_type)
            .where(
                columns["id"] == row_id,
                columns["status"].in_(list(statuses)),
                or_(
                    columns["lock_expires_at"].is_(None),
                    columns["lock_expires_at"] < now,
                    columns["lock_owner"] == owner,
                ),
            )
            .values(
                lock_owner=owner,
                lock_token=token,
                lock_expires_at=now + dt.timedelta(seconds=ttl_s),
            )
        )
    assert isinstance(result, CursorResult)
    return token if result.rowcount == 1 else None


async def release_row(db: Database, *, row_type: type[LeasedT], row_id: str, token: str) -> None:
    """Give the claim back, if this pass still holds it."""
    columns = class_mapper(row_type).columns
    async with db.transaction() as session:
        await session.execute(
            update(row_type)
            .where(columns["id"] == row_id, columns["lock_token"] == token)
            .values(lock_owner=None, lock_token=None, lock_expires_at=None)
        )


@contextlib.asynccontextmanager
async def hold_row(
    db: Database,
    *,
    row_type: type[LeasedT],
    row_id: str,
    statuses: Collection[str],
    owner: str,
    ttl_s: float,
    now: dt.datetime,
) -> AsyncIterator[str | None]:
    """A claim for the length of one step: the token (None: another replica has the
    row; do nothing), released afterwards however the step ended."""
    token = await claim_row(
        db, row_type=row_type, row_id=row_id, statuses=statuses, owner=owner, ttl_s=ttl_s, now=now
    )
    try:
        yield token
    finally:
        if token is not None:
            await release_row(db, row_type=row_type, row_id=row_id, token=token)


@dataclass(frozen=True, kw_only=True)
class StepContext(Generic[RowT]):
    """What every step is given; a machine's context adds its drivers and settings."""

    db: Database
    clock: Clock
    row_type: type[RowT]
    row_id: str
    guard: Guard[RowT]

    def apply(self) -> AbstractAsyncContextManager[Applied[RowT] | None]:
        """The guarded apply of this context's row."""
        return guarded_apply(
            self.db, row_type=self.row_type, row_id=self.row_id, guard=self.guard, clock=self.clock
        )


async def dispatch(
    steps: Mapping[KeyT, Step[CtxT, LoadedT]], *, key: KeyT, ctx: CtxT, loaded: LoadedT
) -> bool:
    """Run the step registered for ``key`` (a status); False when none is (nothing to do
    in that status)."""
    step = steps.get(key)
    if step is None:
        return False
    await step(ctx, loaded)
    return True
