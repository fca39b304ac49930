"""``SimFleetRunner``: one simulated node agent per running sim instance, in one process.

Each agent speaks the real agent protocol over HTTP, through the same ``AgentClient`` as
the real agent, so the server cannot tell them apart. A supervising loop moves the world's
workload and starts or stops agents as instances boot, reboot and go away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import GpuSample, NodeIdentity, NodeReport, ReportBatch
from gpufleet.core.clock import Clock
from gpufleet.sim.commands import SimCommandState, run_commands
from gpufleet.sim.faults import SimFault, apply_effects
from gpufleet.sim.findings import FindingSender, run_sender
from gpufleet.sim.models import USER_DATA_TOKEN, USER_DATA_URL, SimInstance, SimInstanceState
from gpufleet.sim.programs import PROGRAMS, ProgramRegistry
from gpufleet.sim.telemetry import (
    GpuTelemetry,
    gpu_model_or_default,
    initial_telemetry,
    next_telemetry,
)
from gpufleet.sim.world import SimWorld

log = logging.getLogger(__name__)

AGENT_VERSION = "sim-0.1.0"
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


class _Counters:
    def __init__(self) -> None:
        self.batches = 0
        self.reports = 0
        self.duplicates = 0
        self.errors = 0
        self.unauthorized = 0
        self.findings = 0


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
        self._world = world
        # Programs take this share of what the real tools would (a demo: DCGM level 3 in
        # seconds rather than 15 minutes).
        self._program_time_scale = program_time_scale
        self._http = http
        self._own_http = False
        self._interval_s = report_interval_s
        self._supervise_s = supervise_interval_s
        self._max_unsent = max_unsent_reports
        self._rng = random.Random(seed)
        self._tasks: dict[AgentKey, asyncio.Task[None]] = {}
        self._busy: frozenset[str] = frozenset()
        self._counters = _Counters()
        # Per machine, across its reboots: the finding queue, and the event that wakes its
        # agent the moment a fault changes (set from the world's listener, on any thread).
        self._senders: dict[str, FindingSender] = {}
        self._wakes: dict[str, asyncio.Event] = {}
        self._faults: dict[str, tuple[SimFault, ...]] = {}
        self._resetting: dict[str, frozenset[int]] = {}  # GPUs off the bus for a reset
        # Per machine, across its reboots: the commands its agent runs (sim/commands.py).
        self._programs = programs or PROGRAMS
        self._commands: dict[str, SimCommandState] = {}
        self._listener: Callable[[str], None] | None = None

    def stats(self) -> FleetStats:
        """Counters since this runner started."""
        c = self._counters
        return FleetStats(
            agents=sum(1 for t in self._tasks.values() if not t.done()),
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
        """One supervising pass: move the workload, start and stop agents."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_connections=64))
            self._own_http = True
        if self._listener is None:
            self._listener = self._listen(asyncio.get_running_loop())
            self._world.add_fault_listener(self._listener)
        # In a thread: advance may rewrite the state file, which must not stall the loop.
        await asyncio.to_thread(self._world.advance)
        # One snapshot per pass, so agents never take the world's lock per report.
        self._busy = self._world.busy_instance_ids()
        self._faults = self._world.active_faults()
        self._resetting = self._world.resetting_gpus()
        wanted = {
            (i.instance_id, i.boot_id): i
            for i in self._world.list_instances()
            if i.state is SimInstanceState.RUNNING
            and USER_DATA_URL in i.user_data
            and USER_DATA_TOKEN in i.user_data
        }
        for key, task in list(self._tasks.items()):
            if key not in wanted or task.done():
                if not task.done():
                    task.cancel()
                del self._tasks[key]
        live = {i.instance_id for i in self._world.list_instances()}
        for iid in [i for i in self._senders if i not in live]:
            del self._senders[iid]
            self._wakes.pop(iid, None)
        for iid in [i for i in self._commands if i not in live]:
            del self._commands[iid]
        for key, instance in wanted.items():
            if key not in self._tasks:
                self._tasks[key] = asyncio.create_task(
                    self._agent(instance), name=f"sim-agent-{instance.node_name}"
                )

    async def aclose(self) -> None:
        """Stop every agent and close the HTTP client if this runner made it."""
        if self._listener is not None:
            self._world.remove_fault_listener(self._listener)
            self._listener = None
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

    async def _agent(self, instance: SimInstance) -> None:
        # Findings go out at once, on their own path; metrics keep their own pace.
        async with asyncio.TaskGroup() as group:
            group.create_task(self._findings(instance))
            group.create_task(self._reports(instance))
            group.create_task(self._run_commands(instance))

    def command_state(self, instance_id: str) -> SimCommandState:
        return self._commands.setdefault(instance_id, SimCommandState())

    async def _run_commands(self, instance: SimInstance) -> None:
        iid = instance.instance_id
        holder = [self._client_for(instance)]

        def on_error(exc: Exception) -> None:
            self._counters.errors += 1
            if isinstance(exc, ApiError) and exc.status == 401:
                self._counters.unauthorized += 1
                fresh = self._world.get_instance(iid)
                if fresh is not None and USER_DATA_TOKEN in fresh.user_data:
                    holder[0] = self._client_for(fresh)

        state = self.command_state(iid)
        while True:
            try:
                await run_commands(
                    instance,
                    state=state,
                    client=lambda: holder[0],
                    world=self._world,
                    programs=self._programs,
                    interval_s=self._interval_s,
                    on_error=on_error,
                    time_scale=self._program_time_scale,
                )
            except Exception as exc:  # a bug here must not stop the node's reports
                self._counters.errors += 1
                log.exception("sim agent %s: commands failed; restarting", instance.node_name)
                state.fail_running(f"simulated agent failed: {exc!r}", now=self._world.clock.now())
            await asyncio.sleep(self._interval_s)

    async def _findings(self, instance: SimInstance) -> None:
        assert self._http is not None
        iid = instance.instance_id
        sender = self._senders.setdefault(iid, FindingSender(iid))
        wake = self._wakes.setdefault(iid, asyncio.Event())
        holder = [self._client_for(instance)]

        def faults_of() -> list[SimFault]:
            faults = self._world.faults_of(iid, include_cleared=True)
            self._faults[iid] = tuple(f for f in faults if f.active)
            return faults

        def on_error(exc: Exception) -> None:
            self._counters.errors += 1
            if isinstance(exc, ApiError) and exc.status == 401:
                self._counters.unauthorized += 1
                fresh = self._world.get_instance(iid)
                if fresh is not None and USER_DATA_TOKEN in fresh.user_data:
                    holder[0] = self._client_for(fresh)

        def client() -> AgentClient:
            return holder[0]

        await run_sender(
            sender,
            instance=instance,
            faults_of=faults_of,
            now=self._world.clock.now,
            client=client,
            wake=wake,
            resync_s=self._interval_s,
            on_error=on_error,
            on_sent=self._count_findings,
        )

    def _count_findings(self, n: int) -> None:
        self._counters.findings += n

    def _client_for(self, instance: SimInstance) -> AgentClient:
        assert self._http is not None
        return AgentClient(
            base_url=instance.user_data[USER_DATA_URL],
            node_token=instance.user_data[USER_DATA_TOKEN],
            http=self._http,
        )

    async def _reports(self, instance: SimInstance) -> None:
        assert self._http is not None
        interval = self._interval_s
        # Staggered start: 2,000 agents booted together must not report in one burst.
        await asyncio.sleep(self._rng.uniform(0.0, interval))
        agent = _SimAgent(
            instance, clock=self._world.clock, rng=random.Random(self._rng.getrandbits(64))
        )
        url = instance.user_data[USER_DATA_URL]
        client = AgentClient(
            base_url=url, node_token=instance.user_data[USER_DATA_TOKEN], http=self._http
        )
        unsent: deque[NodeReport] = deque(maxlen=self._max_unsent)
        identity: NodeIdentity | None = agent.identity()
        while True:
            try:
                unsent.append(
                    agent.sample(
                        busy=instance.instance_id in self._busy,
                        faults=self._faults.get(instance.instance_id, ()),
                        resetting=self._resetting.get(instance.instance_id, frozenset()),
                    )
                )
                batch = ReportBatch(identity=identity, reports=list(unsent))
                ack = await client.send_reports(batch)
            except asyncio.CancelledError:
                raise
            except ServerUnreachable as exc:
                self._counters.errors += 1
                log.debug("sim agent %s: server unreachable: %s", instance.node_name, exc)
            except ApiError as exc:
                self._counters.errors += 1
                if exc.status == 401:
                    self._counters.unauthorized += 1
                    # The control plane may have rotated the token into user_data.
                    fresh = self._world.get_instance(instance.instance_id)
                    if fresh is not None and USER_DATA_TOKEN in fresh.user_data:
                        url = fresh.user_data.get(USER_DATA_URL, url)
                        client = AgentClient(
                            base_url=url,
                            node_token=fresh.user_data[USER_DATA_TOKEN],
                            http=self._http,
                        )
                elif exc.status < 500:
                    # The server will never take these reports: resending only repeats it.
                    log.warning("sim agent %s: reports refused: %s", instance.node_name, exc)
                    unsent.clear()
            except Exception:
                self._counters.errors += 1
                log.exception("sim agent %s: report failed", instance.node_name)
            else:
                c = self._counters
                c.batches += 1
                c.reports += len(batch.reports)
                c.duplicates += ack.duplicates
                unsent.clear()
                identity = None
                interval = ack.report_interval_s if ack.report_interval_s > 0 else interval
                if ack.commands_waiting:
                    self.command_state(instance.instance_id).wake.set()
            await asyncio.sleep(interval)


class _SimAgent:
    """The per-node part of an agent: identity, sequence numbers and GPU telemetry."""

    def __init__(self, instance: SimInstance, *, clock: Clock, rng: random.Random) -> None:
        self._instance = instance
        self._clock = clock
        self._rng = rng
        self._model = gpu_model_or_default(instance.gpu_model)
        self._gpus: list[GpuTelemetry] = [
            initial_telemetry(self._model, rng=rng) for _ in instance.gpus
        ]
        self._last_seq = 0
        self._last_sample_s: float | None = None

    def identity(self) -> NodeIdentity:
        return NodeIdentity(
            hostname=self._instance.hostname,
            serial=self._instance.serial,
            agent_version=AGENT_VERSION,
        )

    def _next_seq(self) -> int:
        # Wall-clock microseconds keep seq growing across restarts of this process,
        # which holds no state; the bump keeps it strictly growing within one.
        seq = max(time.time_ns() // 1000, self._last_seq + 1)
        self._last_seq = seq
        return seq

    def sample(
        self,
        *,
        busy: bool,
        faults: Sequence[SimFault] = (),
        resetting: frozenset[int] = frozenset(),
    ) -> NodeReport:
        """One report. GPUs in ``resetting`` are left out, as nvidia-smi shows a GPU
        being reset: it is off the bus until the reset is done."""
        now_s = time.monotonic()
        elapsed = 10.0 if self._last_sample_s is None else now_s - self._last_sample_s
        self._last_sample_s = now_s
        self._gpus = [
            next_telemetry(g, model=self._model, busy=busy, elapsed_s=elapsed, rng=self._rng)
            for g in self._gpus
        ]
        return NodeReport(
            seq=self._next_seq(),
            sampled_at=self._clock.now(),
            gpus=[g for g in apply_effects(self._samples(), faults) if g.index not in resetting],
        )

    def _samples(self) -> list[GpuSample]:
        return [
            GpuSample(
                index=gpu.index,
                uuid=gpu.uuid,
                serial=gpu.serial,
                model=self._model.name,
                utilization_pct=t.utilization_pct,
                memory_used_mib=t.memory_used_mib,
                memory_total_mib=t.memory_total_mib,
                temperature_c=t.temperature_c,
                power_w=t.power_w,
                sm_clock_mhz=t.sm_clock_mhz,
                ecc_sbe_volatile=t.ecc_sbe_volatile,
                ecc_dbe_volatile=t.ecc_dbe_volatile,
                ecc_sbe_aggregate=t.ecc_sbe_aggregate,
                ecc_dbe_aggregate=t.ecc_dbe_aggregate,
            )
            for gpu, t in zip(self._instance.gpus, self._gpus, strict=True)
        ]
