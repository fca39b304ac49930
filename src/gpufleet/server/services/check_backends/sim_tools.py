"""The sim's check tools (``sim/check_programs.py``) wired to this server's data: what a
healthy node measures comes from the thresholds table (``checks/thresholds.toml``, the
``expected`` values), and the hosts are the sim world's machines with their faults.

The sim sits below ``checks`` in the layers, so it cannot read the thresholds itself;
this module, above both, hands them in.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gpufleet.checks.thresholds import ThresholdTable, get_thresholds
from gpufleet.sim.check_programs import CheckExpectations, ProgramResult, SimHost, Toolbox
from gpufleet.sim.models import SimInstance
from gpufleet.sim.programs import PROGRAMS, ProgramContext, ProgramRegistry
from gpufleet.sim.world import SimWorld

SIM_FABRIC = "NDR"  # the sim models 8 × NDR 400 Gb/s per node
TOOLS = ("dcgmi", "all_reduce_perf", "mpirun", "ib_write_bw", "gpu_burn")


def expectations_from(table: ThresholdTable | None = None) -> CheckExpectations:
    t = table or get_thresholds()
    fabric = t.fabrics[SIM_FABRIC]
    return CheckExpectations(
        nccl_single_node_busbw={
            model: limits.nccl_all_reduce_single_node.expected or 0.0
            for model, limits in t.gpu_models.items()
        },
        nccl_multi_node_busbw=fabric.nccl_all_reduce_multi_node.expected or 0.0,
        ib_bw_gbits=fabric.ib_write_bw.expected or fabric.line_rate_gbits * 0.97,
        ib_line_rate_gbits=fabric.line_rate_gbits,
        nics_per_node=fabric.nics_per_node,
    )


def sim_host(world: SimWorld, *, cluster_id: str, ref: str) -> SimHost | None:
    """The running machine of ``cluster_id`` whose node name or hostname is ``ref``."""
    for inst in world.list_instances(cluster_id=cluster_id):
        if ref in (inst.node_name, inst.hostname):
            return SimHost(
                name=inst.node_name,
                hostname=inst.hostname,
                gpu_model=inst.gpu_model,
                gpu_count=inst.gpu_count,
                faults=tuple(world.faults_of(inst.instance_id)),
                serials=tuple(g.serial for g in inst.gpus),
            )
    return None


def toolbox_for(
    world: SimWorld,
    *,
    cluster_id: str,
    rng: random.Random | None = None,
    expectations: CheckExpectations | None = None,
) -> Toolbox:
    """The tools as one cluster's simulated nodes run them."""
    return Toolbox(
        expectations=expectations or expectations_from(),
        resolve=lambda ref: sim_host(world, cluster_id=cluster_id, ref=ref),
        rng=rng or random.Random(),  # noqa: S311 - simulated noise, not security
    )


def register_check_programs(
    registry: ProgramRegistry | None = None, *, expectations: CheckExpectations | None = None
) -> None:
    """Make simulated nodes run the check tools (``sim/programs.py``'s registry; every
    ``SimFleetRunner`` uses ``PROGRAMS`` unless given its own). Idempotent."""
    program = _program(expectations or expectations_from())
    for name in TOOLS:
        (registry or PROGRAMS).register(name, program)


def _program(expectations: CheckExpectations) -> Callable[[ProgramContext], ProgramResult]:
    def run(ctx: ProgramContext) -> ProgramResult:
        def host(inst: SimInstance) -> SimHost:
            return SimHost(
                name=inst.node_name,
                hostname=inst.hostname,
                gpu_model=inst.gpu_model,
                gpu_count=inst.gpu_count,
                faults=ctx.faults_of(inst),
                serials=tuple(g.serial for g in inst.gpus),
            )

        def resolve(ref: str) -> SimHost | None:
            inst = ctx.peer(ref)
            return None if inst is None else host(inst)

        # Seeded by the command: a resend of the same command prints the same figures.
        rng = random.Random(ctx.command_id)  # noqa: S311 - simulated noise, not security
        return Toolbox(expectations, resolve, rng).run(list(ctx.argv), host=host(ctx.instance))

    return run
