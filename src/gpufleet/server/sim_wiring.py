"""The simulator as this server's embedded provider and scheduler (the demo default)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.core.clock import Clock
from gpufleet.providers.sim.config import SimProviderConfig
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.schedulers.sim.driver import SimScheduler
from gpufleet.server.services.check_backends.sim_tools import register_check_programs
from gpufleet.server.settings import ServerSettings
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.faults import FaultConfig
from gpufleet.sim.workload import WorkloadConfig
from gpufleet.sim.world import SimWorld

WORLD_FILE = "sim-world.json"


@dataclass
class SimBundle:
    world: SimWorld
    provider: SimProvider
    scheduler: SimScheduler
    runner: SimFleetRunner


def build_sim(settings: ServerSettings, *, clock: Clock) -> SimBundle:
    """One world per data dir; it survives restarts like a real cloud would."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    register_check_programs()  # the simulated nodes' dcgmi, all_reduce_perf, ... (docs/checks.md)
    world = SimWorld(
        settings.data_dir / WORLD_FILE,
        clock=clock,
        faults=FaultConfig(
            rate_per_gpu_day=settings.sim_fault_rate_per_gpu_day,
            sticky_share=settings.sim_sticky_share,
        ),
        workload=WorkloadConfig(
            busy_share=settings.sim_busy_share, job_minutes=settings.sim_job_minutes
        ),
    )
    provider = SimProvider(
        world,
        config=SimProviderConfig(
            provision_delay_s=settings.sim_provision_delay_s,
            reboot_delay_s=settings.sim_reboot_delay_s,
            reboot_failure_rate=settings.sim_reboot_failure_rate,
            reset_gpu_delay_s=settings.sim_reset_gpu_delay_s,
            failure_rate=settings.sim_failure_rate,
            max_instances=settings.sim_max_instances,
        ),
    )
    return SimBundle(
        world=world,
        provider=provider,
        scheduler=SimScheduler(world),
        runner=SimFleetRunner(
            world,
            report_interval_s=settings.report_interval_s,
            program_time_scale=settings.sim_program_time_scale,
        ),
    )
