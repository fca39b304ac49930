"""The steps of an ordinary check run: pending → running (``start``), running → ended
(``follow``). Each is load → act → apply: the run as loaded, the backend's calls with no
transaction open, then ``ctx.locked()``.

- **pending**: skip nodes that run a job (asking the cluster's scheduler; unreadable job
  state skips the node: fail closed) unless the run is forced or for acceptance; plan
  the invocations (``checks/runners.py``); start them through the backend (the agent's
  command channel, or a Slurm job in a reservation); apply: ``running``, the backend's
  handles and the checked nodes on the row, so a restarted server follows the run.
- **running**: ask the backend; once every invocation ended (or the deadline passed:
  what is left is killed and fails "did not finish"), judge the outputs
  (``checks/aggregate.py``), store the verdict and raw output, raise or clear findings,
  and set passed / failed. A failed multi-node NCCL run starts a localisation run.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt

from gpufleet.checks.aggregate import InvocationOutput, NodeInfo, RunVerdict, judge_run
from gpufleet.checks.models import CheckKind
from gpufleet.checks.runners import CheckPlan, NcclScope
from gpufleet.core.enums import CheckStatus, NodeState
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SchedNodeState, Scheduler
from gpufleet.server.db.tables import CheckRunRow, NodeRow
from gpufleet.server.services.check_backends.base import CheckBackend, StartRefused
from gpufleet.server.services.check_findings import apply_check_findings
from gpufleet.server.services.checks import CHECKABLE_STATES, switch_check_status
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.base import Step
from gpufleet.server.workers.checks.context import ACTOR, Loaded, RunContext, ended
from gpufleet.server.workers.checks.localisation import start_localisation
from gpufleet.server.workers.checks.planning import (
    evidence_tails,
    fabric_of,
    job_of,
    ordered_nodes,
    plan_for,
    rebuild_plan,
    stand_in_of,
    target_of,
)

JOB_LOOKUPS = 16  # scheduler calls a run's start makes at once, asking for nodes' jobs
START_ATTEMPTS = 3  # a backend that refuses this often (nodes keep getting busy): error
DEADLINE_GRACE_S = 180.0  # past the plan's timeout: the agent's kill grace and a late answer


# -- pending → running ------------------------------------------------------------------


async def start(ctx: RunContext, loaded: Loaded) -> None:
    run = loaded.run
    checked, skipped = await _idle_nodes(ctx, loaded)
    kind = loaded.kind
    multi = kind is CheckKind.NCCL and run.params.get("scope") == NcclScope.MULTI_NODE
    if not checked or (multi and len(checked) < 2):
        why = "every node was skipped" if not checked else "fewer than 2 nodes left"
        await ctx.end(
            CheckStatus.ERROR,
            f"{why}: " + "; ".join(f"{s['node']}: {s['reason']}" for s in skipped),
            skipped=skipped,
        )
        return
    backend, why = await _backend_for(ctx, loaded, checked)
    stand = stand_in_of(loaded, ctx.settings)
    targets = [target_of(loaded, n) for n in checked]
    plan = plan_for(loaded, targets=targets, launcher=backend.launcher, stand=stand)
    job = job_of(loaded, plan=plan, now=ctx.clock.now())
    try:
        handles = await backend.start(job)
    except StartRefused as exc:
        await _refused(ctx, loaded, why=str(exc))
        return
    except DriverError as exc:
        with contextlib.suppress(DriverError, OSError):
            await backend.cancel(job, {})
        await ctx.end(CheckStatus.ERROR, f"{backend.name}: {exc.message}", skipped=skipped)
        return
    async with ctx.locked() as tx:
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
            reason=f"started through {backend.name}{why} on {names}{skip_note}",
            now=tx.now,
            data={"skipped": skipped, "backend": backend.name},
        )


async def _idle_nodes(
    ctx: RunContext, loaded: Loaded
) -> tuple[list[NodeRow], list[dict[str, str]]]:
    """The nodes to check, and the skipped ones with why. Acceptance runs and forced
    runs check busy nodes too; everything else fails closed. The nodes' jobs are asked
    for ``JOB_LOOKUPS`` at a time (a run over 1,000 nodes asked one after another waited
    on 1,000 scheduler calls in turn before it started)."""
    run = loaded.run
    nodes = ordered_nodes(loaded)
    scheduler: Scheduler | None = None  # None: busy nodes are checked too
    if not run.forced and run.purpose != "acceptance":
        try:
            scheduler = scheduler_for(ctx.drivers, loaded.cluster)
        except Exception as exc:  # noqa: BLE001 - an unconfigured scheduler skips all
            reason = f"job state unreadable (scheduler {loaded.cluster.scheduler}: {exc})"
            return [], [_skip(n, reason) for n in nodes]
    limit = asyncio.Semaphore(JOB_LOOKUPS)

    async def why_not(node: NodeRow) -> str | None:
        """Why ``node`` is not checked; None: it is."""
        if NodeState(node.state) not in CHECKABLE_STATES:
            return f"node is {node.state}"
        if scheduler is None:
            return None
        try:
            async with limit:
                jobs = await scheduler.jobs_on_node(node.scheduler_name or node.name)
        except DriverError as exc:
            return f"job state unreadable, not checked: {exc.message}"
        if not jobs:
            return None
        listed = ", ".join(f"{j.job_id} ({j.user}, {j.account})" for j in jobs[:3])
        more = f" and {len(jobs) - 3} more" if len(jobs) > 3 else ""
        return f"running job {listed}{more}; an admin may force the check"

    reasons = await asyncio.gather(*(why_not(n) for n in nodes))
    checked = [n for n, why in zip(nodes, reasons, strict=True) if why is None]
    skipped = [_skip(n, why) for n, why in zip(nodes, reasons, strict=True) if why is not None]
    return checked, skipped


async def _backend_for(
    ctx: RunContext, loaded: Loaded, checked: list[NodeRow]
) -> tuple[CheckBackend, str]:
    """The cluster's backend, and why not when it is not. An acceptance run on a Slurm
    cluster whose nodes are out of Slurm's hands goes through the agents:

    - nodes Slurm's power saving holds for a machine not up yet (a cloud node resumed
      for a job): the job is allocated to the node and starts the moment slurmd
      registers, so the checks run on the machine before slurmd starts, never as a Slurm
      job queued behind it;
    - nodes drained (gpufleet holds a node drained while it is accepted, after
      provisioning or a repair): Slurm starts no job on a drained node, not even in a
      reservation."""
    backend = ctx.backend_for(loaded.cluster)
    if backend is ctx.agent_backend or loaded.run.purpose != "acceptance":
        return backend, ""
    try:
        listed = await scheduler_for(ctx.drivers, loaded.cluster).list_nodes()
    except DriverError:
        return backend, ""  # the Slurm backend says what is wrong when it starts
    names = {n.scheduler_name or n.name for n in checked}
    mine = [n for n in listed if n.name in names]
    waiting = sorted(n.name for n in mine if n.powered_down)
    if waiting:
        return ctx.agent_backend, f" (Slurm powers up {', '.join(waiting)}: checked before slurmd)"
    held = sorted(n.name for n in mine if n.state in _DRAINED)
    if held:
        return ctx.agent_backend, f" ({', '.join(held)} drained in Slurm: no Slurm job runs there)"
    return backend, ""


_DRAINED = frozenset({SchedNodeState.DRAINED, SchedNodeState.DRAINING, SchedNodeState.DOWN})


def _skip(node: NodeRow, reason: str) -> dict[str, str]:
    return {"node_id": node.id, "node": node.name, "reason": reason}


async def _refused(ctx: RunContext, loaded: Loaded, *, why: str) -> None:
    attempts = int(loaded.progress.get("start_attempts", 0)) + 1
    if attempts >= START_ATTEMPTS:
        await ctx.end(CheckStatus.ERROR, f"could not start after {attempts} tries: {why}")
        return
    async with ctx.locked() as tx:
        if tx is None:
            return
        tx.run.progress = {**(tx.run.progress or {}), "start_attempts": attempts}
        tx.run.detail = f"waiting to start (try {attempts} of {START_ATTEMPTS}): {why}"
        tx.run.updated_at = tx.now


# -- running → ended --------------------------------------------------------------------


async def follow(ctx: RunContext, loaded: Loaded) -> None:
    run = loaded.run
    backend = ctx.backend_named(loaded)
    plan = rebuild_plan(loaded, backend.launcher)
    job = job_of(loaded, plan=plan, now=ctx.clock.now())
    handles = dict(loaded.progress.get("handles") or {})
    now = ctx.clock.now()
    if loaded.progress.get("cancel"):
        await backend.cancel(job, handles)
        await ctx.end(CheckStatus.CANCELLED, str(loaded.progress["cancel"]))
        return
    try:
        polled = await backend.poll(job, handles)
    except DriverError as exc:
        if run.deadline_at is None or now < run.deadline_at:
            await ctx.note(f"{backend.name}: {exc.message} (retrying)")
            return
        polled = None
    if polled is not None and polled.done:
        await _finish(ctx, loaded, plan=plan, outputs=polled.outputs)
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
        await _finish(ctx, loaded, plan=plan, outputs=outputs)
        return
    if polled is not None and polled.note != run.detail:
        await ctx.note(polled.note, handles=polled.handles)


async def _finish(
    ctx: RunContext, loaded: Loaded, *, plan: CheckPlan, outputs: dict[str, InvocationOutput]
) -> None:
    cluster = loaded.cluster
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
        fabric=fabric_of(loaded, ctx.settings),
        expected_gpus=cluster.gpus_per_node,
        stand_in=bool(loaded.progress.get("stand_in")),
    )
    tails = evidence_tails(loaded, plan=plan, outputs=outputs)
    status = CheckStatus.PASSED if verdict.passed else CheckStatus.FAILED
    async with ctx.locked() as tx:
        if tx is None:
            return
        result = {
            **verdict.result,
            "skipped": list(tx.run.skipped or []),
            "backend": tx.run.backend,
        }
        if _wants_localisation(tx.run, verdict):
            child = await start_localisation(
                tx.session, failed=tx.run, cluster=tx.cluster, now=tx.now
            )
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
            staleness_s=ctx.settings.staleness_s,
        )
        failed = [v["name"] for v in result["nodes"].values() if v["outcome"] == "fail"]
        reason = f"{verdict.outcome}: " + (
            f"failed on {', '.join(failed)}"
            if failed
            else "every node passed"
            if verdict.passed
            else "; ".join(r["message"] for r in result["reasons"][:3])
        )
        ended(tx, status, reason)


def _wants_localisation(run: CheckRunRow, verdict: RunVerdict) -> bool:
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


# An ordinary run's steps, by status (ended runs have none).
STEPS: dict[CheckStatus, Step[RunContext, Loaded]] = {
    CheckStatus.PENDING: start,
    CheckStatus.RUNNING: follow,
}
