"""The verifying step: a repaired node must prove itself before it takes work again.

It must report after the action with every GPU and no critical finding seen again, for
``verify_settle_s``, within ``verify_timeout_s``. Then gpufleet's own drain is undone
(never anyone else's) and the node is back in service; otherwise the repair fails, the
node stays cordoned and the planner recommends the next rung.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select

from gpufleet.core.enums import NodeState, RepairStatus, Severity
from gpufleet.core.errors import DriverError
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.schedulers.base import DRAIN_REASON_PREFIX, Scheduler, SupportsDrain
from gpufleet.server.db.tables import FindingRow, GpuRow
from gpufleet.server.services.agent_findings import refresh_node_health
from gpufleet.server.workers.repair_steps import LoadedRepair, StepBase, close_findings, parse_ts

_BAD = frozenset({Severity.CRITICAL.value, Severity.FATAL.value})


def still_bad(finding: FindingRow, *, acted: dt.datetime) -> bool:
    """A finding that says the repair did not work: seen again after the action, or one
    that clears by itself (metric, state) and has not (a log line from before the repair
    stays open until the repair is verified)."""
    if finding.severity not in _BAD:
        return False
    if finding.last_seen > acted:
        return True
    signature = get_signature(finding.signature_id)
    clears_on_repair = signature is not None and signature.clear is not None and (
        signature.clear.mode == "repair"
    )  # fmt: skip
    return not clears_on_repair and finding.source != "kernel-log"


async def foreign_reason(scheduler: Scheduler, name: str) -> str | None:
    """The node's drain reason when it is someone else's (not ``gpufleet:``)."""
    try:
        nodes = await scheduler.list_nodes()
    except DriverError:
        return None
    for node in nodes:
        if node.name == name and node.reason and not node.reason.startswith(DRAIN_REASON_PREFIX):
            return node.reason
    return None


class VerifyingSteps(StepBase):
    async def verify(self, loaded: LoadedRepair) -> None:
        repair, policy, node = loaded.repair, loaded.policy, loaded.node
        now = self.clock.now()
        acted = parse_ts(loaded.progress.get("acted_at")) or repair.step_started_at or now
        async with self.db.session() as session:
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
        recurred = [f for f in findings if still_bad(f, acted=acted)]
        if recurred:
            worst = recurred[0]
            await self.fail(
                loaded,
                f"verification failed: {worst.signature_id} ({worst.title}) seen again "
                f"after the {repair.action}",
            )
            return
        if (now - acted).total_seconds() > policy.verify_timeout_s:
            await self.fail(
                loaded,
                f"verification failed: the node did not report all {node.expected_gpus} GPUs "
                f"within {policy.verify_timeout_s:.0f} s of the {repair.action}",
            )
            return
        reported = node.last_report_at is not None and node.last_report_at > acted
        if not reported or fresh_gpus < node.expected_gpus:
            await self.note(
                loaded,
                f"waiting for the node to report ({fresh_gpus}/{node.expected_gpus} GPUs seen "
                "since the action)",
            )
            return
        first = parse_ts(loaded.progress.get("first_report_at"))
        if first is None:
            first = now
            if policy.verify_settle_s > 0:
                await self.note(
                    loaded,
                    f"node reports again; watching it for {policy.verify_settle_s:.0f} s",
                    first_report_at=now.isoformat(),
                )
                return
        if (now - first).total_seconds() >= policy.verify_settle_s:
            await self._return_to_service(loaded)

    async def _return_to_service(self, loaded: LoadedRepair) -> None:
        scheduler = self.scheduler(loaded)
        foreign: str | None = None
        if isinstance(scheduler, SupportsDrain):
            try:
                await scheduler.resume(loaded.scheduler_name)  # only ever gpufleet's drain
            except DriverError as exc:
                foreign = await foreign_reason(scheduler, loaded.scheduler_name)
                if foreign is None:
                    await self.note(loaded, f"verified, but resume failed: {exc.message}")
                    return
        self.failpoints.hit("repair.verifying.after_resume")
        async with self.locked(loaded) as tx:
            if tx is None:
                return
            verified = f"repair {tx.repair.id} verified"
            acted = parse_ts((tx.repair.progress or {}).get("acted_at")) or tx.now
            await close_findings(tx, why=verified, before=acted)
            await refresh_node_health(
                tx.session,
                node=tx.node,
                project_id=tx.project_id,
                now=tx.now,
                staleness_s=self.staleness_s,
            )
            if foreign is None:
                tx.node_to(NodeState.IN_SERVICE, verified)
                tx.repair.detail = "verified; back in service"
            else:  # someone else's drain (an operator, NHC) stays: the node stays out
                tx.node_to(NodeState.CORDONED, f"{verified}; kept out by {foreign!r}")
                tx.repair.detail = f"verified; the node stays drained by someone else ({foreign!r})"
            tx.repair_to(
                RepairStatus.SUCCEEDED,
                "verified: the node reports every GPU and no critical finding recurred",
            )
