"""What a check-run step is given (``RunContext``), and the applies every step shares.

A step gets the context and the run as loaded (``Loaded``). Its apply is
``ctx.locked()``: the run re-read under lock while this pass's lease token still holds it
and the run has not ended (``Tx``), or None when the pass lost it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.models import CheckKind
from gpufleet.core.enums import CheckStatus
from gpufleet.schedulers.base import SupportsJobs, SupportsReservations
from gpufleet.server.db.tables import CheckRunRow, ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.check_backends.agent import AgentBackend
from gpufleet.server.services.check_backends.base import CheckBackend
from gpufleet.server.services.check_backends.slurm import SlurmBackend
from gpufleet.server.services.checks import switch_check_status
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LeaseGuard, StepContext

ACTOR = "system:checks"
# A run the runner drives; every other status is ended.
ACTIVE = frozenset({CheckStatus.PENDING.value, CheckStatus.RUNNING.value})


@dataclass(frozen=True)
class CheckSettings:
    output_root: Path
    slurm_users: tuple[str, ...]
    fabric: str | None = None
    stand_ins: dict[str, list[str]] | None = None
    staleness_s: float = 45.0


def default_check_settings(
    *,
    data_dir: Path,
    output_dir: Path | None,
    slurm_user: str | None,
    fabric: str | None,
    stand_ins: dict[str, list[str]],
    staleness_s: float,
) -> CheckSettings:
    return CheckSettings(
        output_root=output_dir or data_dir / "check-output",
        slurm_users=(slurm_user or getpass.getuser(),),
        fabric=fabric,
        stand_ins=dict(stand_ins),
        staleness_s=staleness_s,
    )


@dataclass
class Loaded:
    """A run as its step saw it when it started, with its cluster and nodes."""

    run: CheckRunRow
    cluster: ClusterRow
    nodes: dict[str, NodeRow]  # by id

    @property
    def kind(self) -> CheckKind:
        return CheckKind(self.run.kind)

    @property
    def progress(self) -> dict[str, Any]:
        return dict(self.run.progress or {})


@dataclass
class Tx:
    """An apply in progress: the run re-read under lock, and its cluster."""

    session: AsyncSession
    run: CheckRunRow
    cluster: ClusterRow
    now: dt.datetime


@dataclass(frozen=True, kw_only=True)
class RunContext(StepContext[CheckRunRow]):
    """One pass over one run: the runner's drivers, settings and agent backend, and the
    run, guarded by the lease token this pass claimed it with (``lease_guard``)."""

    drivers: DriverRegistry
    settings: CheckSettings
    agent_backend: AgentBackend

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[Tx | None]:
        """The apply: the run re-read under lock, or None when this pass lost it."""
        async with self.apply() as applied:
            if applied is None:
                yield None
                return
            cluster = await applied.session.get(ClusterRow, applied.row.cluster_id)
            assert cluster is not None
            yield Tx(session=applied.session, run=applied.row, cluster=cluster, now=applied.now)

    async def end(self, target: CheckStatus, reason: str, **extra: Any) -> None:
        """End the run (``skipped`` in ``extra``: store the skipped nodes with it)."""
        async with self.locked() as tx:
            if tx is None:
                return
            if "skipped" in extra:
                tx.run.skipped = extra["skipped"]
                tx.run.result = {**(tx.run.result or {}), "skipped": extra["skipped"]}
            ended(tx, target, reason)

    async def note(self, note: str, handles: dict[str, Any] | None = None) -> None:
        """Where the run is, in words (and the backend's handles, when they changed)."""
        async with self.locked() as tx:
            if tx is None:
                return
            tx.run.detail = note
            tx.run.updated_at = tx.now
            if handles is not None:
                tx.run.progress = {**(tx.run.progress or {}), "handles": handles}

    def backend_for(self, cluster: ClusterRow) -> CheckBackend:
        return backend_for(
            cluster, drivers=self.drivers, settings=self.settings, agent=self.agent_backend
        )

    def backend_named(self, loaded: Loaded) -> CheckBackend:
        """The backend the run started on (a cluster's scheduler does not change)."""
        if loaded.run.backend == self.agent_backend.name:
            return self.agent_backend
        return self.backend_for(loaded.cluster)


def lease_guard(token: str) -> LeaseGuard:
    """A check run's apply guard: still claimed by this pass, not ended."""
    return LeaseGuard(token=token, statuses=ACTIVE)


def ended(tx: Tx, target: CheckStatus, reason: str) -> None:
    """Move the run to an ended status (``switch_check_status``: evented, audited)."""
    switch_check_status(
        tx.session,
        run=tx.run,
        project_id=tx.cluster.project_id,
        target=target,
        actor=ACTOR,
        reason=reason[:2000],
        now=tx.now,
        data={
            "outcome": (tx.run.result or {}).get("outcome"),
            "requested_by": tx.run.requested_by,
        },
    )


def backend_for(
    cluster: ClusterRow, *, drivers: DriverRegistry, settings: CheckSettings, agent: AgentBackend
) -> CheckBackend:
    """Slurm clusters whose driver can run jobs and reserve nodes: a Slurm job.
    Everything else (sim, Kubernetes, static): the agents' command channel."""
    try:
        scheduler = scheduler_for(drivers, cluster)
    except Exception:  # noqa: BLE001 - no scheduler driver: the agents still run checks
        return agent
    if isinstance(scheduler, SupportsJobs) and isinstance(scheduler, SupportsReservations):
        return SlurmBackend(scheduler, output_root=settings.output_root, users=settings.slurm_users)
    return agent
