"""Run policies over one fault schedule and print what each cost."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.core.signatures.models import Catalog
from gpufleet.fleetsim.engine import Simulation
from gpufleet.fleetsim.faults import Schedule, draw_schedule
from gpufleet.fleetsim.model import HOUR, FleetConfig, PolicySpec


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    job: str
    gpus: int
    days: float
    effective: float  # productive training time / elapsed time
    lost_gpu_h: dict[str, float]  # by cause: (downtime + work rolled back) × the job's GPUs
    interruptions: int
    ttr_s: tuple[float, ...]  # per interruption: the job stopped → training again
    repairs_by_action: dict[str, int]  # gpufleet's node repairs carried out
    human_fixes: int  # nodes, switches and cables people fixed by hand
    human_actions: int  # those, plus approvals, breaker resets and manual triage
    not_needed: int  # repairs of a node that had nothing a node action could fix
    insufficient: int  # repairs whose action was too weak for the node's fault
    incidents: int
    breaker_trips: int
    recurrences: int  # faults back in service after a repair that did not fix them
    plan_calls: int

    @property
    def repairs(self) -> int:
        return sum(self.repairs_by_action.values()) + self.human_fixes

    @property
    def repairs_per_day(self) -> float:
        return self.repairs / self.days

    @property
    def lost_total_gpu_h(self) -> float:
        return sum(self.lost_gpu_h.values())

    def ttr_percentile(self, p: float) -> float:
        """Nearest-rank percentile of the time to recovery, seconds (0 with none)."""
        values = sorted(self.ttr_s)
        if not values:
            return 0.0
        rank = max(1, min(len(values), round(p / 100.0 * len(values) + 0.5)))
        return values[rank - 1]


def simulate(
    config: FleetConfig,
    policy: PolicySpec,
    *,
    seed: int,
    schedule: Schedule | None = None,
    catalog: Catalog | None = None,
    full_facts: bool = False,
) -> PolicyResult:
    """One policy over ``schedule`` (drawn from ``seed`` when None). ``full_facts``: hand
    ``plan()`` every node with history, as the server does (slower; see repairs.py)."""
    if schedule is None:
        schedule = draw_schedule(config, seed=seed)
    sim = Simulation(config, policy, schedule, seed=seed, catalog=catalog)
    if sim.repairs is not None:
        sim.repairs.full_facts = full_facts
    sim.run()
    lost: defaultdict[str, float] = defaultdict(float)
    ttr: list[float] = []
    for item in sim.interruptions:
        end = item.end if item.end is not None else sim.horizon
        lost[item.cause] += (end - item.start + item.rollback_s) * config.gpus / HOUR
        ttr.append(end - item.start)
    counts = sim.counts
    return PolicyResult(
        policy=policy.name,
        job=config.job.name,
        gpus=config.gpus,
        days=config.days,
        effective=sim.job.productive_s / sim.horizon if sim.horizon > 0 else 1.0,
        lost_gpu_h=dict(lost),
        interruptions=len(sim.interruptions),
        ttr_s=tuple(ttr),
        repairs_by_action=dict(counts.actions),
        human_fixes=counts.human_fixes,
        human_actions=counts.human_fixes + counts.human_approvals + counts.triage,
        not_needed=counts.not_needed,
        insufficient=counts.insufficient,
        incidents=counts.incidents,
        breaker_trips=counts.breaker_trips,
        recurrences=counts.recurrences,
        plan_calls=counts.plan_calls,
    )


def compare(
    config: FleetConfig, policies: Sequence[PolicySpec], *, seed: int
) -> list[PolicyResult]:
    """Every policy over the same fault schedule."""
    schedule = draw_schedule(config, seed=seed)
    return [simulate(config, p, seed=seed, schedule=schedule) for p in policies]


def format_table(results: Sequence[PolicyResult]) -> str:
    head = (
        f"{'policy':<32} {'ETT':>7} {'stops':>5} {'GPU-h lost':>10} {'repairs/d':>9} "
        f"{'unneeded':>8} {'too weak':>8} {'recur':>5} {'people/d':>8} "
        f"{'TTR p50':>8} {'TTR p95':>8} {'incid':>5} {'brk':>3}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.policy:<32} {r.effective:>7.2%} {r.interruptions:>5} "
            f"{r.lost_total_gpu_h:>10,.0f} {r.repairs_per_day:>9.2f} {r.not_needed:>8} "
            f"{r.insufficient:>8} {r.recurrences:>5} {r.human_actions / r.days:>8.2f} "
            f"{r.ttr_percentile(50) / 60:>6.1f} m {r.ttr_percentile(95) / 60:>6.1f} m "
            f"{r.incidents:>5} {r.breaker_trips:>3}"
        )
    return "\n".join(lines)


def format_losses(results: Sequence[PolicyResult], *, width: int = 11) -> str:
    """GPU-hours lost by cause, one column per policy (short names: the table's order)."""
    causes = sorted(
        {c for r in results for c in r.lost_gpu_h},
        key=lambda c: -max(r.lost_gpu_h.get(c, 0.0) for r in results),
    )
    head = f"{'cause':<34}" + "".join(f"{'#' + str(i + 1):>{width}}" for i in range(len(results)))
    lines = [head, "-" * len(head)]
    for cause in causes:
        cells = "".join(f"{r.lost_gpu_h.get(cause, 0.0):>{width},.0f}" for r in results)
        lines.append(f"{cause[:34]:<34}{cells}")
    total = "".join(f"{r.lost_total_gpu_h:>{width},.0f}" for r in results)
    lines.append(f"{'total':<34}{total}")
    return "\n".join(lines)
