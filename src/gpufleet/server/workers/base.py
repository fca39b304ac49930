"""Loop services: periodic, level-triggered work, one active replica per loop.

``run_once()`` is one pass, so tests drive a loop step by step. ``run()`` repeats it,
holding the loop's lease; a pass that raises is logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

from gpufleet.core.clock import Clock
from gpufleet.server.db.engine import Database
from gpufleet.server.db.leases import acquire_lease, release_lease

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
        self.passes = 0

    @abstractmethod
    async def run_once(self) -> None:
        """One pass: load → act → apply. Must be safe to repeat and to interrupt."""

    async def holds_lease(self) -> bool:
        self._lease_token = await acquire_lease(
            self.db,
            name=f"loop:{self.name}",
            owner=self.owner,
            ttl_s=self.lease_ttl_s,
            now=self.clock.now(),
        )
        return self._lease_token is not None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    if await self.holds_lease():
                        await self.run_once()
                        self.passes += 1
                except Exception:  # one failing pass never kills the process
                    log.exception("loop %s: pass failed", self.name)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
        finally:
            if self._lease_token is not None:
                with contextlib.suppress(Exception):
                    await release_lease(self.db, name=f"loop:{self.name}", token=self._lease_token)
