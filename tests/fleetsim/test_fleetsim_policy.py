"""The fleet simulator's gpufleet rows: the real plan() and breaker decide what happens."""

from __future__ import annotations

from gpufleet.core.enums import RepairAction
from gpufleet.core.repair.models import AutoApproveRule
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.models import Catalog
from gpufleet.fleetsim.faults import FaultDraw, Schedule
from gpufleet.fleetsim.model import (
    AUTO_RULES,
    Cause,
    Fix,
    FleetConfig,
    JobEffect,
    JobProfile,
    Mode,
    Pipeline,
    PolicySpec,
)
from gpufleet.fleetsim.repairs import DIAGNOSTIC
from gpufleet.fleetsim.report import simulate

JOB = JobProfile("test", checkpoint_s=600.0, restart_s=300.0, crash_notice_s=60.0, watchdog_s=600.0)
APPROVE = PolicySpec("approve", Mode.GPUFLEET)
AUTO = PolicySpec("auto", Mode.GPUFLEET, auto_approve=AUTO_RULES)
SWITCH_CAUSE = Cause(
    "Network Switch/Cable", 1, "ib-link-down", JobEffect.HANG, ((Fix.CABLE, 1.0),),
    source="infiniband", topology_share=1.0,
)  # fmt: skip


def fleet(*, gpus: int = 16, spare_share: float = 0.5, leaf_nodes: int = 16) -> FleetConfig:
    return FleetConfig(
        gpus=gpus,
        days=1.0,
        spare_share=spare_share,
        leaf_nodes=leaf_nodes,
        rate_per_gpu_day=0.0,
        planned_per_day=0.0,
        job=JOB,
        pipeline=Pipeline(),
    )


def draw(cause: Cause, fix: Fix, *, switch: bool = False, catches: bool = True) -> FaultDraw:
    return FaultDraw(
        at=1000.0, slot=0, cause=cause, fix=fix, switch=switch, gpu_index=2,
        recur_s=3600.0, verify_catches=catches,
    )  # fmt: skip


def once(cause: Cause, fix: Fix, **kwargs: bool) -> Schedule:
    return Schedule(faults=(draw(cause, fix, **kwargs),), planned=())


def test_auto_approved_reboot_drains_before_the_watchdog() -> None:
    # Xid 79 hangs the job; the agent's finding (5 s) gets a reboot proposal from plan(),
    # auto-approved: the drain tells the job at 1005 s, not at its 600 s watchdog.
    cause = Cause("GPU", 1, "xid-79", JobEffect.HANG, ((Fix.REBOOT, 1.0),))
    result = simulate(fleet(), AUTO, seed=1, schedule=once(cause, Fix.REBOOT))
    assert result.ttr_s == (5.0 + 300.0,)
    assert result.repairs_by_action == {"reboot": 1}
    assert result.human_actions == 0
    assert (result.not_needed, result.insufficient) == (0, 0)


def test_a_person_approves_the_same_reboot_without_auto_approval() -> None:
    cause = Cause("GPU", 1, "xid-79", JobEffect.HANG, ((Fix.REBOOT, 1.0),))
    result = simulate(fleet(), APPROVE, seed=1, schedule=once(cause, Fix.REBOOT))
    assert result.repairs_by_action == {"reboot": 1}
    assert result.human_actions == 1


def test_plan_decides_a_workload_signature_gets_no_repair() -> None:
    # The node really is broken, but xid-31's catalog action is restart_workload: plan()
    # proposes nothing, so people fix it.
    cause = Cause("GPU", 1, "xid-31", JobEffect.CRASH, ((Fix.REBOOT, 1.0),))
    result = simulate(fleet(), AUTO, seed=1, schedule=once(cause, Fix.REBOOT))
    assert result.repairs_by_action == {}
    assert result.human_fixes == 1


def _catalog_without_xid79_action() -> Catalog:
    catalog = get_catalog()
    signatures = tuple(
        s.model_copy(update={"action": RepairAction.NONE, "escalation": None})
        if s.id == "xid-79"
        else s
        for s in catalog.signatures
    )
    return Catalog(
        version=catalog.version,
        group_window_s=catalog.group_window_s,
        patterns=catalog.patterns,
        signatures=signatures,
    )


def test_the_catalog_given_to_plan_is_what_decides() -> None:
    cause = Cause("GPU", 1, "xid-79", JobEffect.HANG, ((Fix.REBOOT, 1.0),))
    schedule = once(cause, Fix.REBOOT)
    packaged = simulate(fleet(), AUTO, seed=1, schedule=schedule)
    observe = simulate(
        fleet(), AUTO, seed=1, schedule=schedule, catalog=_catalog_without_xid79_action()
    )
    assert packaged.repairs_by_action == {"reboot": 1}
    assert observe.repairs_by_action == {}
    assert observe.ttr_s == (600.0 + 300.0,)  # back to the watchdog


def test_a_reset_that_does_not_help_climbs_to_a_stronger_action() -> None:
    # xid-119 asks for reset_gpu; the GPU needs a reboot. Re-acceptance sees the fault
    # again, the repair fails and the catalog's repeat escalation (2 within 1 day) or the
    # ladder takes the next proposal to reboot, which cures it.
    cause = Cause("GPU", 1, "xid-119", JobEffect.CRASH, ((Fix.REBOOT, 1.0),))
    result = simulate(fleet(), AUTO, seed=1, schedule=once(cause, Fix.REBOOT))
    assert result.repairs_by_action == {"reset_gpu": 1, "reboot": 1}
    assert result.insufficient == 1


def test_a_missed_fault_comes_back_in_service_and_stops_the_job_again() -> None:
    cause = Cause("GPU", 1, "xid-119", JobEffect.CRASH, ((Fix.REBOOT, 1.0),))
    config = fleet(spare_share=0.0)  # the repaired node goes straight back into the job
    result = simulate(config, AUTO, seed=1, schedule=once(cause, Fix.REBOOT, catches=False))
    assert result.recurrences == 1
    assert result.interruptions == 2
    assert result.repairs_by_action == {"reset_gpu": 1, "reboot": 1}


def test_a_dead_leaf_is_one_incident_with_incidents_on() -> None:
    # 48 job nodes + 3 spares, 4 behind each leaf: the switch behind node 0 takes 4 of
    # the job's nodes, one more than there are spares, so the job waits for the switch.
    # Each node fails gpufleet's ib_write_bw check (a reboot on its own).
    config = fleet(gpus=384, spare_share=0.05, leaf_nodes=4)
    schedule = once(SWITCH_CAUSE, Fix.SWITCH, switch=True)
    on = simulate(config, APPROVE, seed=1, schedule=schedule)
    off_policy = PolicySpec("off", Mode.GPUFLEET, incidents=False)
    off = simulate(config, off_policy, seed=1, schedule=schedule)
    assert on.incidents == 1
    assert on.repairs_by_action == {}
    assert (on.not_needed, on.breaker_trips) == (0, 0)
    assert off.incidents == 0
    assert off.repairs_by_action.get("reboot", 0) == 4
    assert off.not_needed >= 4  # rebooting nodes for their switch
    assert off.breaker_trips == 0
    assert on.effective > off.effective  # people are sent to the switch at once


def test_the_breaker_holds_a_burst_of_auto_approved_repairs() -> None:
    config = fleet(gpus=64, spare_share=0.25, leaf_nodes=4)  # 10 nodes: 10% is one
    schedule = once(SWITCH_CAUSE, Fix.SWITCH, switch=True)
    rule = (AutoApproveRule(DIAGNOSTIC, RepairAction.REBOOT),)
    no_incidents = PolicySpec("auto", Mode.GPUFLEET, auto_approve=rule, incidents=False)
    tripped = simulate(config, no_incidents, seed=1, schedule=schedule)
    with_incidents = PolicySpec("auto+incidents", Mode.GPUFLEET, auto_approve=rule)
    calm = simulate(config, with_incidents, seed=1, schedule=schedule)
    assert tripped.breaker_trips >= 1
    assert tripped.human_actions >= 1  # a person reset it
    assert calm.breaker_trips == 0
    assert calm.incidents == 1


def test_passing_only_nodes_with_open_work_decides_as_passing_them_all() -> None:
    config = FleetConfig(
        gpus=128, days=6.0, spare_share=0.2, leaf_nodes=4, rate_per_gpu_day=0.03, job=JOB
    )
    for policy in (AUTO, PolicySpec("off", Mode.GPUFLEET, AUTO_RULES, incidents=False)):
        quick = simulate(config, policy, seed=11)
        full = simulate(config, policy, seed=11, full_facts=True)
        assert sum(quick.repairs_by_action.values()) > 5
        assert quick == full


def test_incidents_off_changes_nothing_when_nothing_fails_together() -> None:
    # Same failures, same people's delays (drawn from what they are asked and when):
    # without a leaf failing, the two policies decide alike.
    config = FleetConfig(gpus=256, days=5.0, spare_share=0.1, rate_per_gpu_day=0.02, job=JOB)
    on = simulate(config, APPROVE, seed=2)
    off = simulate(config, PolicySpec("approve", Mode.GPUFLEET, incidents=False), seed=2)
    assert sum(on.repairs_by_action.values()) > 5
    assert on == off


def test_host_maintenance_over_before_approval_resolves_itself() -> None:
    # slurm-not-responding proposes a reboot; the host is back after 30 min. A person who
    # takes ~10 h finds the proposal already resolved (findings cleared, TTL 5 min); one
    # who takes seconds reboots a host that only needed to wait.
    cause = Cause(
        "Host Maintenance", 1, "slurm-not-responding", JobEffect.CRASH, ((Fix.SELF, 1.0),),
        source="scheduler",
    )  # fmt: skip
    schedule = once(cause, Fix.SELF)
    slow = FleetConfig(
        gpus=16, days=1.0, spare_share=0.5, rate_per_gpu_day=0.0, planned_per_day=0.0,
        job=JOB, pipeline=Pipeline(approval_s=10 * 3600.0),
    )  # fmt: skip
    quick = FleetConfig(
        gpus=16, days=1.0, spare_share=0.5, rate_per_gpu_day=0.0, planned_per_day=0.0,
        job=JOB, pipeline=Pipeline(approval_s=1.0),
    )  # fmt: skip
    waited = simulate(slow, APPROVE, seed=1, schedule=schedule)
    hurried = simulate(quick, APPROVE, seed=1, schedule=schedule)
    assert waited.repairs_by_action == {}
    assert (waited.not_needed, waited.human_actions) == (0, 0)
    assert hurried.repairs_by_action.get("reboot") == 1
    assert hurried.not_needed >= 1
