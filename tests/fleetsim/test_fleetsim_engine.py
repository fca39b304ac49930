"""The fleet simulator's job and people model, on cases small enough to check by hand."""

from __future__ import annotations

import pytest

from gpufleet.fleetsim.faults import FaultDraw, Schedule, draw_schedule
from gpufleet.fleetsim.model import (
    DAY,
    DEFAULT_POLICIES,
    Cause,
    Fix,
    FleetConfig,
    JobEffect,
    JobProfile,
    Mode,
    Pipeline,
    PolicySpec,
)
from gpufleet.fleetsim.report import compare, simulate

JOB = JobProfile("test", checkpoint_s=600.0, restart_s=300.0, crash_notice_s=60.0, watchdog_s=600.0)
JOB_AUTO = PolicySpec("job-auto", Mode.JOB_AUTO)
MANUAL = PolicySpec("manual", Mode.MANUAL)


def small(*, spare_share: float = 0.5, pipeline: Pipeline | None = None) -> FleetConfig:
    """2 job nodes (16 GPUs) and 1 hot spare, one day, no background failures."""
    return FleetConfig(
        gpus=16,
        days=1.0,
        spare_share=spare_share,
        rate_per_gpu_day=0.0,
        planned_per_day=0.0,
        job=JOB,
        pipeline=pipeline or Pipeline(),
    )


def one_fault(cause: Cause, *, fix: Fix, at: float = 1000.0) -> Schedule:
    draw = FaultDraw(
        at=at, slot=0, cause=cause, fix=fix, switch=False, gpu_index=3,
        recur_s=3600.0, verify_catches=True,
    )  # fmt: skip
    return Schedule(faults=(draw,), planned=())


def gpu_h(seconds: float, gpus: int = 16) -> float:
    return seconds * gpus / 3600.0


def test_no_failures_means_all_training_time() -> None:
    config = small()
    for result in compare(config, DEFAULT_POLICIES, seed=7):
        assert result.effective == 1.0
        assert result.interruptions == 0
        assert result.lost_total_gpu_h == 0.0
        assert result.repairs == 0


def test_one_crash_costs_rollback_notice_and_restart() -> None:
    # Fault at 1000 s: 1000 % 600 = 400 s of work since the checkpoint is lost; the job
    # notices at 1060 (crash), excludes the host, takes the spare and trains at 1360.
    cause = Cause("GPU", 1, "xid-119", JobEffect.CRASH, ((Fix.HARDWARE, 1.0),))
    result = simulate(small(), JOB_AUTO, seed=1, schedule=one_fault(cause, fix=Fix.HARDWARE))
    assert result.interruptions == 1
    assert result.ttr_s == (360.0,)
    assert result.lost_gpu_h == {"GPU": pytest.approx(gpu_h(400 + 60 + 300))}
    assert result.effective == pytest.approx((DAY - 760) / DAY)
    assert result.human_fixes == 0  # the node is still in repair (3 days) at the end


def test_a_hang_waits_for_the_watchdog() -> None:
    cause = Cause("GPU", 1, "xid-79", JobEffect.HANG, ((Fix.HARDWARE, 1.0),))
    result = simulate(small(), JOB_AUTO, seed=1, schedule=one_fault(cause, fix=Fix.HARDWARE))
    assert result.ttr_s == (900.0,)  # 600 s watchdog + 300 s restart
    assert result.lost_total_gpu_h == pytest.approx(gpu_h(400 + 900))


def test_without_automation_a_person_finds_the_node_first() -> None:
    cause = Cause("GPU", 1, "xid-119", JobEffect.CRASH, ((Fix.HARDWARE, 1.0),))
    pipeline = Pipeline(triage_s=1800.0)
    result = simulate(
        small(pipeline=pipeline), MANUAL, seed=1, schedule=one_fault(cause, fix=Fix.HARDWARE)
    )
    assert result.ttr_s == (60.0 + 1800.0 + 300.0,)


def test_a_software_fault_needs_no_node_out() -> None:
    # No spare at all: the job can only restart because nothing has to leave it.
    cause = Cause("Software Bug", 1, "xid-31", JobEffect.CRASH, ((Fix.NONE, 1.0),))
    config = small(spare_share=0.0)
    result = simulate(config, JOB_AUTO, seed=1, schedule=one_fault(cause, fix=Fix.NONE))
    assert result.ttr_s == (360.0,)
    assert result.human_fixes == 0


def test_without_a_spare_the_job_waits_for_the_fix() -> None:
    cause = Cause("GPU", 1, "xid-119", JobEffect.CRASH, ((Fix.RESET_GPU, 1.0),))
    pipeline = Pipeline(human_fix_s={**Pipeline().human_fix_s, Fix.RESET_GPU: 7200.0})
    config = small(spare_share=0.0, pipeline=pipeline)
    result = simulate(config, JOB_AUTO, seed=1, schedule=one_fault(cause, fix=Fix.RESET_GPU))
    assert result.ttr_s == (60.0 + 7200.0 + 300.0,)
    assert result.human_fixes == 1


def test_a_planned_stop_costs_the_restart_only() -> None:
    result = simulate(small(), JOB_AUTO, seed=1, schedule=Schedule(faults=(), planned=(5000.0,)))
    assert result.ttr_s == (300.0,)
    assert result.lost_total_gpu_h == pytest.approx(gpu_h(300))


def test_same_seed_same_table_and_another_seed_another() -> None:
    config = FleetConfig(gpus=256, days=4.0, spare_share=0.1, rate_per_gpu_day=0.02, job=JOB)
    first = compare(config, DEFAULT_POLICIES, seed=3)
    again = compare(config, DEFAULT_POLICIES, seed=3)
    other = compare(config, DEFAULT_POLICIES, seed=4)
    assert first == again
    assert [r.effective for r in first] != [r.effective for r in other]
    assert draw_schedule(config, seed=3) == draw_schedule(config, seed=3)


def test_every_second_is_training_or_charged_to_a_cause() -> None:
    config = FleetConfig(gpus=256, days=10.0, spare_share=0.1, rate_per_gpu_day=0.02, job=JOB)
    for result in compare(config, DEFAULT_POLICIES, seed=5):
        total = config.gpus * config.days * 24
        assert result.interruptions > 10
        assert result.effective * total + result.lost_total_gpu_h == pytest.approx(total)
