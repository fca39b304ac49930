"""``SimFleetRunner``: one simulated node agent per running sim instance, in one process.

Each agent speaks the real agent protocol over HTTP, through the same ``AgentClient`` as
the real agent, so the server cannot tell them apart. A supervising pass moves the world's
workload and starts or stops agents as instances boot, reboot and go away.

Two ways to run them, sharing every step (``sim/reports.py``, ``sim/findings.py``,
``sim/commands.py``): ``run()``/``run_once()`` start each agent as tasks that report,
send findings and take commands on their own, in real time (the demo, the server's
embedded agents); ``step()`` runs no task: it supervises, then makes every agent do at
once what it would do before the world's clock moves again — one report, its finding
changes, its commands — and returns when all of it is done (tests on a fake clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError
from gpufleet.sim.commands import CommandStepper, SimCommandState, run_commands
from gpufleet.sim.faults import SimFault
from gpufleet.sim.findings import FindingSender, run_sender, send_pass
from gpufleet.sim.load import IDLE, NodeLoad
from gpufleet.sim.models import USER_DATA_TOKEN, USER_DATA_URL, SimInstance, SimInstanceState
from gpufleet.sim.programs import PROGRAMS, ProgramRegistry
from gpufleet.sim.reports import AgentCounters, NodeSampler, ReportSender
from gpufleet.sim.world import SimWorld

log = logging.getLogger(__name__)

AgentKey = tuple[str, int]  # (instance id, boot id): a reboot is a new agent process


@dataclass(frozen=True, slots=True)
class FleetStats:
    agents: int  # agents running now
    batches_sent: int  # batches the server accepted
    reports_sent: int  # reports in those batches
    duplicates: int  # reports the server said it already had
    errors: int  # failed sends (unreachable, 5xx, 4xx) and agent crashes
    unauthorized: int  # 401s (a rotated or revoked node token)
    findings_sent: int = 0  # finding changes the server acknowledged
    commands_run: int = 0  # commands the agents ran to an end (results may be unsent)


class _TokenHolder:
    """An agent's client, made again from user_data when the server refuses its token
    (the control plane may have rotated it)."""

    def __init__(
        self, runner: SimFleetRunner, instance: SimInstance, counters: AgentCounters
    ) -> None:
        self._runner = runner
        self._iid = instance.instance_id
        self._counters = counters
        self.client = runner.client_for(instance)

    def __call__(self) -> AgentClient:
        return self.client

    def on_error(self, exc: Exception) -> None:
        self._counters.errors += 1
        if isinstance(exc, ApiError) and exc.status == 401:
            self._counters.unauthorized += 1
            fresh = self._runner.world.get_instance(self._iid)
            if fresh is not None and USER_DATA_TOKEN in fresh.user_data:
                self.client = self._runner.client_for(fresh)


class _SteppedAgent:
    """One boot of one machine's agent, moved by ``SimFleetRunner.step()``."""

    def __init__(self, runner: SimFleetRunner, instance: SimInstance, *, http: httpx.AsyncClient):
        self._runner = runner
        self._instance = instance
        iid = instance.instance_id
        clock = runner.world.clock
        self._findings = _TokenHolder(runner, instance, runner.counters)
        self._sender = runner.finding_sender(iid)
        self._reports = ReportSender(
            instance,
            sampler=NodeSampler(
                instance,
                clock=clock,
                rng=random.Random(runner.rng.getrandbits(64)),
                seconds=lambda: clock.now().timestamp(),
            ),
            world=runner.world,
            http=http,
            counters=runner.counters,
            interval_s=runner.report_interval_s,
            max_unsent=runner.max_unsent_reports,
        )
        commands = _TokenHolder(runner, instance, runner.counters)
        self._state = runner.command_state(iid)
        self._commands = CommandStepper(
            instance,
            state=self._state,
            client=commands,
            world=runner.world,
            programs=runner.programs,
            on_error=commands.on_error,
            time_scale=runner.program_time_scale,
        )

    async def step(self) -> None:
        runner, iid = self._runner, self._instance.instance_id
        await send_pass(
            self._sender,
            instance=self._instance,
            faults_of=lambda: runner.faults_of(iid),
            now=runner.world.clock.now,
            client=self._findings,
            on_error=self._findings.on_error,
            on_sent=runner.count_findings,
        )
        waiting = await self._reports.send_once(
            load=runner.loads.get(iid, IDLE),
            faults=runner.active_faults.get(iid, ()),
            resetting=runner.resetting.get(iid, frozenset()),
        )
        if waiting:
            self._state.wake.set()
        await self._commands.step()


class SimFleetRunner:
    """Runs the simulated agents of every running sim instance that has a node token."""

    def __init__(
        self,
        world: SimWorld,
        *,
        http: httpx.AsyncClient | None = None,
        report_interval_s: float = 10.0,
        supervise_interval_s: float = 1.0,
        max_unsent_reports: int = 60,
        seed: int | None = None,
        programs: ProgramRegistry | None = None,
        program_time_scale: float = 1.0,
    ) -> None:
        self.world = world
        # Programs take this share of what the real tools would (a demo: DCGM level 3 in
        # seconds rather than 15 minutes).
        self.program_time_scale = program_time_scale
        self._http = http
        self._own_http = False
        self.report_interval_s = report_interval_s
        self._supervise_s = supervise_interval_s
        self.max_unsent_reports = max_unsent_reports
        self.rng = random.Random(seed)
        self._tasks: dict[AgentKey, asyncio.Task[None]] = {}
        self._stepped: dict[AgentKey, _SteppedAgent] = {}
        self.loads: dict[str, NodeLoad] = {}  # what the jobs put on each machine now
        self.counters = AgentCounters()
        # Per machine, across its reboots: the finding queue, and the event that wakes its
        # agent the moment a fault changes (set from the world's listener, on any thread).
        self._senders: dict[str, FindingSender] = {}
        self._wakes: dict[str, asyncio.Event] = {}
        self.active_faults: dict[str, tuple[SimFault, ...]] = {}
        self.resetting: dict[str, frozenset[int]] = {}  # GPUs off the bus for a reset
        # Per machine, across its reboots: the commands its agent runs (sim/commands.py).
        self.programs = programs or PROGRAMS
        self._commands: dict[str, SimCommandState] = {}
        self._listener: Callable[[str], None] | None = None

    def stats(self) -> FleetStats:
        """Counters since this runner started."""
        c = self.counters
        return FleetStats(
            agents=sum(1 for t in self._tasks.values() if not t.done()) + len(self._stepped),
            batches_sent=c.batches,
            reports_sent=c.reports,
            duplicates=c.duplicates,
            errors=c.errors,
            unauthorized=c.unauthorized,
            findings_sent=c.findings,
            commands_run=sum(state.finished for state in self._commands.values()),
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Supervise until ``stop`` is set, then stop every agent."""
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                except Exception:
                    log.exception("sim fleet: supervising pass failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._supervise_s)
        finally:
            await self.aclose()

    async def run_once(self) -> None:
        """One supervising pass: move the workload, start and stop agents (as tasks)."""
        if self._stepped:
            raise RuntimeError("this runner's agents are stepped: call step(), not run_once()")
        wanted = await self._supervise()
        for key, task in list(self._tasks.items()):
            if key not in wanted or task.done():
                if not task.done():
                    task.cancel()
                del self._tasks[key]
        for key, instance in wanted.items():
            if key not in self._tasks:
                self._tasks[key] = asyncio.create_task(
                    self._agent(instance), name=f"sim-agent-{instance.node_name}"
                )

    async def step(self) -> None:
        """Supervise, then have every agent send one report, its finding changes, and
        take, run and answer its commands as far as the world's clock allows; returns
        when all of that is done. No task is left running."""
        if self._tasks:
            raise RuntimeError("this runner's agents run as tasks: call run_once(), not step()")
        wanted = await self._supervise()
        http = self._http
        assert http is not None
        for key in [k for k in self._stepped if k not in wanted]:
            del self._stepped[key]
        for key, instance in wanted.items():
            if key not in self._stepped:
                self._stepped[key] = _SteppedAgent(self, instance, http=http)
        await asyncio.gather(*(agent.step() for agent in self._stepped.values()))

    async def _supervise(self) -> dict[AgentKey, SimInstance]:
        """Move the world on, snapshot it for the agents; returns the agents there should
        be: one per running instance the control plane gave a node token."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_connections=64))
            self._own_http = True
        if self._listener is None:
            self._listener = self._listen(asyncio.get_running_loop())
            self.world.add_fault_listener(self._listener)
        # In a thread: advance may rewrite the state file, which must not stall the loop.
        await asyncio.to_thread(self.world.advance)
        # One snapshot per pass, so agents never take the world's lock per report.
        self.loads = self.world.node_loads()
        self.active_faults = self.world.active_faults()
        self.resetting = self.world.resetting_gpus()
        instances = self.world.list_instances()
        live = {i.instance_id for i in instances}
        for iid in [i for i in self._senders if i not in live]:
            del self._senders[iid]
            self._wakes.pop(iid, None)
        for iid in [i for i in self._commands if i not in live]:
            del self._commands[iid]
        return {
            (i.instance_id, i.boot_id): i
            for i in instances
            if i.state is SimInstanceState.RUNNING
            and USER_DATA_URL in i.user_data
            and USER_DATA_TOKEN in i.user_data
        }

    async def aclose(self) -> None:
        """Stop every agent and close the HTTP client if this runner made it."""
        if self._listener is not None:
            self.world.remove_fault_listener(self._listener)
            self._listener = None
        self._stepped.clear()
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._own_http and self._http is not None:
            await self._http.aclose()
            self._http = None
            self._own_http = False

    def _listen(self, loop: asyncio.AbstractEventLoop) -> Callable[[str], None]:
        def on_fault(instance_id: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to wake
                loop.call_soon_threadsafe(self._wake, instance_id)

        return on_fault

    def _wake(self, instance_id: str) -> None:
        self._wakes.setdefault(instance_id, asyncio.Event()).set()

    def wake(self, instance_id: str) -> None:
        """Make the machine's agent look at its faults now (the listener does this)."""
        self._wake(instance_id)

    def command_state(self, instance_id: str) -> SimCommandState:
        return self._commands.setdefault(instance_id, SimCommandState())

    def finding_sender(self, instance_id: str) -> FindingSender:
        return self._senders.setdefault(instance_id, FindingSender(instance_id))

    def faults_of(self, instance_id: str) -> list[SimFault]:
        """The machine's faults, cleared ones included; refreshes its active snapshot."""
        faults = self.world.faults_of(instance_id, include_cleared=True)
        self.active_faults[instance_id] = tuple(f for f in faults if f.active)
        return faults

    def count_findings(self, n: int) -> None:
        self.counters.findings += n

    def client_for(self, instance: SimInstance) -> AgentClient:
        assert self._http is not None
        return AgentClient(
            base_url=instance.user_data[USER_DATA_URL],
            node_token=instance.user_data[USER_DATA_TOKEN],
            http=self._http,
        )

    async def _agent(self, instance: SimInstance) -> None:
        # Findings go out at once, on their own path; metrics keep their own pace.
        async with asyncio.TaskGroup() as group:
            group.create_task(self._send_findings(instance))
            group.create_task(self._send_reports(instance))
            group.create_task(self._run_commands(instance))

    async def _run_commands(self, instance: SimInstance) -> None:
        holder = _TokenHolder(self, instance, self.counters)
        state = self.command_state(instance.instance_id)
        while True:
            try:
                await run_commands(
                    instance,
                    state=state,
                    client=holder,
                    world=self.world,
                    programs=self.programs,
                    interval_s=self.report_interval_s,
                    on_error=holder.on_error,
                    time_scale=self.program_time_scale,
                )
            except Exception as exc:  # a bug here must not stop the node's reports
                self.counters.errors += 1
                log.exception("sim agent %s: commands failed; restarting", instance.node_name)
                state.fail_running(f"simulated agent failed: {exc!r}", now=self.world.clock.now())
            await asyncio.sleep(self.report_interval_s)

    async def _send_findings(self, instance: SimInstance) -> None:
        iid = instance.instance_id
        holder = _TokenHolder(self, instance, self.counters)
        await run_sender(
            self.finding_sender(iid),
            instance=instance,
            faults_of=lambda: self.faults_of(iid),
            now=self.world.clock.now,
            client=holder,
            wake=self._wakes.setdefault(iid, asyncio.Event()),
            resync_s=self.report_interval_s,
            on_error=holder.on_error,
            on_sent=self.count_findings,
        )

    async def _send_reports(self, instance: SimInstance) -> None:
        assert self._http is not None
        # Staggered start: 2,000 agents booted together must not report in one burst.
        await asyncio.sleep(self.rng.uniform(0.0, self.report_interval_s))
        iid = instance.instance_id
        reports = ReportSender(
            instance,
            sampler=NodeSampler(
                instance, clock=self.world.clock, rng=random.Random(self.rng.getrandbits(64))
            ),
            world=self.world,
            http=self._http,
            counters=self.counters,
            interval_s=self.report_interval_s,
            max_unsent=self.max_unsent_reports,
        )
        while True:
            waiting = await reports.send_once(
                load=self.loads.get(iid, IDLE),
                faults=self.active_faults.get(iid, ()),
                resetting=self.resetting.get(iid, frozenset()),
            )
            if waiting:
                self.command_state(iid).wake.set()
            await asyncio.sleep(reports.interval_s)
