"""gpufleet's repair pipeline after ``plan()``: a person's (or the policy's) approval,
the circuit breaker (``breaker_would_trip()``, as the server's approval asks it), cordon
and drain, the action, re-acceptance, and what the ground truth makes of it."""

from __future__ import annotations

import random
from functools import partial

from gpufleet.core.enums import RepairAction, RepairStatus
from gpufleet.core.repair.ladder import rank
from gpufleet.core.repair.models import ACTIVE_STATUSES, RepairKind
from gpufleet.core.repair.policy import breaker_would_trip
from gpufleet.fleetsim.model import FIX_RANK, Fix
from gpufleet.fleetsim.ports import Pipeline
from gpufleet.fleetsim.state import Fault, Holder, Node, Role, seconds

# A fault no node action can cure: nothing there, maintenance, or the switch.
NOT_THE_NODE = (Fix.SELF, Fix.SWITCH, Fix.NONE)


class RepairExecutor:
    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self.sim = pipe.sim
        self.tripped = False
        self.held: set[str] = set()  # approvals the breaker holds
        self._reset_pending = False

    def ask(self, rid: str) -> None:
        """A person approves it after a drawn delay (and approves whatever it is then).
        The delay is drawn from what is asked and when, not from the order of asking, so
        two policies that ask the same thing get the same answer time."""
        repair = self.pipe.repairs[rid]
        key = f"{repair.node_id or repair.incident_key}:{seconds(repair.created_at):.3f}"
        self.sim.at(self.sim.now + self._person_delay(key), partial(self._human_approve, rid))

    def _person_delay(self, key: str) -> float:
        rng = random.Random(f"{self.sim.seed}:{key}")  # noqa: S311 - a model, not security
        return rng.expovariate(1.0 / self.sim.config.pipeline.approval_s)

    def _human_approve(self, rid: str) -> None:
        repair = self.pipe.repairs.get(rid)
        if repair is None or repair.status is not RepairStatus.PROPOSED:
            return
        self.sim.counts.human_approvals += 1
        self.approve(rid)

    def approve(self, rid: str) -> None:
        repair = self.pipe.repairs[rid]
        if repair.status is not RepairStatus.PROPOSED:
            return
        pipe = self.sim.config.pipeline
        if repair.kind is RepairKind.INCIDENT:
            self.pipe.set_status(rid, RepairStatus.APPROVED)
            faults = {
                n.fault
                for n in (self.pipe.by_id[i] for i in repair.node_ids)
                if n.fault is not None and n.fault.fix is Fix.SWITCH
            }
            for fault in sorted(faults, key=lambda f: f.id):
                self.sim.human_fix_soon(fault, pipe.switch_swap_s)
            self.sim.at(
                self.sim.now + pipe.switch_swap_s, partial(self._incident_done, rid, bool(faults))
            )
            return
        node = self.pipe.by_id[repair.node_id or ""]
        if self.tripped or self._would_trip(node):
            self.held.add(rid)
            self._reset_later()
            return
        self.pipe.set_status(rid, RepairStatus.ACTING)
        was_in_job = node.role is Role.JOB
        if node.role is Role.OUT:
            if node.holder is not Holder.SERVICE:
                node.holder = Holder.GPUFLEET
        else:
            self.sim.exclude(node, Holder.GPUFLEET)
        if was_in_job:
            self.sim.notice_drain()
        duration = pipe.drain_s + pipe.action_s[repair.action]
        self.sim.at(self.sim.now + duration, partial(self._acted, rid))

    def _would_trip(self, node: Node) -> bool:
        """The server's check: nodes cordoned or under an active repair, this one aside."""
        active = {
            n for r in self.pipe.repairs.values() if r.status in ACTIVE_STATUSES
            for n in (r.node_id, *r.node_ids) if n is not None
        }  # fmt: skip
        cordoned = {
            n.id for n in (self.sim.nodes[i] for i in self.sim.out) if n.holder is Holder.GPUFLEET
        }
        affected = len((active | cordoned) - {node.id})
        removed = sum(1 for i in self.sim.out if self.sim.nodes[i].holder is Holder.SERVICE)
        total = len(self.sim.nodes) - removed
        if not breaker_would_trip(
            total_nodes=total, affected_nodes=affected, config=self.pipe.config
        ):
            return False
        self.tripped = True
        self.sim.counts.breaker_trips += 1
        return True

    def _reset_later(self) -> None:
        """A person resets a tripped breaker after a drawn delay, then approves the held."""
        if self._reset_pending:
            return
        self._reset_pending = True
        self.sim.at(self.sim.now + self._person_delay(f"reset:{self.sim.now:.3f}"), self._reset)

    def _reset(self) -> None:
        self._reset_pending = False
        self.tripped = False
        self.sim.counts.human_approvals += 1
        held, self.held = sorted(self.held), set()
        for rid in held:
            self.approve(rid)
        self.pipe.plan_soon()

    def _acted(self, rid: str) -> None:
        repair = self.pipe.repairs[rid]
        node = self.pipe.by_id[repair.node_id or ""]
        action, fault, counts = repair.action, node.fault, self.sim.counts
        counts.actions[action.value] += 1
        if fault is None or fault.fix in NOT_THE_NODE:
            counts.not_needed += 1
        if action is RepairAction.REMOVE:
            self.pipe.set_status(rid, RepairStatus.SUCCEEDED, ended=True)
            node.holder = Holder.SERVICE
            back = self.sim.config.pipeline.human_fix_s[Fix.HARDWARE]
            self.sim.at(self.sim.now + back, partial(self._back_from_service, node))
            self.pipe.plan_soon()
            return
        if action is RepairAction.FAILOVER:
            node.host_seq += 1  # a new machine: every fault of the old one is gone
            cured = fault is not None and fault.fix is not Fix.SWITCH
        else:
            # A soft action cures a soft fault at least as mild; hardware needs a failover.
            need = FIX_RANK.get(fault.fix) if fault is not None else None
            cured = (
                need is not None
                and need is not RepairAction.FAILOVER
                and rank(action) >= rank(need)
            )
        if fault is not None and not cured and fault.fix not in NOT_THE_NODE:
            counts.insufficient += 1
        if cured:
            self.sim.cure(node)
        self.sim.at(self.sim.now + self.sim.config.pipeline.verify_s, partial(self._verified, rid))

    def _verified(self, rid: str) -> None:
        repair = self.pipe.repairs[rid]
        node = self.pipe.by_id[repair.node_id or ""]
        fault = node.fault
        if fault is not None and (fault.fix in (Fix.SWITCH, Fix.SELF) or fault.draw.verify_catches):
            # Re-acceptance sees it again: the repair fails, the node stays cordoned, and
            # the next plan() climbs the ladder.
            self.pipe.set_status(rid, RepairStatus.FAILED, ended=True)
            self.pipe.seen(node, repair.signature_id, self._gpu_of(node, repair.signature_id))
            return
        self.pipe.set_status(rid, RepairStatus.SUCCEEDED, ended=True)
        self.pipe.clear_findings(node)
        if fault is not None:
            # Not fixed, not seen: back in service, it shows again later.
            self.sim.cure(node)
            host = node.host
            self.sim.at(self.sim.now + fault.draw.recur_s, partial(self._recur, node, fault, host))
        self.sim.release(node)
        self.pipe.plan_soon()

    def _gpu_of(self, node: Node, signature_id: str) -> int | None:
        for f in reversed(node.findings):
            if f.signature_id == signature_id:
                return f.gpu_index
        return None

    def _recur(self, node: Node, fault: Fault, host: str) -> None:
        if node.host != host or node.fault is not None:
            return  # the machine changed meanwhile, or is already down for another reason
        self.sim.counts.recurrences += 1
        self.sim.set_fault(node, fault)
        if node.role is Role.JOB:
            self.sim.interrupt(fault.cause, fault.draw.cause.effect)
        self.sim.strike(fault, [node])

    def _back_from_service(self, node: Node) -> None:
        node.host_seq += 1
        node.holder = Holder.HUMAN
        self.sim.counts.human_fixes += 1
        if node.fault is not None and node.fault.fix is not Fix.SWITCH:
            self.sim.cure(node)
        if node.fault is None:
            self.pipe.clear_findings(node)
            self.sim.release(node)
        self.pipe.plan_soon()

    def _incident_done(self, rid: str, real: bool) -> None:
        repair = self.pipe.set_status(rid, RepairStatus.SUCCEEDED, ended=True)
        if not real:
            self.sim.counts.not_needed += 1
        for node_id in repair.node_ids:
            node = self.pipe.by_id[node_id]
            if node.fault is None:
                self.sim.release(node)
        self.pipe.plan_soon()
