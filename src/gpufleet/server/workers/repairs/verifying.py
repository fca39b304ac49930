"""The verifying step (verifying → succeeded | failed): a repaired node must prove itself
before it takes work again.

It must report after the action with every GPU and no critical finding new or seen
again since, for ``verify_settle_s``, within ``verify_timeout_s``. Then, when the action
started the machine again (reboot, reprovision, failover), the cluster's startup scripts
run on it; then, unless the cluster opted out, the node is in ``acceptance`` while the
node-level part of the acceptance suite runs on it (re-acceptance). Then gpufleet's own
drain is undone (never anyone else's) and the node is back in service; otherwise — a
finding back, no report in time, a failed startup script, a failed re-acceptance — the
repair fails loudly, the node stays cordoned and the planner recommends the next rung.

The startup and acceptance runs are made in the transaction that records their ids in
``progress``, so a crash never starts either twice; the acceptance loop carries them out.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select

from gpufleet.core.acceptance import (
    OPEN_STATUSES,
    AcceptanceScope,
    AcceptanceStatus,
    AcceptanceTrigger,
)
from gpufleet.core.enums import (
    AcceptanceStage,
    NodeState,
    RepairAction,
    RepairStatus,
    Severity,
    StartupStatus,
)
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.server.db.tables import (
    AcceptanceRunRow,
    FindingRow,
    GpuRow,
    NodeRow,
    NodeStartupRow,
)
from gpufleet.server.services.acceptance import create_acceptance_run
from gpufleet.server.services.node_health import refresh_node_health
from gpufleet.server.services.node_holds import record_release, release_in_scheduler
from gpufleet.server.services.startup_scripts import (
    StartupTrigger,
    boot_key,
    ensure_startup,
)
from gpufleet.server.workers.repairs.context import (
    ACTOR,
    LoadedRepair,
    RepairContext,
    close_findings,
    parse_ts,
)

_BAD = frozenset({Severity.CRITICAL.value, Severity.FATAL.value})
# Actions after which the machine started again: its startup scripts run again.
_RESTARTS = {
    RepairAction.REBOOT: StartupTrigger.REBOOT,
    RepairAction.REPROVISION: StartupTrigger.REPROVISION,
    RepairAction.FAILOVER: StartupTrigger.FAILOVER,
}


def still_bad(finding: FindingRow, *, acted: dt.datetime, asked: dt.datetime) -> bool:
    """A finding that says the repair did not work: first seen after the machine was
    asked to act (``asked``: a fault since the reboot, even one the node logged before the
    control plane saw it back at ``acted``), seen again after the action, or one that
    clears by itself (metric, state) and has not (a log line from before the repair stays
    open until the repair is verified)."""
    if finding.severity not in _BAD:
        return False
    if finding.first_seen > asked or finding.last_seen > acted:
        return True
    signature = get_signature(finding.signature_id)
    clears_on_repair = signature is not None and signature.clear is not None and (
        signature.clear.mode == "repair"
    )  # fmt: skip
    return not clears_on_repair and finding.source != "kernel-log"


async def verify(ctx: RepairContext, loaded: LoadedRepair) -> None:
    if loaded.progress.get("settled_at"):
        # Past the watch: startup scripts and re-acceptance, each with its own limits.
        if await _reaccept(ctx, loaded):
            await _return_to_service(ctx, loaded)
        return
    repair, policy, node = loaded.repair, loaded.policy, loaded.node
    now = ctx.clock.now()
    acted = parse_ts(loaded.progress.get("acted_at")) or repair.step_started_at or now
    async with ctx.db.session() as session:
        findings = list(
            await session.scalars(
                select(FindingRow).where(
                    FindingRow.node_id == node.id, FindingRow.cleared_at.is_(None)
                )
            )
        )
        fresh_gpus = int(
            await session.scalar(
                select(func.count()).where(
                    GpuRow.node_id == node.id,
                    GpuRow.removed_at.is_(None),
                    GpuRow.sampled_at > acted,
                )
            )
            or 0
        )
    # The request is the earliest the action could take effect: a fault that began after
    # it is the machine's state after the repair, not before.
    asked = min(parse_ts(loaded.progress.get("requested_at")) or acted, acted)
    recurred = [f for f in findings if still_bad(f, acted=acted, asked=asked)]
    if recurred:
        worst = recurred[0]
        how = "first seen" if worst.first_seen > asked else "seen again"
        await ctx.fail(
            loaded,
            f"verification failed: {worst.signature_id} ({worst.title}) {how} "
            f"after the {repair.action}",
        )
        return
    if (now - acted).total_seconds() > policy.verify_timeout_s:
        await ctx.fail(
            loaded,
            f"verification failed: the node did not report all {node.expected_gpus} GPUs "
            f"within {policy.verify_timeout_s:.0f} s of the {repair.action}",
        )
        return
    reported = node.last_report_at is not None and node.last_report_at > acted
    if not reported or fresh_gpus < node.expected_gpus:
        await ctx.note(
            loaded,
            f"waiting for the node to report ({fresh_gpus}/{node.expected_gpus} GPUs seen "
            "since the action)",
        )
        return
    first = parse_ts(loaded.progress.get("first_report_at"))
    if first is None:
        first = now
        if policy.verify_settle_s > 0:
            await ctx.note(
                loaded,
                f"node reports again; watching it for {policy.verify_settle_s:.0f} s",
                first_report_at=now.isoformat(),
            )
            return
    if (now - first).total_seconds() >= policy.verify_settle_s:
        await ctx.note(
            loaded,
            "the node reports clean; startup scripts and re-acceptance next",
            settled_at=now.isoformat(),
        )


# -- startup scripts and re-acceptance --------------------------------------------------


async def _reaccept(ctx: RepairContext, loaded: LoadedRepair) -> bool:
    """Startup scripts (after a restart), then the node-level acceptance suite. True
    when both are done and passed (or not needed); False: wait, or the repair failed."""
    repair, cluster = loaded.repair, loaded.cluster
    trigger = _RESTARTS.get(RepairAction(repair.action))
    if trigger is not None and cluster.startup_scripts:
        startup_id = loaded.progress.get("startup_id")
        if not isinstance(startup_id, str):
            await _start_startup(ctx, loaded, trigger)
            return False
    else:
        startup_id = "none"
    if startup_id != "none":
        async with ctx.db.session() as session:
            startup = await session.get(NodeStartupRow, startup_id)
        if startup is None or startup.status == StartupStatus.RUNNING.value:
            done = len(startup.results or []) if startup is not None else 0
            total = len(startup.scripts or []) if startup is not None else 0
            await ctx.note(loaded, f"running startup scripts ({done}/{total} done)")
            return False
        if startup.status != StartupStatus.SUCCEEDED.value:
            await _fail_held(ctx, loaded, f"verification failed: {startup.error}")
            return False
    if not cluster.acceptance_tests:
        return True
    run_id = loaded.progress.get("acceptance_id")
    if not isinstance(run_id, str):
        await _start_acceptance(ctx, loaded)
        return False
    async with ctx.db.session() as session:
        run = await session.get(AcceptanceRunRow, run_id)
    if run is None:
        await ctx.fail(loaded, f"verification failed: acceptance run {run_id} is gone")
        return False
    status = AcceptanceStatus(run.status)
    if status in OPEN_STATUSES or run.stage != AcceptanceStage.DONE:
        await ctx.note(loaded, f"re-acceptance {run.id}: {run.detail}")
        return False
    if status is not AcceptanceStatus.PASSED:
        await _fail_held(ctx, loaded, f"re-acceptance {run.id} {status.value}: {run.detail}"[:2000])
        return False
    return True


async def _fail_held(ctx: RepairContext, loaded: LoadedRepair, reason: str) -> None:
    """Fail the repair (the node stays cordoned) and say why on the node itself."""
    await ctx.fail(loaded, reason)
    async with ctx.db.transaction() as session:
        node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
        if node is not None and node.state == NodeState.CORDONED.value:
            node.state_detail = reason[:4000]


async def _start_startup(ctx: RepairContext, loaded: LoadedRepair, trigger: StartupTrigger) -> None:
    async with ctx.locked(loaded) as tx:
        if tx is None or (tx.repair.progress or {}).get("startup_id"):
            return
        node = tx.node
        startup = await ensure_startup(
            tx.session,
            node=node,
            cluster=loaded.cluster,
            trigger=trigger,
            key=boot_key(node.provider_instance_id, None) + f"/repair:{tx.repair.id}",
            actor=ACTOR,
            now=tx.now,
            repair_id=tx.repair.id,
        )
        if startup is None:  # no scripts after all (changed meanwhile)
            tx.progress(startup_id="none")
            return
        await tx.session.flush()
        tx.progress(startup_id=startup.id)
        tx.repair.detail = f"running {len(startup.scripts)} startup script(s)"
        tx.repair.updated_at = tx.now
        tx.step_event(tx.repair.detail, {"startup_id": startup.id})


async def _start_acceptance(ctx: RepairContext, loaded: LoadedRepair) -> None:
    async with ctx.locked(loaded) as tx:
        if tx is None or (tx.repair.progress or {}).get("acceptance_id"):
            return
        tx.node_to(NodeState.ACCEPTANCE, f"repair {tx.repair.id}: re-acceptance")
        tx.node.state_detail = f"re-acceptance after repair {tx.repair.id}"
        run = create_acceptance_run(
            tx.session,
            cluster=loaded.cluster,
            scope=AcceptanceScope.NODE,
            trigger=AcceptanceTrigger.REPAIR,
            node_ids=[tx.node.id],
            node_names=[tx.node.name],
            actor=ACTOR,
            now=tx.now,
            repair_id=tx.repair.id,
        )
        tx.progress(acceptance_id=run.id)
        tx.repair.detail = f"re-acceptance {run.id}: the node-level suite runs"
        tx.repair.updated_at = tx.now
        tx.step_event(tx.repair.detail, {"acceptance_run_id": run.id})


# -- back in service --------------------------------------------------------------------


async def _return_to_service(ctx: RepairContext, loaded: LoadedRepair) -> None:
    release = await release_in_scheduler(ctx.scheduler(loaded), loaded.scheduler_name)
    if not release.settled:
        await ctx.note(loaded, f"verified, but resume failed: {release.error}")
        return
    ctx.failpoints.hit("repair.verifying.after_resume")
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        verified = f"repair {tx.repair.id} verified"
        acted = parse_ts((tx.repair.progress or {}).get("acted_at")) or tx.now
        await close_findings(tx, why=verified, before=acted)
        await refresh_node_health(
            tx.session,
            node=tx.node,
            project_id=tx.project_id,
            actor=ACTOR,
            now=tx.now,
            staleness_s=ctx.staleness_s,
        )
        tx.node.state_detail = ""
        record_release(
            tx.session, node=tx.node, project_id=tx.project_id, release=release,
            actor=ACTOR, reason=verified, now=tx.now,
        )  # fmt: skip
        if release.kept_by is None:
            tx.repair.detail = "verified; back in service"
        else:  # someone else's drain (an operator, NHC) stays: the node stays out
            tx.repair.detail = (
                f"verified; the node stays drained by someone else ({release.kept_by!r})"
            )
        tx.repair_to(
            RepairStatus.SUCCEEDED,
            "verified: the node reports every GPU and no critical finding recurred",
        )
