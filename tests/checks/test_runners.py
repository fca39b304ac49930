"""Command lines per check (runners.py) and the judging of a run's outputs onto nodes,
GPUs and HCAs (aggregate.py), on the recorded real outputs and the sim's tools."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest

from gpufleet.checks.aggregate import InvocationOutput, NodeInfo, RunVerdict, judge_run
from gpufleet.checks.models import CheckKind
from gpufleet.checks.runners import (
    DCGM_TIMEOUT_S,
    IB_TIMEOUT_S,
    Launcher,
    NodeTarget,
    normalise_params,
    plan_check,
    stand_in,
)
from gpufleet.core.errors import InvalidInput
from gpufleet.server.services.check_backends.sim_tools import expectations_from
from gpufleet.sim.check_programs import SimHost, Toolbox
from gpufleet.sim.faults import SimFault

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"
H100 = "NVIDIA H100 80GB HBM3"
NODES = [NodeTarget(f"gpu-{i:03d}", f"gpu-{i:03d}.cluster", 8) for i in range(4)]
INFOS = [NodeInfo(id=f"id-{n.name}", name=n.name, aliases=(n.host,)) for n in NODES]


def test_dcgm_diag_is_one_dcgmi_per_node_with_the_level_and_its_timeout() -> None:
    for level in (1, 2, 3, 4):
        params = normalise_params(CheckKind.DCGM_DIAG, {"level": level}, nodes=2)
        plan = plan_check(
            CheckKind.DCGM_DIAG, nodes=NODES[:2], params=params, launcher=Launcher.MPIRUN
        )
        assert [i.argv for i in plan.invocations] == [("dcgmi", "diag", "-r", str(level), "-j")] * 2
        assert [i.node for i in plan.invocations] == ["gpu-000", "gpu-001"]
        assert plan.timeout_s == DCGM_TIMEOUT_S[level]


def test_all_reduce_per_node_uses_every_gpu_of_the_node() -> None:
    params = normalise_params(CheckKind.NCCL, {"scope": "per-node"}, nodes=2)
    plan = plan_check(CheckKind.NCCL, nodes=NODES[:2], params=params, launcher=Launcher.MPIRUN)
    assert [i.argv for i in plan.invocations] == [
        ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8")
    ] * 2


def test_multi_node_all_reduce_under_srun_and_under_mpirun() -> None:
    params = normalise_params(CheckKind.NCCL, None, nodes=4)
    assert params["scope"] == "multi-node" and params["localise"] is True
    [srun] = plan_check(
        CheckKind.NCCL, nodes=NODES, params=params, launcher=Launcher.SRUN
    ).invocations
    assert srun.argv == (
        "srun",
        "-N",
        "4",
        "-w",
        "gpu-000,gpu-001,gpu-002,gpu-003",
        "--ntasks-per-node=8",
        "--gpus-per-task=1",
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
    assert srun.nodes == tuple(n.name for n in NODES) and srun.env == {}
    [mpi] = plan_check(
        CheckKind.NCCL, nodes=NODES[:2], params=params, launcher=Launcher.MPIRUN
    ).invocations
    assert mpi.node == "gpu-000"
    assert mpi.argv[:9] == (
        "mpirun",
        "-np",
        "16",
        "-H",
        "gpu-000.cluster:8,gpu-001.cluster:8",
        "--bind-to",
        "none",
        "-x",
        "NCCL_ALGO=Ring",
    )
    assert mpi.env == {"NCCL_ALGO": "Ring"}  # 2 nodes: force the ring (§4.1 caveat)


def test_ib_write_bw_pairs_every_node_as_client_and_server_per_hca() -> None:
    params = normalise_params(CheckKind.IB_WRITE_BW, {"hcas": ["mlx5_0", "mlx5_3"]}, nodes=3)
    plan = plan_check(
        CheckKind.IB_WRITE_BW, nodes=NODES[:3], params=params, launcher=Launcher.MPIRUN
    )
    clients = [i for i in plan.invocations if i.judged]
    servers = {i.id: i for i in plan.invocations if not i.judged}
    assert len(clients) == len(servers) == 6
    pairs = {(c.hca, c.node, c.peer) for c in clients}
    assert pairs == {
        (h, f"gpu-00{i}", f"gpu-00{(i + 1) % 3}") for h in ("mlx5_0", "mlx5_3") for i in range(3)
    }
    for client in clients:
        server = servers[client.after or ""]
        assert server.node == client.peer and server.hca == client.hca
        port = "18515" if client.hca == "mlx5_0" else "18516"
        assert server.argv == (
            "ib_write_bw",
            "-d",
            client.hca,
            "--report_gbits",
            "-a",
            "-F",
            "-p",
            port,
        )
        assert client.argv == (*server.argv, f"{client.peer}.cluster")
    [srun_client] = [
        i
        for i in plan_check(
            CheckKind.IB_WRITE_BW, nodes=NODES[:1], params=params, launcher=Launcher.SRUN
        ).invocations
        if i.judged and i.hca == "mlx5_0"
    ]
    assert srun_client.argv[:8] == ("srun", "-N", "1", "-n", "1", "-w", "gpu-000", "--overlap")
    assert srun_client.peer == "gpu-000"  # one node: loopback through its own HCA


def test_gpu_burn_and_its_timeout() -> None:
    params = normalise_params(CheckKind.GPU_BURN, {"duration_s": 120}, nodes=1)
    [inv] = plan_check(
        CheckKind.GPU_BURN, nodes=NODES[:1], params=params, launcher=Launcher.MPIRUN
    ).invocations
    assert inv.argv == ("gpu_burn", "-d", "120") and inv.timeout_s == 420


def test_a_stand_in_replaces_the_tool_and_keeps_the_launcher() -> None:
    params = normalise_params(CheckKind.IB_WRITE_BW, {"hcas": ["mlx5_0"]}, nodes=2)
    plan = plan_check(CheckKind.IB_WRITE_BW, nodes=NODES[:2], params=params, launcher=Launcher.SRUN)
    client = next(i for i in plan.invocations if i.judged)
    swapped = stand_in(client, ["python3", "-c", "print({1: 2})", "{node}", "{hca}", "{peer}"])
    assert swapped.launcher == client.launcher and swapped.timeout_s == client.timeout_s
    assert swapped.program == ("python3", "-c", "print({1: 2})", "gpu-000", "mlx5_0", "gpu-001")


@pytest.mark.parametrize(
    ("kind", "raw", "field"),
    [
        (CheckKind.DCGM_DIAG, {"level": 0}, "params.level"),
        (CheckKind.DCGM_DIAG, {"level": True}, "params.level"),
        (CheckKind.DCGM_DIAG, {"hcas": ["mlx5_0"]}, "params.hcas"),
        (CheckKind.NCCL, {"scope": "everywhere"}, "params.scope"),
        (CheckKind.NCCL, {"max_bytes": "8 GiB"}, "params.max_bytes"),
        (CheckKind.NCCL, {"localise": "yes"}, "params.localise"),
        (CheckKind.IB_WRITE_BW, {"hcas": []}, "params.hcas"),
        (CheckKind.IB_WRITE_BW, {"hcas": ["mlx5_0; rm -rf /"]}, "params.hcas"),
        (CheckKind.GPU_BURN, {"duration_s": 10**6}, "params.duration_s"),
        (CheckKind.GPU_BURN, {"timeout_s": 1}, "params.timeout_s"),
        (CheckKind.GPU_BURN, {"known_good": "gpu-001"}, "params.known_good"),
    ],
)
def test_bad_parameters_name_the_field(kind: CheckKind, raw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        normalise_params(kind, raw, nodes=2)
    assert caught.value.field == field


# -- judging -------------------------------------------------------------------------


def test_recorded_outputs_fold_onto_nodes_and_gpus() -> None:
    plan = plan_check(
        CheckKind.DCGM_DIAG,
        nodes=NODES[:2],
        params=normalise_params(CheckKind.DCGM_DIAG, {"level": 1}, nodes=2),
        launcher=Launcher.MPIRUN,
    )
    good = (FIXTURES / "dcgm3-r1-8gpu-from-dcgm-test.txt").read_text()
    bad = (FIXTURES / "dcgm4-r3-gpu3-row-remap-assembled-variant.json").read_text()
    verdict = judge_run(
        plan,
        {
            "dcgm-0": InvocationOutput("dcgm-0", stdout=good, exit_code=0),
            "dcgm-1": InvocationOutput("dcgm-1", stdout=bad, exit_code=226),
        },
        nodes=INFOS,
        gpu_model=H100,
        fabric=None,
        expected_gpus=None,
    )
    nodes = verdict.result["nodes"]
    assert set(nodes) == {"id-gpu-000", "id-gpu-001"}
    assert nodes["id-gpu-000"]["outcome"] == "pass" and len(nodes["id-gpu-000"]["gpus"]) == 8
    assert nodes["id-gpu-001"]["outcome"] == "fail"
    assert nodes["id-gpu-001"]["gpus"]["3"]["outcome"] == "fail"
    assert verdict.outcome == "fail" and verdict.judged_nodes == {"id-gpu-000", "id-gpu-001"}
    blames = {(b.node_id, b.gpu_index, b.code) for b in verdict.blames}
    assert ("id-gpu-001", 3, "test-failed") in blames
    assert {b.node_id for b in verdict.blames} == {"id-gpu-001"}
    # The non-zero exit of a dcgmi that reported its failure is no second failure.
    assert not any("exited" in m for b in verdict.blames for m in b.messages)
    assert "==> dcgm-1 on gpu-001: dcgmi diag -r 1 -j (exit 226) <==" in verdict.raw_output


def test_a_plan_placed_by_scheduler_names_folds_onto_the_nodes_they_alias() -> None:
    """A bare-metal node of a Slurm cluster is its host's Slurm node (``lab-001``), not
    gpufleet's name (``metal-000``): the plan places it by the former, srun -w included,
    and the verdict lands on the node all the same."""
    slurm = [NodeTarget(f"lab-00{i + 1}", f"lab-00{i + 1}", 8) for i in range(2)]
    infos = [
        NodeInfo(id=f"id-{i}", name=f"metal-00{i}", aliases=(t.name,)) for i, t in enumerate(slurm)
    ]
    plan = plan_check(
        CheckKind.DCGM_DIAG,
        nodes=slurm,
        params=normalise_params(CheckKind.DCGM_DIAG, {"level": 1}, nodes=2),
        launcher=Launcher.SRUN,
    )
    assert [i.launcher[-2:] for i in plan.invocations] == [("lab-001", "--overlap"),
                                                           ("lab-002", "--overlap")]  # fmt: skip
    good = (FIXTURES / "dcgm3-r1-8gpu-from-dcgm-test.txt").read_text()
    verdict = judge_run(
        plan,
        {i.id: InvocationOutput(i.id, stdout=good, exit_code=0) for i in plan.invocations},
        nodes=infos,
        gpu_model=H100,
        fabric=None,
        expected_gpus=None,
    )
    nodes = verdict.result["nodes"]
    assert {k: (v["name"], v["outcome"]) for k, v in nodes.items()} == {
        "id-0": ("metal-000", "pass"),
        "id-1": ("metal-001", "pass"),
    }
    assert verdict.outcome == "pass" and verdict.judged_nodes == {"id-0", "id-1"}


@pytest.mark.parametrize(
    ("output", "code"),
    [
        (InvocationOutput("dcgm-0", error="command expired: no agent took it"), "did-not-finish"),
        (
            InvocationOutput("dcgm-0", stdout='{"DCGM Diagnostic": {"test_c', timed_out=True),
            "did-not-finish",
        ),
        (
            InvocationOutput("dcgm-0", stdout="", exit_code=127, stderr="dcgmi: not found"),
            "not-recognized",
        ),
    ],
)
def test_a_check_that_did_not_finish_is_never_a_pass(output: InvocationOutput, code: str) -> None:
    plan = plan_check(
        CheckKind.DCGM_DIAG,
        nodes=NODES[:1],
        params=normalise_params(CheckKind.DCGM_DIAG, None, nodes=1),
        launcher=Launcher.MPIRUN,
    )
    for outputs in ({"dcgm-0": output}, {}):
        verdict = judge_run(
            plan, outputs, nodes=INFOS, gpu_model=None, fabric=None, expected_gpus=8
        )
        assert verdict.outcome == "fail"
        codes = {r["code"] for r in verdict.result["nodes"]["id-gpu-000"]["reasons"]}
        assert code in codes or "did-not-finish" in codes


def test_a_clean_output_with_a_failing_exit_status_fails() -> None:
    plan = plan_check(
        CheckKind.DCGM_DIAG,
        nodes=NODES[:1],
        params=normalise_params(CheckKind.DCGM_DIAG, None, nodes=1),
        launcher=Launcher.MPIRUN,
    )
    good = (FIXTURES / "dcgm3-r1-8gpu-from-dcgm-test.txt").read_text()
    verdict = judge_run(
        plan,
        {"dcgm-0": InvocationOutput("dcgm-0", stdout=good, exit_code=137)},
        nodes=INFOS,
        gpu_model=None,
        fabric=None,
        expected_gpus=8,
    )
    assert verdict.outcome == "fail"
    assert [b.code for b in verdict.blames] == ["crashed"]


def _fault(signature: str, gpu: int | None = None, fid: str = "f-1") -> SimFault:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return SimFault(
        fault_id=fid,
        instance_id="i-1",
        signature_id=signature,
        gpu_index=gpu,
        started_at=now,
        last_seen=now,
    )


def _run_sim(kind: CheckKind, hosts: dict[str, SimHost], **params: object) -> RunVerdict:
    targets = [NodeTarget(h.name, h.hostname, h.gpu_count) for h in hosts.values()]
    plan = plan_check(
        kind,
        nodes=targets,
        params=normalise_params(kind, params, nodes=len(targets)),
        launcher=Launcher.MPIRUN,
    )
    by_ref = {k: h for h in hosts.values() for k in (h.name, h.hostname)}
    tools = Toolbox(expectations_from(), by_ref.get, random.Random(3))
    outputs = {}
    for inv in plan.invocations:
        ran = tools.run(inv.argv, host=hosts[inv.node])
        outputs[inv.id] = InvocationOutput(
            inv.id, stdout=ran.stdout, stderr=ran.stderr, exit_code=ran.exit_code
        )
    infos = [
        NodeInfo(id=f"id-{h.name}", name=h.name, aliases=(h.hostname,)) for h in hosts.values()
    ]
    return judge_run(plan, outputs, nodes=infos, gpu_model=H100, fabric="NDR", expected_gpus=8)


def test_multi_node_ring_failure_blames_nobody_a_named_host_is_blamed() -> None:
    hosts = {f"n{i}": SimHost(f"n{i}", f"n{i}.c", H100, 8) for i in range(4)}
    hosts["n2"] = SimHost("n2", "n2.c", H100, 8, faults=(_fault("nvlink-down", 1),))
    slow = _run_sim(CheckKind.NCCL, hosts)
    assert slow.outcome == "fail" and slow.blames == []
    assert {n["outcome"] for n in slow.result["nodes"].values()} == {"fail"}
    hosts["n2"] = SimHost("n2", "n2.c", H100, 8, faults=(_fault("xid-79", 6),))
    lost = _run_sim(CheckKind.NCCL, hosts)
    assert [b.node_id for b in lost.blames] == ["id-n2"]
    healthy = {f"n{i}": SimHost(f"n{i}", f"n{i}.c", H100, 8) for i in range(4)}
    ok = _run_sim(CheckKind.NCCL, healthy)
    assert ok.outcome == "pass"
    assert ok.judged_nodes == {f"id-n{i}" for i in range(4)}


def test_ib_blames_the_node_in_both_failed_pairs_or_reports_a_link() -> None:
    hosts = {f"n{i}": SimHost(f"n{i}", f"n{i}.c", H100, 8) for i in range(4)}
    hosts["n1"] = SimHost("n1", "n1.c", H100, 8, faults=(_fault("ib-rate-downgrade"),))
    verdict = _run_sim(CheckKind.IB_WRITE_BW, hosts)
    assert [b.node_id for b in verdict.blames] == ["id-n1"]
    outcomes = {n["name"]: n["outcome"] for n in verdict.result["nodes"].values()}
    assert outcomes == {"n0": "pass", "n1": "fail", "n2": "pass", "n3": "pass"}
    two = {k: hosts[k] for k in ("n0", "n1")}
    pair = _run_sim(CheckKind.IB_WRITE_BW, two)
    assert pair.outcome == "fail" and pair.blames == []
    assert any("either end" in r["message"] for r in pair.result["reasons"])


def test_a_serial_limit_sums_what_each_node_runs() -> None:
    # ib_write_bw around a ring of 3 on 2 HCAs: each node is a server and a client per HCA.
    nodes = [NodeTarget(name=f"n{i}", host=f"n{i}", gpus=8) for i in range(3)]
    params = normalise_params(CheckKind.IB_WRITE_BW, {"hcas": ["mlx5_0", "mlx5_1"]}, nodes=3)
    plan = plan_check(CheckKind.IB_WRITE_BW, nodes=nodes, params=params, launcher=Launcher.MPIRUN)
    assert len(plan.invocations) == 12
    assert plan.timeout_s == IB_TIMEOUT_S  # all at once: a Slurm job's steps
    assert plan.serial_timeout_s == 4 * IB_TIMEOUT_S  # one at a time: a node's agent
