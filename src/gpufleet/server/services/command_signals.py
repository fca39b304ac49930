"""Which nodes have commands waiting, and the agents' long polls waiting for them.

One ``CommandSignals`` per process and database (``signals_for``). It is only ever a
hint: every answer an agent gets is read from the store, so a missed or spurious wake
costs a query or a short delay, never a wrong answer.

* **Same replica**: ``enqueue_command`` and ``cancel_command`` ask for a wake after their
  transaction commits (``notify_after_commit``); the waiting poll answers at once.
* **Other replicas**: while any poll waits here (and on every agent report), the store is
  read at most once per ``refresh_s`` — one small grouped query per replica, whatever the
  number of nodes — and a node whose commands changed since the last read is woken.
  So a command queued on replica A reaches an agent polling replica B within about
  ``refresh_s``; on one replica it is a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any

from sqlalchemy import and_, event, func, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import CommandStatus
from gpufleet.core.clock import Clock
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import NodeCommandRow

log = logging.getLogger(__name__)

REFRESH_S = 1.0
# A cancelled or expired command its agent still runs is news for this long: the agent
# hears of it in its next poll and kills it.
CANCEL_NEWS_S = 600.0
_SESSION_KEY = "gpufleet.command_nodes"


class CommandSignals:
    def __init__(self, db: Database, *, clock: Clock, refresh_s: float = REFRESH_S) -> None:
        self._db = db
        self._clock = clock
        self.refresh_s = refresh_s
        self._pending: set[str] = set()  # nodes with pending commands, as last known
        self._versions: dict[str, dt.datetime] = {}  # node → newest change seen
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._refreshed_at = float("-inf")
        self._lock = asyncio.Lock()
        self._refresher: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self.refreshes = 0

    # -- news ---------------------------------------------------------------------------

    def notify(self, node_id: str, *, pending: bool) -> None:
        """A node's commands changed (on this replica): wake its waiting polls."""
        if pending:
            self._pending.add(node_id)
        for waiter in self._waiters.get(node_id, ()):
            waiter.set()

    def claimed_all(self, node_id: str) -> None:
        """The node's agent took every pending command: reports stop saying "waiting"."""
        self._pending.discard(node_id)

    def is_pending(self, node_id: str) -> bool:
        """Whether the node has pending commands, as last known (no store read)."""
        return node_id in self._pending

    async def has_waiting(self, node_id: str) -> bool:
        """Whether the node had pending commands when last looked (at most
        ``refresh_s`` ago on other replicas; at once on this one)."""
        await self.ensure_fresh()
        return node_id in self._pending

    # -- waiting ------------------------------------------------------------------------

    @contextlib.contextmanager
    def watch(self, node_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever the node's commands may have changed."""
        event = asyncio.Event()
        self._waiters.setdefault(node_id, set()).add(event)
        self._idle.clear()
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh_while_watched())
        try:
            yield event
        finally:
            waiting = self._waiters.get(node_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[node_id]
            if not self._waiters:
                self._idle.set()

    @property
    def watched(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    async def _refresh_while_watched(self) -> None:
        while self._waiters:
            try:
                await self.ensure_fresh()
            except Exception:  # the store is down for a moment: the polls still time out
                log.exception("command signals: refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=self.refresh_s)

    # -- reading the store --------------------------------------------------------------

    async def ensure_fresh(self) -> None:
        """Read the store if the last read is older than ``refresh_s`` (one reader at a
        time; the others wait for its answer)."""
        if time.monotonic() - self._refreshed_at < self.refresh_s:
            return
        async with self._lock:
            if time.monotonic() - self._refreshed_at < self.refresh_s:
                return
            async with self._db.reader() as session:
                rows = await _changed_nodes(session, since=self._clock.now())
            self._refreshed_at = time.monotonic()
            self.refreshes += 1
        self._apply(rows)

    def _apply(self, rows: list[tuple[str, str, dt.datetime]]) -> None:
        pending: set[str] = set()
        newest: dict[str, dt.datetime] = {}
        for node_id, status, changed_at in rows:
            if status == CommandStatus.PENDING.value:
                pending.add(node_id)
            if node_id not in newest or changed_at > newest[node_id]:
                newest[node_id] = changed_at
        self._pending = pending
        for node_id, changed_at in newest.items():
            seen = self._versions.get(node_id)
            if seen is None or changed_at > seen:
                for waiter in self._waiters.get(node_id, ()):
                    waiter.set()
        self._versions = newest


async def _changed_nodes(
    session: AsyncSession, *, since: dt.datetime
) -> list[tuple[str, str, dt.datetime]]:
    """(node, status, newest change) of nodes with pending commands, or with a command
    cancelled or expired lately that its agent may still run."""
    recent = since - dt.timedelta(seconds=CANCEL_NEWS_S)
    query = (
        select(NodeCommandRow.node_id, NodeCommandRow.status, func.max(NodeCommandRow.updated_at))
        .where(
            or_(
                NodeCommandRow.status == CommandStatus.PENDING.value,
                and_(
                    NodeCommandRow.status.in_(
                        [CommandStatus.CANCELLED.value, CommandStatus.EXPIRED.value]
                    ),
                    NodeCommandRow.updated_at >= recent,
                    NodeCommandRow.sent_at.is_not(None),
                    NodeCommandRow.result_at.is_(None),
                ),
            )
        )
        .group_by(NodeCommandRow.node_id, NodeCommandRow.status)
    )
    return [(r[0], r[1], r[2]) for r in (await session.execute(query)).all()]


# One per database engine in this process: the services only see a session, and a
# session knows its engine. Weak, so an app that is gone takes its signals with it.
_SIGNALS: weakref.WeakKeyDictionary[Engine, CommandSignals] = weakref.WeakKeyDictionary()


def signals_for(db: Database, *, clock: Clock) -> CommandSignals:
    engine = db.engine.sync_engine
    signals = _SIGNALS.get(engine)
    if signals is None:
        signals = _SIGNALS[engine] = CommandSignals(db, clock=clock)
    return signals


def notify_after_commit(session: AsyncSession, node_id: str, *, pending: bool) -> None:
    """Wake the node's waiting polls on this replica once ``session`` commits (not
    before: the poll must find the row). Nothing happens on a rollback."""
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    signals = _SIGNALS.get(engine)
    if signals is None:
        return  # no poll has ever waited here: other replicas read the store
    nodes: dict[str, bool] | None = session.info.get(_SESSION_KEY)
    if nodes is None:
        nodes = session.info[_SESSION_KEY] = {}

        def after_commit(_session: Any) -> None:
            for node, is_pending in nodes.items():
                signals.notify(node, pending=is_pending)
            nodes.clear()

        def after_rollback(_session: Any) -> None:
            nodes.clear()

        event.listen(session.sync_session, "after_commit", after_commit)
        event.listen(session.sync_session, "after_soft_rollback", after_rollback)
    nodes[node_id] = nodes.get(node_id, False) or pending
