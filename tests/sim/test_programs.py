"""Simulated programs, and simulated agents running them through the real command channel.

The registry's built-ins (true, false, echo, sleep, a real /bin/sh), what a program sees
(its node, the hosts its argv names, their faults), and end to end: the server queues a
command, a simulated agent takes it over the agent API and reports its result when the
world's (fake) clock reaches the program's end — or its timeout.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

from gpufleet.core.agent_protocol import AGENT_RESTARTED, script_argv
from gpufleet.core.ids import new_id
from gpufleet.sim.models import BootPlan, SimInstance, SimInstanceSpec
from gpufleet.sim.programs import (
    NOT_FOUND,
    SOFTWARE_ERROR,
    ProgramContext,
    ProgramRegistry,
    ProgramResult,
)
from gpufleet.sim.world import SimWorld
from gpufleet.testing.fleet import SimFleet, sim_fleet

PLAN = BootPlan((0.0, 0.0))


def machines(world: SimWorld, n: int = 3) -> list[SimInstance]:
    return [
        world.provision(
            SimInstanceSpec(
                client_token=f"t{i}",
                cluster_id="c1",
                node_name=f"gpu-{i:03d}",
                gpu_model="NVIDIA H100 80GB HBM3",
                gpu_count=8,
            ),
            plan=PLAN,
        )
        for i in range(n)
    ]


def context(
    world: SimWorld, instance: SimInstance, argv: list[str], **extra: Any
) -> ProgramContext:
    values: dict[str, Any] = {
        "world": world,
        "instance": instance,
        "argv": tuple(argv),
        "env": {},
        "timeout_s": 30.0,
        "command_id": new_id(),
        "now": world.clock.now(),
        "faults": tuple(world.faults_of(instance.instance_id)),
        **extra,
    }
    return ProgramContext(**values)


def test_builtins(world: SimWorld) -> None:
    programs = ProgramRegistry()
    node = machines(world, 1)[0]

    def run(*argv: str) -> ProgramResult:
        outcome = programs.run(context(world, node, list(argv)))
        assert isinstance(outcome, ProgramResult)
        return outcome

    assert run("true") == ProgramResult(0)
    assert run("/usr/bin/false").exit_code == 1
    assert run("echo", "hello", "world").stdout == "hello world\n"
    assert run("echo", "-n", "x").stdout == "x"
    assert run("sleep", "90").duration_s == 90.0 and run("sleep", "90").exit_code == 0
    assert run("sleep", "soon").exit_code == 1
    missing = run("/usr/bin/dcgmi", "diag", "-r", "3")
    assert missing.exit_code == NOT_FOUND and missing.stderr == "dcgmi: command not found\n"


def test_the_shell_runs_for_real_and_names_the_node(world: SimWorld) -> None:
    programs = ProgramRegistry()
    node = machines(world, 1)[0]
    ok = programs.run(
        context(
            world,
            node,
            script_argv('echo "ok $GPUFLEET_NODE_NAME $GPUFLEET_GPU_COUNT $EXTRA"; pwd'),
            env={"EXTRA": "yes"},
        )
    )
    assert ok.exit_code == 0
    first, scratch = ok.stdout.splitlines()
    assert first == f"ok {node.node_name} 8 yes"
    assert Path(scratch).name.startswith("gpufleet-sim-") and not Path(scratch).exists()
    failed = programs.run(context(world, node, script_argv("echo bad >&2; exit 3")))
    assert (failed.exit_code, failed.stderr) == (3, "bad\n")
    slow = programs.run(context(world, node, script_argv("sleep 30"), timeout_s=0.2))
    assert slow.duration_s == math.inf  # ran past its timeout: the agent reports timed_out


def test_a_program_sees_its_hosts_and_their_faults(world: SimWorld) -> None:
    a, b, c = machines(world)
    world.inject_fault(b.instance_id, signature_id="xid-79", gpu_index=3)
    seen: dict[str, Any] = {}

    def mpirun(ctx: ProgramContext) -> ProgramResult:
        hosts = ctx.hosts_in_argv()
        seen["hosts"] = [h.node_name for h in hosts]
        seen["faults"] = {h.node_name: [f.signature_id for f in ctx.faults_of(h)] for h in hosts}
        seen["self"] = (ctx.node_name, len(ctx.gpus), ctx.cluster_id)
        bad = [name for name, faults in seen["faults"].items() if faults]
        return ProgramResult(1 if bad else 0, "", f"bad: {bad}\n", duration_s=60)

    programs = ProgramRegistry()
    programs.register("/usr/local/bin/mpirun", mpirun)
    argv = ["mpirun", "-H", f"{b.hostname}:8,{a.node_name}:8", "--", "all_reduce_perf", "-b", "8"]
    outcome = programs.run(context(world, a, argv))
    assert outcome.exit_code == 1 and outcome.stderr == f"bad: ['{b.node_name}']\n"
    assert seen["hosts"] == [b.node_name, a.node_name]  # in argv order, c not named
    assert seen["faults"] == {b.node_name: ["xid-79"], a.node_name: []}
    assert seen["self"] == (a.node_name, 8, "c1")
    assert c.node_name not in seen["hosts"]

    def broken(ctx: ProgramContext) -> ProgramResult:
        raise RuntimeError(f"no such GPU on {ctx.node_name}")

    programs.register("gpu_burn", broken)
    crashed = programs.run(context(world, a, ["gpu_burn", "60"]))
    assert crashed.exit_code == SOFTWARE_ERROR and "no such GPU" in crashed.stderr


# -- end to end: server, simulated agents stepped on a fake clock ----------------------


async def _run(fleet: SimFleet, node: str, argv: list[str], **body: Any) -> str:
    response = await fleet.app.client.post(
        f"/api/v1/nodes/{fleet.nodes[node]['id']}/commands",
        json={"argv": argv, "timeout_s": 300, **body},
    )
    assert response.status_code == 201, response.text
    command_id: str = response.json()["id"]
    return command_id


async def _record(fleet: SimFleet, node: str, command_id: str) -> dict[str, Any]:
    body: dict[str, Any] = await fleet.get(
        f"/api/v1/nodes/{fleet.nodes[node]['id']}/commands/{command_id}"
    )
    return body


async def _ended(fleet: SimFleet, node: str, command_id: str) -> dict[str, Any]:
    async def result() -> dict[str, Any] | None:
        record = await _record(fleet, node, command_id)
        return record if record["result"] is not None else None

    ended: dict[str, Any] = await fleet.until(result, ticks=100, what=f"{command_id}'s result")
    return ended


async def _sent(fleet: SimFleet, node: str, command_id: str) -> None:
    async def taken() -> bool:
        return (await _record(fleet, node, command_id))["status"] == "sent"

    await fleet.until(taken, ticks=50, what=f"{command_id} taken")


async def test_simulated_agents_run_commands_on_the_sim_clock(
    database_url: str, tmp_path: Path
) -> None:
    programs = ProgramRegistry()

    def dcgmi(ctx: ProgramContext) -> ProgramResult:
        faulty = sorted({f.gpu_index for f in ctx.faults if f.gpu_index is not None})
        text = f"diag on {ctx.hostname}: {'FAIL ' + str(faulty) if faulty else 'PASS'}\n"
        return ProgramResult(226 if faulty else 0, text, duration_s=1200.0)

    programs.register("dcgmi", dcgmi)
    async with sim_fleet(database_url, tmp_path, step_s=0.0, programs=programs) as fleet:
        a, b = sorted(fleet.nodes)
        echo = await _run(fleet, a, ["echo", "hello"])
        done = await _ended(fleet, a, echo)
        assert done["status"] == "succeeded" and done["result"]["stdout"] == "hello\n"
        assert done["agent_boot_id"].startswith("sim-")

        script = await _run(fleet, b, script_argv("echo ok"))
        exit3 = await _run(fleet, a, script_argv("echo failing >&2; exit 3"))
        assert (await _ended(fleet, b, script))["result"]["stdout"] == "ok\n"
        failed = await _ended(fleet, a, exit3)
        assert failed["status"] == "failed" and failed["result"]["exit_code"] == 3
        assert failed["result"]["stderr"] == "failing\n"
        unknown = await _ended(fleet, a, await _run(fleet, a, ["nvidia-smi", "-q"]))
        assert unknown["status"] == "failed" and unknown["result"]["exit_code"] == 127

        # A 20-minute diagnostic ends 20 minutes later on the world's clock, and follows
        # the faults injected into the node.
        instance = next(i for i in fleet.world.list_instances() if i.node_name == b).instance_id
        fleet.world.inject_fault(instance, signature_id="xid-48", gpu_index=5)
        diag = await _run(fleet, b, ["dcgmi", "diag", "-r", "3", "-j"], timeout_s=3600)
        await _sent(fleet, b, diag)
        await fleet.tick(1199)
        assert (await _record(fleet, b, diag))["result"] is None
        await fleet.tick(2)
        ended = await _ended(fleet, b, diag)
        assert ended["status"] == "failed" and ended["result"]["exit_code"] == 226
        assert ended["result"]["stdout"] == f"diag on {fleet.nodes[b]['hostname']}: FAIL [5]\n"
        took = dt.datetime.fromisoformat(
            ended["result"]["finished_at"]
        ) - dt.datetime.fromisoformat(ended["result"]["started_at"])
        assert took == dt.timedelta(seconds=1200)

        # Past its timeout: timed out at the timeout, killed as the real agent would.
        sleeper = await _run(fleet, a, ["sleep", "600"], timeout_s=60)
        await _sent(fleet, a, sleeper)
        await fleet.tick(61)
        timed = await _ended(fleet, a, sleeper)
        assert timed["status"] == "timed_out" and timed["result"]["signal"] == 15
        assert fleet.runner.stats().commands_run >= 6


async def test_a_reboot_under_a_command_reports_it_failed(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, step_s=0.0, programs=ProgramRegistry()) as fleet:
        node = sorted(fleet.nodes)[0]
        long = await _run(fleet, node, ["sleep", "3600"], timeout_s=7200)
        await _sent(fleet, node, long)
        instance = next(i for i in fleet.world.list_instances() if i.node_name == node)
        fleet.world.reboot(instance.instance_id, plan=BootPlan((5.0, 5.0)))
        await fleet.tick(6)
        record = await _ended(fleet, node, long)
        assert record["status"] == "failed" and record["result"]["error"] == AGENT_RESTARTED
        assert record["result"]["agent_boot_id"].endswith(f"-{instance.boot_id + 1}")


async def test_a_cancel_reaches_a_running_command_and_queued_ones_run_back_to_back(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, step_s=0.0, programs=ProgramRegistry()) as fleet:
        node = sorted(fleet.nodes)[0]
        long = await _run(fleet, node, ["sleep", "600"], timeout_s=3600)
        await _sent(fleet, node, long)
        await fleet.tick(10)
        response = await fleet.app.client.post(
            f"/api/v1/nodes/{fleet.nodes[node]['id']}/commands/{long}/cancel"
        )
        assert response.status_code == 200, response.text
        # One step: the poll brings the cancel, the run is killed now, its result goes out.
        await fleet.tick(0)
        record = await _record(fleet, node, long)
        assert record["status"] == "cancelled" and record["result"]["cancelled"] is True
        took = dt.datetime.fromisoformat(
            record["result"]["finished_at"]
        ) - dt.datetime.fromisoformat(record["result"]["started_at"])
        assert took == dt.timedelta(seconds=10)
        # Three instant commands, one at a time as the agent runs them: all in one step.
        queued = [await _run(fleet, node, ["echo", str(i)]) for i in range(3)]
        await fleet.tick(0)
        for i, command_id in enumerate(queued):
            done = await _record(fleet, node, command_id)
            assert done["status"] == "succeeded" and done["result"]["stdout"] == f"{i}\n"
