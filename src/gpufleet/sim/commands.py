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
from gpufleet.core.clock import Clock
from gpufleet.sim.models import SimInstance
from gpufleet.sim.programs import ProgramContext, ProgramRegistry
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
    clock = world.clock
    state.fail_running(AGENT_RESTARTED, now=clock.now(), boot_id=boot_id)  # rebooted under it
    tasks: set[asyncio.Task[None]] = set()
    retry = bool(state.results)
    try:
        while True:
            if state.running or state.results or retry:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.wake.wait(), timeout=interval_s)
            else:
                await state.wake.wait()
            state.wake.clear()
            try:
                await _send_results(state, client())
                free = CONCURRENCY - len(state.running)
                poll = await client().poll_commands(
                    boot_id=boot_id,
                    have=[*state.running, *state.results],
                    max_commands=max(0, free),
                )
            except (ServerUnreachable, ApiError) as exc:
                on_error(exc)
                retry = True
                continue
            retry = False
            for command_id in poll.cancel:
                running = state.running.get(command_id)
                if running is not None:
                    running[2].set()
            for command in poll.commands:
                if command.id in state.running or command.id in state.results:
                    continue  # taken before: never run twice
                cancel = asyncio.Event()
                state.running[command.id] = (command, boot_id, cancel)
                task = asyncio.create_task(
                    _simulate(
                        command,
                        instance=instance,
                        state=state,
                        world=world,
                        clock=clock,
                        programs=programs,
                        boot_id=boot_id,
                        cancel=cancel,
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


async def _send_results(state: SimCommandState, client: AgentClient) -> None:
    for command_id, result in list(state.results.items()):
        try:
            await client.send_command_result(result)
        except ApiError as exc:
            if exc.status not in _REFUSED_FOR_GOOD:
                raise
            log.warning("sim command %s: result refused for good: %s", command_id, exc)
        state.results.pop(command_id, None)


async def _simulate(
    command: NodeCommand,
    *,
    instance: SimInstance,
    state: SimCommandState,
    world: SimWorld,
    clock: Clock,
    programs: ProgramRegistry,
    boot_id: str,
    cancel: asyncio.Event,
    check_s: float,
    time_scale: float = 1.0,
) -> None:
    started = clock.now()
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
    cancelled = False
    while clock.now() < end and not cancelled:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel.wait(), timeout=check_s)
            cancelled = True
    stdout, stdout_cut, stdout_bytes = tail_of(outcome.stdout, command.max_output_bytes)
    stderr, stderr_cut, stderr_bytes = tail_of(outcome.stderr, command.max_output_bytes)
    killed = timed_out or cancelled
    code = outcome.exit_code
    state.results[command.id] = CommandResult(
        id=command.id,
        agent_boot_id=boot_id,
        exit_code=None if killed or code < 0 else code,
        signal=int(signal.SIGTERM) if killed else (-code if code < 0 else None),
        timed_out=timed_out and not cancelled,
        cancelled=cancelled,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=stdout_cut,
        stderr_truncated=stderr_cut,
        stdout_bytes=stdout_bytes,
        stderr_bytes=stderr_bytes,
        started_at=started,
        finished_at=max(started, clock.now() if cancelled else end),
    )
    state.running.pop(command.id, None)
    state.finished += 1
    state.wake.set()
