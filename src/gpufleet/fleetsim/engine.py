"""The discrete-event loop: faults, the synchronous training job, people, and (for the
gpufleet policies) the repair pipeline in ``repairs.py``.

One ``Simulation`` runs one policy over one fault schedule. Time is float seconds from
the start; events at the same instant run in the order they were scheduled.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from functools import partial

from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.models import Catalog
from gpufleet.fleetsim.faults import FaultDraw, Schedule
from gpufleet.fleetsim.model import DAY, Fix, FleetConfig, JobEffect, Mode, PolicySpec
from gpufleet.fleetsim.repairs import RepairPipeline
from gpufleet.fleetsim.state import Counts, Fault, Holder, Interruption, Job, Node, Role

PLANNED = "Planned maintenance"
DRAIN_NO_FAULT = "Repair drain (no fault)"


class Simulation:
    def __init__(
        self,
        config: FleetConfig,
        policy: PolicySpec,
        schedule: Schedule,
        *,
        seed: int,
        catalog: Catalog | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.schedule = schedule
        self.catalog = catalog if catalog is not None else get_catalog()
        self.seed = seed  # people's delays are drawn from it (repairs.py)
        self.horizon = config.days * DAY
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        total = config.job_nodes + config.spares
        self.nodes = [
            Node(index=i, id=f"n{i:05d}", leaf=f"leaf-{i // config.leaf_nodes:04d}")
            for i in range(total)
        ]
        self.slots: list[int] = list(range(config.job_nodes))
        for i in range(config.job_nodes):
            self.nodes[i].role, self.nodes[i].slot = Role.JOB, i
        self.spares: list[int] = list(range(config.job_nodes, total))
        self.empty_slots: list[int] = []
        self.bad_in_job: set[int] = set()  # job nodes with a fault
        self.out: set[int] = set()  # nodes out of both the job and the spares
        self.job = Job(running=True)
        self.interruptions: list[Interruption] = []
        self.counts = Counts()
        self._fault_ids = 0
        self.repairs = RepairPipeline(self) if policy.mode is Mode.GPUFLEET else None

    # -- the loop ----------------------------------------------------------------------

    def at(self, when: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(when, self.now), self._seq, fn))

    def run(self) -> None:
        for draw in self.schedule.faults:
            self.at(draw.at, partial(self._fault, draw))
        for t in self.schedule.planned:
            self.at(t, self._planned)
        while self._queue and self._queue[0][0] <= self.horizon:
            self.now, _, fn = heapq.heappop(self._queue)
            fn()
            self._try_restart()
        self.now = self.horizon
        if self.job.running:
            self.job.productive_s += self.horizon - self.job.run_start
        elif self.job.current is not None:
            self.job.current.end = self.horizon

    # -- the job -------------------------------------------------------------------------

    def interrupt(self, cause: str, effect: JobEffect | None) -> None:
        """The job stops now. ``effect`` None: a planned stop (checkpointed first)."""
        job = self.config.job
        notice = 0.0 if effect is None else (
            job.watchdog_s if effect is JobEffect.HANG else job.crash_notice_s
        )  # fmt: skip
        if self.job.running:
            ran = self.now - self.job.run_start
            lost = 0.0 if effect is None else ran % job.checkpoint_s
            self.job.productive_s += ran - lost
            self.job.running = False
            self.job.current = Interruption(cause=cause, start=self.now, rollback_s=lost)
            self.interruptions.append(self.job.current)
            self.job.notice_at = self.now + notice
        elif self.job.restart_pending:
            self.job.restart_pending = False
            self.job.token += 1
            self.job.notice_at = max(self.job.notice_at, self.now + notice)
        else:
            return
        if self.policy.mode is Mode.MANUAL and effect is not None:
            self.job.manual_ok_at = self.job.notice_at + self.config.pipeline.triage_s
            self.counts.triage += 1
            self.at(self.job.manual_ok_at, lambda: None)
        self.at(self.job.notice_at, lambda: None)  # wakes _try_restart

    def notice_drain(self) -> None:
        """gpufleet drained a failed job's node: the job hears of it now, not at its
        watchdog."""
        if not self.job.running:
            self.job.notice_at = min(self.job.notice_at, self.now)

    def _try_restart(self) -> None:
        job = self.job
        if job.running or job.restart_pending:
            return
        if self.now < job.notice_at or self.now < job.manual_ok_at:
            return
        if self.empty_slots or self.bad_in_job:
            return
        job.restart_pending = True
        job.token += 1
        token = job.token
        self.at(self.now + self.config.job.restart_s, partial(self._job_up, token))

    def _job_up(self, token: int) -> None:
        job = self.job
        if token != job.token or not job.restart_pending:
            return
        job.restart_pending = False
        if self.empty_slots or self.bad_in_job:
            return
        job.running, job.run_start = True, self.now
        if job.current is not None:
            job.current.end = self.now
            job.current = None

    def _planned(self) -> None:
        if self.job.running:
            self.interrupt(PLANNED, None)

    # -- nodes -----------------------------------------------------------------------------

    def exclude(self, node: Node, holder: Holder) -> None:
        """Take ``node`` out of the job (or of the spares) and fill its slot."""
        if node.role is Role.JOB:
            self.slots[node.slot] = -1
            self.empty_slots.append(node.slot)
            self.bad_in_job.discard(node.index)
            node.slot = -1
            if self.job.running:  # a drain of a healthy, running job's node
                self.interrupt(DRAIN_NO_FAULT, JobEffect.CRASH)
        elif node.role is Role.SPARE:
            self.spares.remove(node.index)
        node.role = Role.OUT
        self.out.add(node.index)
        if node.holder is not Holder.SERVICE:
            node.holder = holder
        self._fill()

    def release(self, node: Node) -> None:
        """A good node goes back to the spares (and maybe straight into the job)."""
        if node.role is not Role.OUT or node.fault is not None:
            return
        if self.repairs is not None and self.repairs.active_on(node):
            return
        node.role, node.holder = Role.SPARE, Holder.NONE
        self.out.discard(node.index)
        self.spares.append(node.index)
        self._fill()

    def _fill(self) -> None:
        while self.empty_slots and self.spares:
            slot = self.empty_slots.pop(0)
            node = self.nodes[self.spares.pop(0)]
            node.role, node.slot = Role.JOB, slot
            self.slots[slot] = node.index
            if node.fault is not None:
                self.bad_in_job.add(node.index)

    def set_fault(self, node: Node, fault: Fault) -> None:
        node.fault = fault
        fault.nodes.add(node.index)
        if node.role is Role.JOB:
            self.bad_in_job.add(node.index)

    def cure(self, node: Node) -> None:
        fault = node.fault
        if fault is None:
            return
        fault.nodes.discard(node.index)
        node.fault = None
        self.bad_in_job.discard(node.index)

    # -- faults ------------------------------------------------------------------------------

    def _fault(self, draw: FaultDraw) -> None:
        index = self.slots[draw.slot]
        if index < 0 or self.nodes[index].fault is not None:
            self.counts.skipped_faults += 1
            return
        first = self.nodes[index]
        self._fault_ids += 1
        fault = Fault(id=self._fault_ids, draw=draw, fix=draw.fix, nodes=set(), started=self.now)
        hit = [first]
        if draw.switch:
            hit = [n for n in self.nodes if n.leaf == first.leaf and n.fault is None]
        for node in hit:
            self.set_fault(node, fault)
        self.interrupt(draw.cause.name, draw.cause.effect)
        self.strike(fault, [n for n in hit if n.role is not Role.OUT])

    def strike(self, fault: Fault, nodes: list[Node]) -> None:
        """What follows a fault showing on ``nodes`` (new, or recurring): the job's and
        people's reaction, and gpufleet's findings."""
        draw, pipe = fault.draw, self.config.pipeline
        cause = draw.cause
        notice = self.config.job.watchdog_s if cause.effect is JobEffect.HANG else (
            self.config.job.crash_notice_s
        )  # fmt: skip
        if fault.fix is Fix.NONE:
            # A software fault: the job's restart is the cure; no node leaves.
            for node in nodes:
                self.at(self.now + notice, partial(self._software_cured, node))
        else:
            if self.policy.mode is Mode.MANUAL or not cause.identifiable:
                when, holder = self.now + notice + pipe.triage_s, Holder.HUMAN
            else:
                when, holder = self.now + notice, Holder.FRAMEWORK
            for node in nodes:
                self.at(when, partial(self._excluded, node, holder))
        if fault.fix is Fix.SELF and not fault.human_scheduled:
            fault.human_scheduled = True  # it ends by itself; nobody is needed
            self.at(fault.started + pipe.human_fix_s[Fix.SELF], partial(self._fixed, fault))
        if self.repairs is not None:
            self.repairs.findings(fault, nodes)

    def _software_cured(self, node: Node) -> None:
        self.cure(node)
        if self.repairs is not None:
            self.repairs.clear_quietly(node)

    def _excluded(self, node: Node, holder: Holder) -> None:
        fault = node.fault
        if fault is None:
            return
        if holder is Holder.HUMAN and self.policy.mode is not Mode.MANUAL:
            self.counts.triage += 1  # (manual: counted with the restart it comes with)
        if node.role is not Role.OUT:
            self.exclude(node, holder)
        if fault.human_scheduled or fault.fix in (Fix.NONE, Fix.SELF):
            return
        if self.repairs is not None and self.repairs.handles(fault):
            return
        fault.human_scheduled = True
        self.at(self.now + self.config.pipeline.human_fix_s[fault.fix], partial(self._fixed, fault))

    def human_fix_soon(self, fault: Fault, delay: float) -> None:
        """People fix ``fault`` ``delay`` from now (once named to them, e.g. an incident)."""
        self.at(self.now + delay, partial(self._fixed, fault))

    def _fixed(self, fault: Fault) -> None:
        """People (or the end of maintenance) cure ``fault`` on every node it holds."""
        if not fault.nodes:
            return
        if fault.fix is not Fix.SELF:
            self.counts.human_fixes += 1
        for index in sorted(fault.nodes):
            node = self.nodes[index]
            self.cure(node)
            if self.repairs is not None:
                self.repairs.clear_findings(node)
            self.release(node)
        if self.repairs is not None:
            self.repairs.plan_soon()
