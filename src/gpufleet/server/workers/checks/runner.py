"""The check runner: the loop that takes every pending or running check run a step on.

Each pass claims each active run with the row's lease columns (``hold_row``), loads it,
and runs the step its table names for its status (``dispatch``): an ordinary run's from
``steps.STEPS``, a localisation run's (``progress["localiser"]``) from
``localisation.LOCALISATION_STEPS``. A step is load → act → apply, its apply a
transaction that writes only while this pass's lease token still holds the run; no
network call happens inside a transaction. Every ``CLEANUP_EVERY`` passes the runner
also deletes Slurm reservations that a run left behind.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select

from gpufleet.core.enums import CheckStatus
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SupportsJobs, SupportsReservations
from gpufleet.server.db.tables import CheckRunRow, ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.check_backends.agent import AgentBackend
from gpufleet.server.services.check_backends.slurm import SlurmBackend
from gpufleet.server.workers.base import LoopDeps, LoopService, dispatch, hold_row
from gpufleet.server.workers.checks.context import (
    ACTIVE,
    CheckSettings,
    Loaded,
    RunContext,
    lease_guard,
)
from gpufleet.server.workers.checks.localisation import LOCALISATION_STEPS
from gpufleet.server.workers.checks.steps import STEPS

log = logging.getLogger(__name__)

CLEANUP_EVERY = 30  # passes between sweeps for stale Slurm reservations


class CheckRunner(LoopService):
    name = "check-runner"

    def __init__(
        self,
        deps: LoopDeps,
        *,
        interval_s: float,
        drivers: DriverRegistry,
        settings: CheckSettings,
        max_parallel: int = 16,
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.drivers = drivers
        self.settings = settings
        self.agent_backend = AgentBackend(self.db, clock=self.clock)
        self._limit = asyncio.Semaphore(max_parallel)
        self.steps = 0

    async def run_once(self) -> None:
        if self.passes % CLEANUP_EVERY == 0:
            await self.cleanup_reservations()
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(CheckRunRow.id)
                    .where(CheckRunRow.status.in_(ACTIVE))
                    .order_by(CheckRunRow.id)
                )
            )
        await asyncio.gather(*(self._limited(i) for i in ids))

    async def _limited(self, run_id: str) -> None:
        async with self._limit:
            try:
                await self.step(run_id)
            except Exception:  # one run's trouble never stalls the others
                log.exception("checks: step of run %s failed", run_id)

    async def step(self, run_id: str) -> None:
        """Take one run as far as it can go now. Safe to call at any time, from any
        replica: the row's lease decides who acts."""
        async with hold_row(
            self.db,
            row_type=CheckRunRow,
            row_id=run_id,
            statuses=ACTIVE,
            owner=self.owner,
            ttl_s=self.lease_ttl_s,
            now=self.clock.now(),
        ) as token:
            if token is None:
                return
            loaded = await self._load(run_id)
            if loaded is None or loaded.run.status not in ACTIVE:
                return
            self.steps += 1
            ctx = RunContext(
                db=self.db,
                clock=self.clock,
                row_type=CheckRunRow,
                row_id=run_id,
                guard=lease_guard(token),
                drivers=self.drivers,
                settings=self.settings,
                agent_backend=self.agent_backend,
            )
            table = LOCALISATION_STEPS if "localiser" in loaded.progress else STEPS
            await dispatch(table, key=CheckStatus(loaded.run.status), ctx=ctx, loaded=loaded)

    async def _load(self, run_id: str) -> Loaded | None:
        async with self.db.session() as session:
            run = await session.get(CheckRunRow, run_id)
            if run is None:
                return None
            cluster = await session.get(ClusterRow, run.cluster_id)
            if cluster is None:
                return None
            nodes = {
                n.id: n
                for n in await session.scalars(
                    select(NodeRow).where(NodeRow.id.in_(list(run.node_ids)))
                )
            }
        return Loaded(run=run, cluster=cluster, nodes=nodes)

    async def cleanup_reservations(self) -> list[str]:
        """Delete stale ``gpufleet-check-*`` reservations of the schedulers that clusters
        use (a server that died between a job's end and the deletion left them)."""
        async with self.db.session() as session:
            live = set(
                await session.scalars(select(CheckRunRow.id).where(CheckRunRow.status.in_(ACTIVE)))
            )
            kinds = set(
                await session.scalars(
                    select(ClusterRow.scheduler).where(ClusterRow.deleted_at.is_(None)).distinct()
                )
            )
        gone: list[str] = []
        for kind in sorted(kinds):
            if kind not in self.drivers.schedulers:
                continue
            scheduler = self.drivers.schedulers[kind]
            if not (
                isinstance(scheduler, SupportsJobs) and isinstance(scheduler, SupportsReservations)
            ):
                continue
            backend = SlurmBackend(
                scheduler, output_root=self.settings.output_root, users=self.settings.slurm_users
            )
            try:
                gone += await backend.cleanup_stale(live)
            except DriverError as exc:
                log.warning("checks: stale reservation sweep failed: %s", exc.message)
        return gone
