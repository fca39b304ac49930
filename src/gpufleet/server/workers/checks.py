"""The check runner: pending check runs → started → followed → judged.

Each pass takes every pending or running run (``step``), claiming its row with the lease
columns (``lock_owner``/``lock_token``/``lock_expires_at``), then load → act → apply:

- **pending**: skip nodes that run a job (asking the cluster's scheduler; unreadable job
  state skips the node: fail closed) unless the run is forced or for acceptance; plan
  the invocations (``checks/runners.py``); start them through the backend (the agent's
  command channel, or a Slurm job in a reservation); apply: ``running``, the backend's
  handles and the checked nodes on the row, so a restarted server follows the run.
- **running**: ask the backend; once every invocation ended (or the deadline passed:
  what is left is killed and fails "did not finish"), judge the outputs
  (``checks/aggregate.py``), store the verdict and raw output, raise or clear findings,
  and set passed / failed. A failed multi-node NCCL run starts a localisation run.
- **localisation runs** have no commands of their own: each round they start one
  multi-node NCCL run per probe (``checks/localise.py``) and read their outcomes.

Every apply is a transaction that re-reads the row and writes only while this pass's
lease token still holds it. No network call happens inside a transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import getpass
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import CursorResult, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.aggregate import InvocationOutput, NodeInfo, RunVerdict, judge_run
from gpufleet.checks.models import CheckKind
from gpufleet.checks.runners import (
    CheckPlan,
    Launcher,
    NcclScope,
    NodeTarget,
    plan_check,
    stand_in,
)
from gpufleet.core.enums import CheckStatus, NodeState, ProviderKind
from gpufleet.core.errors import DriverError
from gpufleet.core.ids import new_id
from gpufleet.schedulers.base import SupportsJobs, SupportsReservations
from gpufleet.server.db.tables import CheckRunRow, ClusterRow, NodeRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.services.check_backends.agent import AgentBackend
from gpufleet.server.services.check_backends.base import (
    BackendJob,
    CheckBackend,
    StartRefused,
)
from gpufleet.server.services.check_backends.slurm import SlurmBackend
from gpufleet.server.services.check_findings import apply_check_findings
from gpufleet.server.services.checks import (
    CHECKABLE_STATES,
    ENDED,
    switch_check_status,
)
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import LoopDeps, LoopService
from gpufleet.server.workers.check_localisation import LocalisationSteps

log = logging.getLogger(__name__)

ACTOR = "system:checks"
START_ATTEMPTS = 3  # a backend that refuses this often (nodes keep getting busy): error
DEADLINE_GRACE_S = 180.0  # past the plan's timeout: the agent's kill grace and a late answer
CLEANUP_EVERY = 30  # passes between sweeps for stale Slurm reservations
EVIDENCE_TAIL = 2000


@dataclass(frozen=True)
class CheckSettings:
    output_root: Path
    slurm_users: tuple[str, ...]
    fabric: str | None = None
    stand_ins: dict[str, list[str]] | None = None
    staleness_s: float = 45.0


@dataclass
class Loaded:
    run: CheckRunRow
    cluster: ClusterRow
    nodes: dict[str, NodeRow]  # by id

    @property
    def kind(self) -> CheckKind:
        return CheckKind(self.run.kind)

    @property
    def progress(self) -> dict[str, Any]:
        return dict(self.run.progress or {})


class CheckRunner(LocalisationSteps, LoopService):
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

    # -- the pass -----------------------------------------------------------------------

    async def run_once(self) -> None:
        if self.passes % CLEANUP_EVERY == 0:
            await self.cleanup_reservations()
        async with self.db.session() as session:
            ids = list(
                await session.scalars(
                    select(CheckRunRow.id)
                    .where(
                        CheckRunRow.status.in_(
                            [CheckStatus.PENDING.value, CheckStatus.RUNNING.value]
                        )
                    )
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
        token = await self._claim(run_id)
        if token is None:
            return
        try:
            loaded = await self._load(run_id)
            if loaded is None or CheckStatus(loaded.run.status) in ENDED:
                return
            self.steps += 1
            if "localiser" in loaded.progress:
                await self.localise(loaded, token)
            elif loaded.run.status == CheckStatus.PENDING.value:
                await self._start(loaded, token)
            else:
                await self._follow(loaded, token)
        finally:
            await self._release(run_id, token)

    # -- lease --------------------------------------------------------------------------

    async def _claim(self, run_id: str) -> str | None:
        now = self.clock.now()
        token = new_id()
        async with self.db.transaction() as session:
            result = await session.execute(
                update(CheckRunRow)
                .where(
                    CheckRunRow.id == run_id,
                    CheckRunRow.status.in_([CheckStatus.PENDING.value, CheckStatus.RUNNING.value]),
                    or_(
                        CheckRunRow.lock_expires_at.is_(None),
                        CheckRunRow.lock_expires_at < now,
                        CheckRunRow.lock_owner == self.owner,
                    ),
                )
                .values(
                    lock_owner=self.owner,
                    lock_token=token,
                    lock_expires_at=now + dt.timedelta(seconds=self.lease_ttl_s),
                )
            )
        assert isinstance(result, CursorResult)
        return token if result.rowcount == 1 else None

    async def _release(self, run_id: str, token: str) -> None:
        async with self.db.transaction() as session:
            await session.execute(
                update(CheckRunRow)
                .where(CheckRunRow.id == run_id, CheckRunRow.lock_token == token)
                .values(lock_owner=None, lock_token=None, lock_expires_at=None)
            )

    @contextlib.asynccontextmanager
    async def locked(self, run_id: str, token: str) -> AsyncIterator[_Tx | None]:
        """The apply: the run re-read under lock, or None when this pass lost it."""
        async with self.db.transaction() as session:
            run = await session.get(
                CheckRunRow, run_id, with_for_update=True, populate_existing=True
            )
            if run is None or run.lock_token != token or CheckStatus(run.status) in ENDED:
                yield None
                return
            cluster = await session.get(ClusterRow, run.cluster_id)
            assert cluster is not None
            yield _Tx(session=session, run=run, cluster=cluster, now=self.clock.now())

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

    # -- pending → running --------------------------------------------------------------

    async def _start(self, loaded: Loaded, token: str) -> None:
        run = loaded.run
        checked, skipped = await self._idle_nodes(loaded)
        kind = loaded.kind
        multi = kind is CheckKind.NCCL and run.params.get("scope") == NcclScope.MULTI_NODE
        if not checked or (multi and len(checked) < 2):
            why = "every node was skipped" if not checked else "fewer than 2 nodes left"
            await self._end(
                token,
                run.id,
                CheckStatus.ERROR,
                f"{why}: " + "; ".join(f"{s['node']}: {s['reason']}" for s in skipped),
                skipped=skipped,
            )
            return
        backend = self.backend_for(loaded.cluster)
        stand = self._stand_in(loaded)
        targets = [self._target(loaded, n) for n in checked]
        plan = self._plan(loaded, targets, backend.launcher, stand)
        job = self._job(loaded, plan)
        try:
            handles = await backend.start(job)
        except StartRefused as exc:
            await self._refused(loaded, token, str(exc))
            return
        except DriverError as exc:
            with contextlib.suppress(DriverError, OSError):
                await backend.cancel(job, {})
            await self._end(
                token,
                run.id,
                CheckStatus.ERROR,
                f"{backend.name}: {exc.message}",
                skipped=skipped,
            )
            return
        async with self.locked(run.id, token) as tx:
            if tx is None:
                return
            tx.run.backend = backend.name
            tx.run.skipped = skipped
            # Agents run a node's commands one after the other; a Slurm job runs its steps
            # at once.
            limit_s = plan.serial_timeout_s if backend.name == "agent" else plan.timeout_s
            tx.run.deadline_at = tx.now + dt.timedelta(seconds=limit_s + DEADLINE_GRACE_S)
            tx.run.progress = {
                **(tx.run.progress or {}),
                "nodes": [n.name for n in checked],
                "launcher": backend.launcher.value,
                "stand_in": stand,
                "handles": handles,
                "invocations": len(plan.invocations),
            }
            names = ", ".join(n.name for n in checked)
            skip_note = f"; skipped {', '.join(s['node'] for s in skipped)}" if skipped else ""
            switch_check_status(
                tx.session,
                run=tx.run,
                project_id=tx.cluster.project_id,
                target=CheckStatus.RUNNING,
                actor=ACTOR,
                reason=f"started through {backend.name} on {names}{skip_note}",
                now=tx.now,
                data={"skipped": skipped, "backend": backend.name},
            )

    async def _idle_nodes(self, loaded: Loaded) -> tuple[list[NodeRow], list[dict[str, str]]]:
        """The nodes to check, and the skipped ones with why. Acceptance runs and forced
        runs check busy nodes too; everything else fails closed."""
        run = loaded.run
        checked: list[NodeRow] = []
        skipped: list[dict[str, str]] = []
        ask = not run.forced and run.purpose != "acceptance"
        scheduler = None
        if ask:
            try:
                scheduler = scheduler_for(self.drivers, loaded.cluster)
            except Exception as exc:  # noqa: BLE001 - an unconfigured scheduler skips all
                scheduler = None
                reason = f"job state unreadable (scheduler {loaded.cluster.scheduler}: {exc})"
                return [], [self._skip(n, reason) for n in self._ordered(loaded)]
        for node in self._ordered(loaded):
            if NodeState(node.state) not in CHECKABLE_STATES:
                skipped.append(self._skip(node, f"node is {node.state}"))
                continue
            if scheduler is None:
                checked.append(node)
                continue
            try:
                jobs = await scheduler.jobs_on_node(node.scheduler_name or node.name)
            except DriverError as exc:
                skipped.append(
                    self._skip(node, f"job state unreadable, not checked: {exc.message}")
                )
                continue
            if jobs:
                listed = ", ".join(f"{j.job_id} ({j.user}, {j.account})" for j in jobs[:3])
                more = f" and {len(jobs) - 3} more" if len(jobs) > 3 else ""
                skipped.append(
                    self._skip(
                        node,
                        f"running job {listed}{more}; an admin may force the check",
                    )
                )
                continue
            checked.append(node)
        return checked, skipped

    @staticmethod
    def _skip(node: NodeRow, reason: str) -> dict[str, str]:
        return {"node_id": node.id, "node": node.name, "reason": reason}

    @staticmethod
    def _ordered(loaded: Loaded) -> list[NodeRow]:
        return [loaded.nodes[n] for n in loaded.run.node_ids if n in loaded.nodes]

    async def _refused(self, loaded: Loaded, token: str, why: str) -> None:
        attempts = int(loaded.progress.get("start_attempts", 0)) + 1
        if attempts >= START_ATTEMPTS:
            await self._end(
                token,
                loaded.run.id,
                CheckStatus.ERROR,
                f"could not start after {attempts} tries: {why}",
            )
            return
        async with self.locked(loaded.run.id, token) as tx:
            if tx is None:
                return
            tx.run.progress = {**(tx.run.progress or {}), "start_attempts": attempts}
            tx.run.detail = f"waiting to start (try {attempts} of {START_ATTEMPTS}): {why}"
            tx.run.updated_at = tx.now

    # -- running → ended ----------------------------------------------------------------

    async def _follow(self, loaded: Loaded, token: str) -> None:
        run = loaded.run
        backend = self._backend_named(loaded)
        plan = self._rebuild(loaded, backend.launcher)
        job = self._job(loaded, plan)
        handles = dict(loaded.progress.get("handles") or {})
        now = self.clock.now()
        if loaded.progress.get("cancel"):
            outputs = await backend.cancel(job, handles)
            await self._end(
                token,
                run.id,
                CheckStatus.CANCELLED,
                str(loaded.progress["cancel"]),
                outputs_seen=len(outputs),
            )
            return
        try:
            polled = await backend.poll(job, handles)
        except DriverError as exc:
            if run.deadline_at is None or now < run.deadline_at:
                await self._note(token, run.id, f"{backend.name}: {exc.message} (retrying)")
                return
            polled = None
        if polled is not None and polled.done:
            await self._finish(loaded, token, plan, polled.outputs)
            return
        if run.deadline_at is not None and now >= run.deadline_at:
            outputs = {}
            with contextlib.suppress(DriverError, OSError):
                outputs = await backend.cancel(job, handles)
            for inv in plan.invocations:
                if inv.id not in outputs:
                    outputs[inv.id] = InvocationOutput(
                        id=inv.id,
                        timed_out=True,
                        error=f"killed: the run's deadline ({run.deadline_at.isoformat()}) passed",
                    )
            await self._finish(loaded, token, plan, outputs)
            return
        if polled is not None and polled.note != run.detail:
            await self._note(token, run.id, polled.note, handles=polled.handles)

    async def _finish(
        self, loaded: Loaded, token: str, plan: CheckPlan, outputs: dict[str, InvocationOutput]
    ) -> None:
        run, cluster = loaded.run, loaded.cluster
        infos = [
            NodeInfo(
                id=n.id, name=n.name, aliases=tuple(a for a in (n.hostname, n.scheduler_name) if a)
            )
            for n in loaded.nodes.values()
        ]
        verdict = judge_run(
            plan,
            outputs,
            nodes=infos,
            gpu_model=cluster.gpu_model,
            fabric=self._fabric(loaded),
            expected_gpus=cluster.gpus_per_node,
            stand_in=bool(loaded.progress.get("stand_in")),
        )
        tails = self._tails(loaded, plan, outputs)
        status = CheckStatus.PASSED if verdict.passed else CheckStatus.FAILED
        async with self.locked(run.id, token) as tx:
            if tx is None:
                return
            result = {
                **verdict.result,
                "skipped": list(tx.run.skipped or []),
                "backend": tx.run.backend,
            }
            if self._wants_localisation(tx.run, verdict):
                child = await self.start_localisation(tx.session, tx.run, tx.cluster, tx.now)
                result["localisation"] = {"run_id": child.id, "status": "running"}
            tx.run.result = result
            tx.run.raw_output = verdict.raw_output
            await apply_check_findings(
                tx.session,
                cluster=tx.cluster,
                kind=loaded.kind,
                run_id=tx.run.id,
                blames=verdict.blames,
                judged=verdict.judged_nodes,
                evidence_tail=tails,
                now=tx.now,
                staleness_s=self.settings.staleness_s,
            )
            failed = [v["name"] for v in result["nodes"].values() if v["outcome"] == "fail"]
            reason = f"{verdict.outcome}: " + (
                f"failed on {', '.join(failed)}"
                if failed
                else "every node passed"
                if verdict.passed
                else "; ".join(r["message"] for r in result["reasons"][:3])
            )
            self._ended(tx, status, reason)

    def _wants_localisation(self, run: CheckRunRow, verdict: RunVerdict) -> bool:
        params = run.params or {}
        return (
            run.kind == CheckKind.NCCL.value
            and params.get("scope") == NcclScope.MULTI_NODE
            and bool(params.get("localise", True))
            and run.purpose != "localisation"
            and not verdict.passed
            and not verdict.blames
            and len((run.progress or {}).get("nodes", [])) >= 2
        )

    # -- helpers ------------------------------------------------------------------------

    async def _end(
        self, token: str, run_id: str, target: CheckStatus, reason: str, **extra: Any
    ) -> None:
        async with self.locked(run_id, token) as tx:
            if tx is None:
                return
            if "skipped" in extra:
                tx.run.skipped = extra["skipped"]
                tx.run.result = {**(tx.run.result or {}), "skipped": extra["skipped"]}
            self._ended(tx, target, reason)

    def _ended(self, tx: _Tx, target: CheckStatus, reason: str) -> None:
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

    async def _note(
        self, token: str, run_id: str, note: str, handles: dict[str, Any] | None = None
    ) -> None:
        async with self.locked(run_id, token) as tx:
            if tx is None:
                return
            tx.run.detail = note
            tx.run.updated_at = tx.now
            if handles is not None:
                tx.run.progress = {**(tx.run.progress or {}), "handles": handles}

    def backend_for(self, cluster: ClusterRow) -> CheckBackend:
        """Slurm clusters whose driver can run jobs and reserve nodes: a Slurm job.
        Everything else (sim, Kubernetes, static): the agents' command channel."""
        try:
            scheduler = scheduler_for(self.drivers, cluster)
        except Exception:  # noqa: BLE001 - no scheduler driver: the agents still run checks
            return self.agent_backend
        if isinstance(scheduler, SupportsJobs) and isinstance(scheduler, SupportsReservations):
            return SlurmBackend(
                scheduler,
                output_root=self.settings.output_root,
                users=self.settings.slurm_users,
            )
        return self.agent_backend

    def _backend_named(self, loaded: Loaded) -> CheckBackend:
        """The backend the run started on (a cluster's scheduler does not change)."""
        if loaded.run.backend == self.agent_backend.name:
            return self.agent_backend
        return self.backend_for(loaded.cluster)

    def _stand_in(self, loaded: Loaded) -> list[str] | None:
        table = self.settings.stand_ins or {}
        kind = loaded.run.kind
        return table.get(f"{loaded.cluster.id}/{kind}") or table.get(kind) or None

    def _fabric(self, loaded: Loaded) -> str | None:
        labels = loaded.cluster.labels or {}
        fabric = loaded.run.params.get("fabric") or labels.get("fabric") or self.settings.fabric
        if fabric is None and loaded.cluster.provider == ProviderKind.SIM.value:
            fabric = "NDR"  # the sim models 8 × NDR per node
        return str(fabric) if fabric else None

    @staticmethod
    def _target(loaded: Loaded, node: NodeRow) -> NodeTarget:
        return NodeTarget(
            name=node.name,
            host=node.hostname or node.scheduler_name or node.name,
            gpus=node.expected_gpus or loaded.cluster.gpus_per_node,
        )

    @staticmethod
    def _plan(
        loaded: Loaded, targets: list[NodeTarget], launcher: Launcher, stand: list[str] | None
    ) -> CheckPlan:
        plan = plan_check(loaded.kind, nodes=targets, params=loaded.run.params, launcher=launcher)
        if stand:
            plan = CheckPlan(
                kind=plan.kind,
                params=plan.params,
                invocations=tuple(stand_in(i, stand) for i in plan.invocations),
            )
        return plan

    def _rebuild(self, loaded: Loaded, launcher: Launcher) -> CheckPlan:
        by_name = {n.name: n for n in loaded.nodes.values()}
        names = loaded.progress.get("nodes") or [n.name for n in self._ordered(loaded)]
        targets = [self._target(loaded, by_name[n]) for n in names if n in by_name]
        stored = loaded.progress.get("launcher")
        return self._plan(
            loaded,
            targets,
            Launcher(stored) if stored else launcher,
            loaded.progress.get("stand_in"),
        )

    def _job(self, loaded: Loaded, plan: CheckPlan) -> BackendJob:
        return BackendJob(
            run_id=loaded.run.id,
            cluster_id=loaded.cluster.id,
            plan=plan,
            node_ids={n.name: n.id for n in loaded.nodes.values()},
            forced=loaded.run.forced,
            now=self.clock.now(),
        )

    @staticmethod
    def _tails(
        loaded: Loaded, plan: CheckPlan, outputs: dict[str, InvocationOutput]
    ) -> dict[str, str]:
        by_name = {n.name: n.id for n in loaded.nodes.values()}
        tails: dict[str, str] = {}
        for inv in plan.invocations:
            out = outputs.get(inv.id)
            if out is None or not inv.judged:
                continue
            text = (out.stdout + ("\n" + out.stderr if out.stderr else ""))[-EVIDENCE_TAIL:]
            for name in inv.nodes if len(inv.nodes) > 1 else (inv.node,):
                node_id = by_name.get(name)
                if node_id is not None:
                    tails[node_id] = (tails.get(node_id, "") + text)[-EVIDENCE_TAIL:]
        return tails

    async def cleanup_reservations(self) -> list[str]:
        """Delete stale ``gpufleet-check-*`` reservations of the schedulers that clusters
        use (a server that died between a job's end and the deletion left them)."""
        async with self.db.session() as session:
            live = set(
                await session.scalars(
                    select(CheckRunRow.id).where(
                        CheckRunRow.status.in_(
                            [CheckStatus.PENDING.value, CheckStatus.RUNNING.value]
                        )
                    )
                )
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


@dataclass
class _Tx:
    session: AsyncSession
    run: CheckRunRow
    cluster: ClusterRow
    now: dt.datetime


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
