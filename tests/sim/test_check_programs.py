"""The sim's check tools print the real tools' formats (the parsers read them as they read
the recorded outputs), and their figures follow the faults injected into the world."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpufleet.checks.evaluate import check_output
from gpufleet.checks.models import CheckContext, CheckKind, Outcome
from gpufleet.checks.result import CheckResult
from gpufleet.checks.thresholds import get_thresholds
from gpufleet.server.services.check_backends.sim_tools import (
    TOOLS,
    expectations_from,
    register_check_programs,
    sim_host,
    toolbox_for,
)
from gpufleet.sim.check_programs import SimHost, Toolbox
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.programs import ProgramContext, ProgramRegistry
from gpufleet.sim.world import SimWorld

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"
H100 = "NVIDIA H100 80GB HBM3"
CLUSTER = "c-1"
ALL_REDUCE = ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"]


def boot(world: SimWorld, count: int = 4) -> list[str]:
    names = [f"gpu-{i:03d}" for i in range(count)]
    for name in names:
        world.provision(
            SimInstanceSpec(
                client_token=name, cluster_id=CLUSTER, node_name=name, gpu_model=H100, gpu_count=8
            ),
            plan=BootPlan(delay_range_s=(0.0, 0.0)),
        )
    world.advance()
    return names


def host(world: SimWorld, name: str) -> SimHost:
    found = sim_host(world, cluster_id=CLUSTER, ref=name)
    assert found is not None
    return found


def judge(kind: CheckKind, text: str, **ctx: object) -> CheckResult:
    return check_output(kind, text, context=CheckContext(**ctx))  # type: ignore[arg-type]


def instance(world: SimWorld, name: str) -> str:
    return next(
        i.instance_id for i in world.list_instances(cluster_id=CLUSTER) if i.node_name == name
    )


def test_healthy_outputs_parse_like_the_recorded_ones_and_pass(world: SimWorld) -> None:
    names = boot(world)
    tools = toolbox_for(world, cluster_id=CLUSTER, rng=random.Random(1))
    h = host(world, names[0])
    dcgm = tools.run(["dcgmi", "diag", "-r", "3", "-j"], host=h)
    result = judge(CheckKind.DCGM_DIAG, dcgm.stdout, node=h.name, expected_gpus=8)
    assert result.passed and dcgm.exit_code == 0
    assert result.verdict.figures["gpus"] == 8 and result.verdict.figures["tests"] == 8
    nccl = tools.run(ALL_REDUCE, host=h)
    first = (FIXTURES / "nccl-allreduce-h100-8gpu-reference.txt").read_text().splitlines()[0]
    assert nccl.stdout.splitlines()[0].split("minBytes")[0] == first.split("minBytes")[0]
    result = judge(CheckKind.NCCL, nccl.stdout, node=h.name, gpu_model="H100", expected_gpus=8)
    assert result.verdict.outcome is Outcome.PASS, result.verdict.reasons
    busbw = result.verdict.figures["busbw_large"]
    assert isinstance(busbw, float) and abs(busbw - 470.0) <= 0.031 * 470.0
    ib = tools.run(
        ["ib_write_bw", "-d", "mlx5_4", "--report_gbits", "-a", "-F", "-p", "18519", names[1]],
        host=h,
    )
    result = judge(CheckKind.IB_WRITE_BW, ib.stdout, node=h.name, fabric="NDR")
    assert result.verdict.outcome is Outcome.PASS
    assert result.verdict.figures["msg_bytes"] == 8388608
    assert result.verdict.figures["device"] == "mlx5_4"
    burn = tools.run(["gpu_burn", "-d", "60"], host=h)
    result = judge(CheckKind.GPU_BURN, burn.stdout, node=h.name, gpu_model="H100", expected_gpus=8)
    assert result.verdict.outcome is Outcome.PASS, result.verdict.reasons
    multi = tools.run(
        [
            "mpirun",
            "-np",
            "32",
            "-H",
            ",".join(f"{n}:8" for n in names),
            "all_reduce_perf",
            "-b",
            "8",
            "-e",
            "8G",
            "-f",
            "2",
            "-g",
            "1",
        ],
        host=h,
    )
    result = judge(CheckKind.NCCL, multi.stdout, fabric="NDR", expected_nodes=4, expected_gpus=8)
    assert result.verdict.outcome is Outcome.PASS and result.verdict.figures["nodes"] == 4


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_an_ecc_fault_fails_dcgm_on_that_gpu(world: SimWorld, level: int) -> None:
    names = boot(world, 1)
    world.inject_fault(instance(world, names[0]), signature_id="ecc-dbe", gpu_index=6)
    tools = toolbox_for(world, cluster_id=CLUSTER)
    out = tools.run(["dcgmi", "diag", "-r", str(level), "-j"], host=host(world, names[0]))
    result = judge(CheckKind.DCGM_DIAG, out.stdout, node=names[0], expected_gpus=8)
    assert out.exit_code != 0 and not result.passed
    [node] = result.verdict.nodes
    assert [g.index for g in node.gpus if g.outcome is Outcome.FAIL] == [6]
    if level >= 2:
        assert "memory" in str(result.verdict.figures["failed_tests"] or "")


def test_a_degraded_nvlink_slows_the_node_and_every_ring_through_it(world: SimWorld) -> None:
    names = boot(world)
    world.inject_fault(instance(world, names[2]), signature_id="nvlink-down", gpu_index=3)
    tools = toolbox_for(world, cluster_id=CLUSTER, rng=random.Random(5))
    limit = get_thresholds().nccl_single_node(H100).fail_below
    for name in names:
        out = tools.run(ALL_REDUCE, host=host(world, name))
        result = judge(CheckKind.NCCL, out.stdout, node=name, gpu_model="H100", expected_gpus=8)
        busbw = result.verdict.figures["busbw_large"]
        assert isinstance(busbw, float)
        assert (busbw < limit) == (name == names[2]), (name, busbw)

    def ring(members: list[str]) -> CheckResult:
        out = tools.run(
            [
                "mpirun",
                "-np",
                str(8 * len(members)),
                "-H",
                ",".join(f"{m}:8" for m in members),
                "all_reduce_perf",
                "-b",
                "8",
                "-e",
                "8G",
                "-f",
                "2",
                "-g",
                "1",
            ],
            host=host(world, members[0]),
        )
        return judge(CheckKind.NCCL, out.stdout, fabric="NDR", expected_nodes=len(members))

    assert not ring(names).passed
    assert not ring([names[0], names[2]]).passed
    assert ring([names[0], names[1], names[3]]).passed


def test_an_ib_fault_slows_one_hca_and_a_link_down_fails_it(world: SimWorld) -> None:
    names = boot(world, 2)
    fault = world.inject_fault(instance(world, names[1]), signature_id="ib-rate-downgrade")
    tools = toolbox_for(world, cluster_id=CLUSTER, rng=random.Random(2))
    bad_hca = host(world, names[1]).bad_hca(8)
    assert bad_hca is not None and bad_hca[1] is False
    low = []
    for i in range(8):
        out = tools.run(
            ["ib_write_bw", "-d", f"mlx5_{i}", "--report_gbits", "-a", names[1]],
            host=host(world, names[0]),
        )
        result = judge(CheckKind.IB_WRITE_BW, out.stdout, node=names[0], fabric="NDR")
        if not result.passed:
            low.append(i)
            assert result.verdict.figures["bw_avg_gbits"] == pytest.approx(200, rel=0.04)
    assert low == [bad_hca[0]]
    world.clear_fault(fault.instance_id, signature_id="ib-rate-downgrade")
    world.inject_fault(instance(world, names[1]), signature_id="ib-link-down")
    index = host(world, names[1]).bad_hca(8)
    assert index is not None and index[1] is True
    out = tools.run(
        ["ib_write_bw", "-d", f"mlx5_{index[0]}", "--report_gbits", "-a", names[1]],
        host=host(world, names[0]),
    )
    result = judge(CheckKind.IB_WRITE_BW, out.stdout + out.stderr, node=names[0], fabric="NDR")
    assert out.exit_code != 0 and not result.passed


def test_a_lost_gpu_is_missing_and_a_compute_fault_is_faulty_under_gpu_burn(
    world: SimWorld,
) -> None:
    names = boot(world, 1)
    iid = instance(world, names[0])
    world.inject_fault(iid, signature_id="xid-79", gpu_index=4)
    tools = toolbox_for(world, cluster_id=CLUSTER)
    h = host(world, names[0])
    dcgm = judge(
        CheckKind.DCGM_DIAG,
        tools.run(["dcgmi", "diag", "-r", "1", "-j"], host=h).stdout,
        node=h.name,
        expected_gpus=8,
    )
    assert not dcgm.passed and dcgm.verdict.figures["gpus"] == 7
    nccl = tools.run(ALL_REDUCE, host=h)
    assert nccl.exit_code != 0
    assert not judge(CheckKind.NCCL, nccl.stdout + nccl.stderr, node=h.name).passed
    world.clear_fault(iid, signature_id="xid-79")
    world.inject_fault(iid, signature_id="xid-119", gpu_index=1)
    burn = judge(
        CheckKind.GPU_BURN,
        tools.run(["gpu_burn", "-d", "60"], host=host(world, h.name)).stdout,
        node=h.name,
        expected_gpus=8,
    )
    assert burn.verdict.figures["faulty"] == "1"


def test_an_unknown_program_exits_127() -> None:
    tools = Toolbox(expectations_from(), lambda _ref: None)
    ran = tools.run(["nvidia-smi"], host=SimHost("n", "n", H100, 8))
    assert (ran.exit_code, ran.stdout) == (127, "")


def test_the_tools_are_registered_with_the_agents_program_registry(world: SimWorld) -> None:
    names = boot(world, 2)
    world.inject_fault(instance(world, names[1]), signature_id="ecc-dbe", gpu_index=0)
    registry = ProgramRegistry()
    register_check_programs(registry)
    assert set(TOOLS) <= set(registry.names())
    machines = {i.node_name: i for i in world.list_instances(cluster_id=CLUSTER)}

    def run(node: str, *argv: str) -> str:
        ctx = ProgramContext(
            world=world,
            instance=machines[node],
            argv=argv,
            env={},
            timeout_s=600,
            command_id="01a23a00-0000-7000-8000-000000000001",
            now=world.clock.now(),
            faults=tuple(world.faults_of(machines[node].instance_id)),
        )
        out = registry.run(ctx)
        return out.stdout

    ok = judge(CheckKind.DCGM_DIAG, run(names[0], "dcgmi", "diag", "-r", "2", "-j"), node=names[0])
    bad = judge(CheckKind.DCGM_DIAG, run(names[1], "dcgmi", "diag", "-r", "2", "-j"), node=names[1])
    assert ok.passed and not bad.passed
    hosts = ",".join(f"{machines[n].hostname}:8" for n in names)
    ring = run(
        names[0],
        "mpirun",
        "-np",
        "16",
        "-H",
        hosts,
        "all_reduce_perf",
        "-b",
        "8",
        "-e",
        "8G",
        "-f",
        "2",
        "-g",
        "1",
    )
    assert judge(CheckKind.NCCL, ring, fabric="NDR", expected_nodes=2).passed
