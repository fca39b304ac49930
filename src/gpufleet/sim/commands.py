"""A simulated node agent's command channel: the real agent's protocol, simulated runs.

The agent asks for commands (``GET /agent/commands``, no long poll: thousands of
simulated agents share one process and one connection pool) when a report's ack says
some wait (``commands_waiting``), and every report interval while it runs one or holds
a result the server has not taken. Each command "runs" through the program registry
(``sim/programs.py``) and its result is sent once the world's clock reaches its end:
started + the program's ``duration_s``, or + the command's timeout if that comes first
(then ``timed_out``, as the real agent's SIGTERM would leave it).

State lives per machine, across its reboots (``SimCommandState``): a command that was
running when the machine rebooted is reported failed, "agent restarted while it ran",
by the agent of the next boot — what the real agent's journal does.

Two ways to drive one boot's channel, sharing every step: ``run_commands`` runs on its
own until cancelled (the demo, the server's embedded agents); ``CommandStepper.step()``
does, at once, what the channel would do between two readings of the world's clock (tests
on a fake clock, which move it by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import AGENT_RESTARTED, CommandResult, NodeCommand, tail_of
from gpufleet.sim.models import SimInstance
from gpufleet.sim.programs import ProgramContext, ProgramOutcome, ProgramRegistry
from gpufleet.sim.world import SimWorld

log = logging.getLogger(__name__)

CONCURRENCY = 1  # as the real agent's default: one check at a time per node
_REFUSED_FOR_GOOD = frozenset({400, 404, 409, 413, 422})


@dataclass
class SimCommandState:
    """One machine's commands: running (with the agent run that took each and its
    cancel switch) and finished but not yet taken by the server."""

    running: dict[str, tuple[NodeCommand, str, asyncio.Event]] = field(default_factory=dict)
    results: dict[str, CommandResult] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    finished: int = 0

    def fail_running(self, error: str, *, now: dt.datetime, boot_id: str | None = None) -> None:
        """Turn what runs (taken by another agent run than ``boot_id``) into failed
        results: their simulation is gone."""
        for command_id, (_command, taken_by, _cancel) in list(self.running.items()):
            if taken_by != boot_id:
                self.results[command_id] = CommandResult(
                    id=command_id,
                    agent_boot_id=boot_id or taken_by,
                    error=error[:4000],
                    finished_at=now,
                )
                del self.running[command_id]


def sim_boot_id(instance: SimInstance) -> str:
    return f"sim-{instance.instance_id}-{instance.boot_id}"


async def exchange(
    state: SimCommandState, *, client: AgentClient, boot_id: str
) -> list[NodeCommand]:
    """Send the results the server has not taken, then ask for commands (as many as there
    are free slots) and learn which running ones it cancelled. Returns the new commands,
    already noted as running; raises ``ServerUnreachable``/``ApiError``."""
    await _send_results(state, client)
    free = CONCURRENCY - len(state.running)
    poll = await client.poll_commands(
        boot_id=boot_id, have=[*state.running, *state.results], max_commands=max(0, free)
    )
    for command_id in poll.cancel:
        running = state.running.get(command_id)
        if running is not None:
            running[2].set()
    taken: list[NodeCommand] = []
    for command in poll.commands:
        if command.id in state.running or command.id in state.results:
            continue  # taken before: never run twice
        state.running[command.id] = (command, boot_id, asyncio.Event())
        taken.append(command)
    return taken


@dataclass(frozen=True)
class Simulation:
    """A command whose program has run: its outcome, and when it ends in world time."""

    command: NodeCommand
    outcome: ProgramOutcome
    started: dt.datetime
    end: dt.datetime
    timed_out: bool


async def start_simulation(
    command: NodeCommand,
    *,
    instance: SimInstance,
    world: SimWorld,
    programs: ProgramRegistry,
    time_scale: float = 1.0,
) -> Simulation:
    started = world.clock.now()
    iid = instance.instance_id
    ctx = ProgramContext(
        world=world,
        instance=world.get_instance(iid) or instance,
        argv=tuple(command.argv),
        env=dict(command.env),
        timeout_s=command.timeout_s,
        command_id=command.id,
        now=started,
        faults=tuple(world.faults_of(iid)),
    )
    # A worker thread: the real shell blocks, and programs may take the world's lock.
    outcome = await asyncio.to_thread(programs.run, ctx)
    duration = outcome.duration_s * time_scale
    timed_out = duration > command.timeout_s
    end = started + dt.timedelta(seconds=command.timeout_s if timed_out else duration)
    return Simulation(command, outcome, started, end, timed_out)


def finish_simulation(
    sim: Simulation,
    *,
    state: SimCommandState,
    boot_id: str,
    now: dt.datetime,
    cancelled: bool,
) -> None:
    """Turn the run into its result (killed at ``now`` if ``cancelled``) for the server."""
    command, outcome = sim.command, sim.outcome
    stdout, stdout_cut, stdout_bytes = tail_of(outcome.stdout, command.max_output_bytes)
    stderr, stderr_cut, stderr_bytes = tail_of(outcome.stderr, command.max_output_bytes)
    killed = sim.timed_out or cancelled
    code = outcome.exit_code
    state.results[command.id] = CommandResult(
        id=command.id,
        agent_boot_id=boot_id,
        exit_code=None if killed or code < 0 else code,
        signal=int(signal.SIGTERM) if killed else (-code if code < 0 else None),
        timed_out=sim.timed_out and not cancelled,
        cancelled=cancelled,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=stdout_cut,
        stderr_truncated=stderr_cut,
        stdout_bytes=stdout_bytes,
        stderr_bytes=stderr_bytes,
        started_at=sim.started,
        finished_at=max(sim.started, now if cancelled else sim.end),
    )
    state.running.pop(command.id, None)
    state.finished += 1
    state.wake.set()


async def run_commands(
    instance: SimInstance,
    *,
    state: SimCommandState,
    client: Callable[[], AgentClient],
    world: SimWorld,
    programs: ProgramRegistry,
    interval_s: float,
    on_error: Callable[[Exception], None],
    time_scale: float = 1.0,
) -> None:
    """The agent side of the channel for one boot of one machine, until cancelled.
    ``time_scale``: programs take this share of their simulated ``duration_s``."""
    boot_id = sim_boot_id(instance)
    state.fail_running(AGENT_RESTARTED, now=world.clock.now(), boot_id=boot_id)  # rebooted
    tasks: set[asyncio.Task[None]] = set()
    # A new boot asks once, as the real agent's first poll does: what an earlier run took
    # and never answered (the server's process, holding these agents, was killed) is
    # handed out again; nothing else would ever say it waits.
    retry = True
    try:
        while True:
            if state.running or state.results or retry:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.wake.wait(), timeout=interval_s)
            else:
                await state.wake.wait()
            state.wake.clear()
            try:
                taken = await exchange(state, client=client(), boot_id=boot_id)
            except (ServerUnreachable, ApiError) as exc:
                on_error(exc)
                retry = True
                continue
            retry = False
            for command in taken:
                task = asyncio.create_task(
                    _simulate(
                        command,
                        instance=instance,
                        state=state,
                        world=world,
                        programs=programs,
                        boot_id=boot_id,
                        check_s=min(interval_s, 0.5),
                        time_scale=time_scale,
                    ),
                    name=f"sim-command-{command.id}",
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for task in list(tasks):
            task.cancel()


async def _simulate(
    command: NodeCommand,
    *,
    instance: SimInstance,
    state: SimCommandState,
    world: SimWorld,
    programs: ProgramRegistry,
    boot_id: str,
    check_s: float,
    time_scale: float = 1.0,
) -> None:
    cancel = state.running[command.id][2]
    sim = await start_simulation(
        command, instance=instance, world=world, programs=programs, time_scale=time_scale
    )
    clock = world.clock
    cancelled = False
    while clock.now() < sim.end and not cancelled:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel.wait(), timeout=check_s)
            cancelled = True
    finish_simulation(sim, state=state, boot_id=boot_id, now=clock.now(), cancelled=cancelled)


class CommandStepper:
    """One boot of one machine's command channel, moved by hand (tests on a fake clock).

    ``step()`` does what ``run_commands`` would do before the world's clock moves again:
    it ends the runs whose time has come (or that the server cancelled), sends their
    results, polls when the free-running agent would (told that commands wait, or while
    it runs one or holds a result), and runs what it is given; zero-time programs end
    in the same step, and the next command is taken, as the free-running agent would in
    the same instant.
    """

    def __init__(
        self,
        instance: SimInstance,
        *,
        state: SimCommandState,
        client: Callable[[], AgentClient],
        world: SimWorld,
        programs: ProgramRegistry,
        on_error: Callable[[Exception], None],
        time_scale: float = 1.0,
    ) -> None:
        self.boot_id = sim_boot_id(instance)
        self._instance = instance
        self._state = state
        self._client = client
        self._world = world
        self._programs = programs
        self._on_error = on_error
        self._time_scale = time_scale
        self._sims: dict[str, Simulation] = {}
        state.fail_running(AGENT_RESTARTED, now=world.clock.now(), boot_id=self.boot_id)
        self._retry = True  # a new boot asks once (see run_commands)

    async def step(self) -> None:
        state = self._state
        # Bounded: each round either ends or starts a command, or the step is over.
        for _ in range(4 * CONCURRENCY + 64):
            self._end_due()
            if not (state.wake.is_set() or state.running or state.results or self._retry):
                return
            state.wake.clear()
            try:
                taken = await exchange(state, client=self._client(), boot_id=self.boot_id)
            except (ServerUnreachable, ApiError) as exc:
                self._on_error(exc)
                self._retry = True
                return
            self._retry = False
            for command in taken:
                self._sims[command.id] = await start_simulation(
                    command,
                    instance=self._instance,
                    world=self._world,
                    programs=self._programs,
                    time_scale=self._time_scale,
                )
            if not (taken or self._due()):
                return  # the results went out with the poll; nothing else moves now
        raise RuntimeError(f"sim agent {self._instance.node_name}: commands never settle")

    def _due(self) -> list[str]:
        now = self._world.clock.now()
        return [
            command_id
            for command_id, sim in self._sims.items()
            if now >= sim.end or self._cancelled(command_id)
        ]

    def _cancelled(self, command_id: str) -> bool:
        running = self._state.running.get(command_id)
        return running is not None and running[2].is_set()

    def _end_due(self) -> None:
        due = self._due()
        now = self._world.clock.now()
        for command_id in due:
            sim = self._sims.pop(command_id)
            if command_id not in self._state.running:
                continue  # failed for a restart meanwhile: that result stands
            cancelled = self._cancelled(command_id) and now < sim.end
            finish_simulation(
                sim, state=self._state, boot_id=self.boot_id, now=now, cancelled=cancelled
            )


async def _send_results(state: SimCommandState, client: AgentClient) -> None:
    for command_id, result in list(state.results.items()):
        try:
            await client.send_command_result(result)
        except ApiError as exc:
            if exc.status not in _REFUSED_FOR_GOOD:
                raise
            log.warning("sim command %s: result refused for good: %s", command_id, exc)
        state.results.pop(command_id, None)
