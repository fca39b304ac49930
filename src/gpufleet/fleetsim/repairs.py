"""gpufleet's side of the simulation: findings into ``ClusterFacts``, the real ``plan()``,
and its decisions applied as the server's repair planner applies them. What happens after
a proposal (approval, the breaker, the action, re-acceptance) is ``executor.py``.

One deliberate shortcut, for speed: ``ClusterFacts.nodes`` holds only the nodes with an
open finding or an open repair (with their closed findings, and every repair within the
policy's windows). A node with neither never yields a decision, so ``plan()`` decides the
same (tests/fleetsim compare it with every node passed); the breaker, computed outside
``plan()`` as the server does, counts the whole fleet.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from functools import partial

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus, Severity
from gpufleet.core.repair.models import (
    ACTIVE_STATUSES,
    NODE_ACTIONS,
    OPEN_STATUSES,
    ClusterFacts,
    Decision,
    FindingFact,
    Hold,
    NodeFact,
    PolicyConfig,
    Propose,
    ProposeIncident,
    RepairFact,
    RepairKind,
    Resolve,
    Supersede,
    Update,
)
from gpufleet.core.repair.policy import plan
from gpufleet.fleetsim.executor import RepairExecutor
from gpufleet.fleetsim.model import Fix
from gpufleet.fleetsim.ports import Engine
from gpufleet.fleetsim.state import Fault, Holder, Node, Role, seconds, timestamp

# After an InfiniBand finding gpufleet runs ib_write_bw on the node (assumption, as
# MegaScale's diagnostic tests): a port that stays down fails it.
DIAGNOSTIC = "check-ib-write-bw-failed"
PRUNE_EVERY_S = 3600.0


def policy_config(sim: Engine) -> PolicyConfig:
    """The project's policy: the defaults, the chosen auto-approvals, and incidents off
    by asking for more nodes than the fleet has."""
    return PolicyConfig(
        auto_approve=sim.policy.auto_approve,
        incident_min_nodes=3 if sim.policy.incidents else len(sim.nodes) + 1,
    )


class RepairPipeline:
    def __init__(self, sim: Engine) -> None:
        self.sim = sim
        self.config = policy_config(sim)
        self.repairs: dict[str, RepairFact] = {}
        self.touched: set[int] = set()  # nodes with findings or repairs
        self.open_nodes: set[int] = set()  # nodes with an open finding
        self._pruned_at = 0.0
        self.by_id = {n.id: n for n in sim.nodes}
        self.window = max(self.config.ladder_window_s, self.config.cooldown_s)
        self.executor = RepairExecutor(self)
        self._plan_pending = False
        self._holds: set[tuple[str, dt.datetime | None]] = set()
        self._ids = 0
        # Tests set it to hand plan() every node with history, as the server does.
        self.full_facts = False

    # -- what the engine asks --------------------------------------------------------------

    def handles(self, fault: Fault) -> bool:
        """Whether gpufleet's policy makes a node repair for ``fault`` (else people fix it)."""
        if fault.fix is Fix.SWITCH:
            return False
        cause = fault.draw.cause
        if cause.source == "infiniband":
            return True
        signature = self.sim.catalog.get(cause.signature_id or "")
        return signature is not None and signature.action in NODE_ACTIONS

    def active_on(self, node: Node) -> bool:
        return any(
            r.status in ACTIVE_STATUSES and (r.node_id == node.id or node.id in r.node_ids)
            for r in self.repairs.values()
        )

    def findings(self, fault: Fault, nodes: list[Node]) -> None:
        cause, pipe = fault.draw.cause, self.sim.config.pipeline
        gpu = fault.draw.gpu_index if cause.source in ("kernel-log", "nvml") else None
        for node in nodes:
            if cause.signature_id is not None:
                self.sim.at(
                    self.sim.now + pipe.detect(cause.source),
                    partial(self._finding, node, fault, cause.signature_id, gpu),
                )
            if cause.source == "infiniband":
                self.sim.at(
                    self.sim.now + pipe.detect("active-check"),
                    partial(self._finding, node, fault, DIAGNOSTIC, None),
                )

    def clear_findings(self, node: Node) -> None:
        now = timestamp(self.sim.now)
        self.open_nodes.discard(node.index)
        if not any(f.open for f in node.findings):
            return
        node.findings = [
            dataclasses.replace(f, cleared_at=now) if f.open else f for f in node.findings
        ]
        # A proposal whose findings cleared resolves itself after the TTL: look again then.
        self.sim.at(self.sim.now + self.config.ttl_s, self.plan_soon)

    def clear_quietly(self, node: Node) -> None:
        """The fault went away by itself: its findings clear after their quiet window
        (``clear.mode = "quiet"``), or at once."""
        quiet = 0.0
        for f in node.findings:
            signature = self.sim.catalog.get(f.signature_id)
            if f.open and signature is not None and signature.clear is not None:
                quiet = max(quiet, float(signature.clear.quiet_s or 0))
        self.sim.at(self.sim.now + quiet, partial(self._clear_if_healthy, node))

    def _clear_if_healthy(self, node: Node) -> None:
        if node.fault is None:
            self.clear_findings(node)
            self.plan_soon()

    def plan_soon(self) -> None:
        if not self._plan_pending:
            self._plan_pending = True
            self.sim.at(self.sim.now, self._plan)

    # -- findings and the policy -------------------------------------------------------------

    def _finding(self, node: Node, fault: Fault, signature_id: str, gpu: int | None) -> None:
        if node.fault is not fault:
            return  # cured before anyone saw it
        self.seen(node, signature_id, gpu)

    def seen(self, node: Node, signature_id: str, gpu: int | None) -> None:
        now = timestamp(self.sim.now)
        for i, f in enumerate(node.findings):
            if f.open and f.signature_id == signature_id and f.gpu_index == gpu:
                node.findings[i] = dataclasses.replace(f, last_seen=now, count=f.count + 1)
                break
        else:
            signature = self.sim.catalog.get(signature_id)
            self._ids += 1
            node.findings.append(
                FindingFact(
                    id=f"f{self._ids:06d}",
                    node_id=node.id,
                    signature_id=signature_id,
                    severity=signature.severity if signature else Severity.WARNING,
                    title=signature.title if signature else signature_id,
                    evidence="",
                    first_seen=now,
                    last_seen=now,
                    gpu_index=gpu,
                )
            )
        self.touched.add(node.index)
        self.open_nodes.add(node.index)
        self.plan_soon()

    def facts(self) -> ClusterFacts:
        """The cluster as the server's planner would load it (see the module docstring)."""
        if self.full_facts or self.sim.now - self._pruned_at >= PRUNE_EVERY_S:
            self._prune()
        with_open = {
            self.by_id[n].index
            for r in self.repairs.values()
            if r.status in OPEN_STATUSES
            for n in (r.node_id, *r.node_ids)
            if n is not None
        }
        chosen = self.touched if self.full_facts else (self.open_nodes | with_open)
        nodes: list[NodeFact] = []
        findings: list[FindingFact] = []
        for index in sorted(chosen):
            node = self.sim.nodes[index]
            nodes.append(self._node_fact(node))
            findings.extend(node.findings)
        return ClusterFacts(
            cluster_id="fleetsim",
            nodes=tuple(nodes),
            findings=tuple(findings),
            repairs=tuple(self.repairs.values()),
            breaker_tripped=self.executor.tripped,
        )

    def _prune(self) -> None:
        """Forget what the server would no longer load: repairs ended, and findings
        closed, longer ago than the policy's windows. (Between prunes a little more is
        passed; ``plan()`` filters by time itself, so it decides the same.)"""
        now = self._pruned_at = self.sim.now
        for rid in [
            rid
            for rid, r in self.repairs.items()
            if r.status not in OPEN_STATUSES
            and r.finished_at is not None
            and now - seconds(r.finished_at) > self.window
        ]:
            del self.repairs[rid]
        named = {f for r in self.repairs.values() for f in r.finding_ids}
        with_repairs = {n for r in self.repairs.values() for n in (r.node_id, *r.node_ids)}
        for index in sorted(self.touched):
            node = self.sim.nodes[index]
            node.findings = [
                f
                for f in node.findings
                if f.cleared_at is None
                or f.id in named
                or now - seconds(f.cleared_at) <= self.config.ladder_window_s
            ]
            if not node.findings and node.id not in with_repairs:
                self.touched.discard(index)

    def _node_fact(self, node: Node) -> NodeFact:
        if node.holder is Holder.SERVICE:
            state = NodeState.REMOVED
        elif node.role is Role.OUT and node.holder is Holder.GPUFLEET:
            state = NodeState.CORDONED
        else:
            state = NodeState.IN_SERVICE
        return NodeFact(
            id=node.id, name=node.id, state=state, host=node.host, leaf_switch=node.leaf
        )

    def _plan(self) -> None:
        self._plan_pending = False
        self.sim.counts.plan_calls += 1
        now = timestamp(self.sim.now)
        for decision in plan(self.facts(), self.config, now=now, catalog=self.sim.catalog):
            self._apply(decision, now)

    def _apply(self, decision: Decision, now: dt.datetime) -> None:
        if isinstance(decision, Propose):
            node = self.by_id[decision.node_id]
            rid = self._store_new(
                kind=RepairKind.NODE,
                action=decision.action,
                signature_id=decision.signature_id,
                finding_ids=decision.finding_ids,
                node_id=node.id,
                host=node.host,
            )
            if decision.auto_approve:
                self.executor.approve(rid)
            else:
                self.executor.ask(rid)
        elif isinstance(decision, ProposeIncident):
            rid = self._store_new(
                kind=RepairKind.INCIDENT,
                action=RepairAction.NONE,  # an infrastructure fix, done by people
                signature_id=decision.signature_id,
                finding_ids=decision.finding_ids,
                incident_key=decision.incident_key,
                node_ids=decision.node_ids,
            )
            self.sim.counts.incidents += 1
            self.executor.ask(rid)
        elif isinstance(decision, Update):
            old = self.repairs.get(decision.repair_id)
            if old is None or old.status is not RepairStatus.PROPOSED:
                return
            self.repairs[old.id] = dataclasses.replace(
                old,
                action=decision.action,
                signature_id=decision.signature_id,
                finding_ids=decision.finding_ids,
                node_ids=decision.node_ids or old.node_ids,
                updated_at=now,
            )
            if decision.auto_approve:
                self.executor.approve(old.id)
        elif isinstance(decision, Resolve | Supersede):
            old = self.repairs.get(decision.repair_id)
            if old is None or old.status is not RepairStatus.PROPOSED:
                return
            status = (
                RepairStatus.RESOLVED if isinstance(decision, Resolve) else RepairStatus.SUPERSEDED
            )
            self.set_status(old.id, status, ended=True)
        elif isinstance(decision, Hold):
            key = (decision.node_id, decision.until)
            if decision.until is not None and key not in self._holds:
                self._holds.add(key)
                self.sim.at(seconds(decision.until), self.plan_soon)

    def _store_new(
        self,
        *,
        kind: RepairKind,
        action: RepairAction,
        signature_id: str,
        finding_ids: tuple[str, ...],
        node_id: str | None = None,
        host: str | None = None,
        incident_key: str | None = None,
        node_ids: tuple[str, ...] = (),
    ) -> str:
        self._ids += 1
        rid = f"r{self._ids:06d}"
        now = timestamp(self.sim.now)
        self.repairs[rid] = RepairFact(
            id=rid,
            kind=kind,
            action=action,
            status=RepairStatus.PROPOSED,
            signature_id=signature_id,
            created_at=now,
            updated_at=now,
            node_id=node_id,
            host=host,
            finding_ids=finding_ids,
            incident_key=incident_key,
            node_ids=node_ids,
        )
        return rid

    def set_status(self, rid: str, status: RepairStatus, *, ended: bool = False) -> RepairFact:
        now = timestamp(self.sim.now)
        repair = dataclasses.replace(
            self.repairs[rid], status=status, updated_at=now, finished_at=now if ended else None
        )
        self.repairs[rid] = repair
        return repair
