"""A simulated agent's metrics path: GPU telemetry sampled and sent as report batches.

``ReportSender.send_once()`` is one report: sample, send what is unsent (the identity
with the first batch of a boot), keep the samples through an outage and replay them in
order. The free-running agent calls it every report interval; a test on a fake clock
calls it once per step.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence

import httpx

from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import GpuSample, NodeIdentity, NodeReport, ReportBatch
from gpufleet.core.clock import Clock
from gpufleet.core.stacks import NodeSoftware
from gpufleet.sim.fabric import IbPortTelemetry, initial_ports, next_ports
from gpufleet.sim.faults import SimFault, apply_effects
from gpufleet.sim.load import IDLE, NodeLoad
from gpufleet.sim.models import USER_DATA_TOKEN, USER_DATA_URL, SimInstance, sim_boot_id
from gpufleet.sim.telemetry import (
    GpuTelemetry,
    gpu_model_or_default,
    initial_telemetry,
    next_telemetry,
)
from gpufleet.sim.world import SimWorld

log = logging.getLogger(__name__)

AGENT_VERSION = "sim-0.1.0"
SIM_KERNEL = "6.8.0-sim"


class AgentCounters:
    """What every simulated agent of one runner sent and failed to send."""

    def __init__(self) -> None:
        self.batches = 0
        self.reports = 0
        self.duplicates = 0
        self.errors = 0
        self.unauthorized = 0
        self.findings = 0


class NodeSampler:
    """The per-node part of an agent: identity, sequence numbers, GPU telemetry and the
    node's InfiniBand ports, all following the load its jobs put on it.

    ``seconds``: the time source telemetry evolves on (real seconds by default; a test
    on a fake clock passes the clock's, so a tick of a minute is a minute of telemetry).
    Port counters start at zero with the sampler, as a boot resets them.
    """

    def __init__(
        self,
        instance: SimInstance,
        *,
        clock: Clock,
        rng: random.Random,
        seconds: Callable[[], float] = time.monotonic,
    ) -> None:
        self._instance = instance
        self._clock = clock
        self._rng = rng
        self._seconds = seconds
        self._model = gpu_model_or_default(instance.gpu_model)
        self._gpus: list[GpuTelemetry] = [
            initial_telemetry(self._model, rng=rng) for _ in instance.gpus
        ]
        self._ports: list[IbPortTelemetry] = initial_ports()
        self._last_seq = 0
        self._last_sample_s: float | None = None

    def identity(self) -> NodeIdentity:
        return NodeIdentity(
            hostname=self._instance.hostname,
            serial=self._instance.serial,
            agent_version=AGENT_VERSION,
            boot_id=sim_boot_id(self._instance.instance_id, self._instance.boot_id),
            software=sim_software(self._instance),
        )

    def _next_seq(self) -> int:
        # Wall-clock microseconds keep seq growing across restarts of this process,
        # which holds no state; the bump keeps it strictly growing within one.
        seq = max(time.time_ns() // 1000, self._last_seq + 1)
        self._last_seq = seq
        return seq

    @property
    def ports(self) -> tuple[IbPortTelemetry, ...]:
        """The node's InfiniBand ports as of the last sample."""
        return tuple(self._ports)

    def sample(
        self,
        *,
        load: NodeLoad = IDLE,
        faults: Sequence[SimFault] = (),
        resetting: frozenset[int] = frozenset(),
    ) -> NodeReport:
        """One report, with GPUs and ports moved on to now under ``load`` (the node's
        jobs); ``faults`` override the readings where they apply. GPUs in ``resetting``
        are left out, as nvidia-smi shows a GPU being reset: it is off the bus until the
        reset is done."""
        now_s = self._seconds()
        elapsed = 10.0 if self._last_sample_s is None else max(0.0, now_s - self._last_sample_s)
        self._last_sample_s = now_s
        self._gpus = [
            next_telemetry(
                g, model=self._model, load=load.gpus.get(i), elapsed_s=elapsed, rng=self._rng
            )
            for i, g in enumerate(self._gpus)
        ]
        self._ports = next_ports(
            self._ports, gbps=load.ib_gbps, faults=faults, elapsed_s=elapsed, rng=self._rng
        )
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


class ReportSender:
    """One boot's report path: what it sampled and the server has not yet acknowledged,
    the identity until acknowledged, and the interval the server asks for."""

    def __init__(
        self,
        instance: SimInstance,
        *,
        sampler: NodeSampler,
        world: SimWorld,
        http: httpx.AsyncClient,
        counters: AgentCounters,
        interval_s: float,
        max_unsent: int,
    ) -> None:
        self._instance = instance
        self._sampler = sampler
        self._world = world
        self._http = http
        self._counters = counters
        self.interval_s = interval_s
        self._url = instance.user_data[USER_DATA_URL]
        self._client = AgentClient(
            base_url=self._url, node_token=instance.user_data[USER_DATA_TOKEN], http=http
        )
        self._unsent: deque[NodeReport] = deque(maxlen=max_unsent)
        self._identity: NodeIdentity | None = sampler.identity()

    async def send_once(
        self, *, load: NodeLoad, faults: Sequence[SimFault], resetting: frozenset[int]
    ) -> bool:
        """Sample and send. Returns whether the server said commands wait for the node."""
        name = self._instance.node_name
        try:
            self._unsent.append(self._sampler.sample(load=load, faults=faults, resetting=resetting))
            batch = ReportBatch(identity=self._identity, reports=list(self._unsent))
            ack = await self._client.send_reports(batch)
        except ServerUnreachable as exc:
            self._counters.errors += 1
            log.debug("sim agent %s: server unreachable: %s", name, exc)
        except ApiError as exc:
            self._counters.errors += 1
            if exc.status == 401:
                self._counters.unauthorized += 1
                self._reread_token()
            elif exc.status < 500:
                # The server will never take these reports: resending only repeats it.
                log.warning("sim agent %s: reports refused: %s", name, exc)
                self._unsent.clear()
        except Exception:
            self._counters.errors += 1
            log.exception("sim agent %s: report failed", name)
        else:
            c = self._counters
            c.batches += 1
            c.reports += len(batch.reports)
            c.duplicates += ack.duplicates
            self._unsent.clear()
            self._identity = None
            if ack.report_interval_s > 0:
                self.interval_s = ack.report_interval_s
            return ack.commands_waiting
        return False

    def _reread_token(self) -> None:
        # The control plane may have rotated the token into user_data.
        fresh = self._world.get_instance(self._instance.instance_id)
        if fresh is not None and USER_DATA_TOKEN in fresh.user_data:
            self._url = fresh.user_data.get(USER_DATA_URL, self._url)
            self._client = AgentClient(
                base_url=self._url, node_token=fresh.user_data[USER_DATA_TOKEN], http=self._http
            )


def sim_software(instance: SimInstance) -> NodeSoftware:
    """A simulated machine runs the stack its user data named when it was made (or last
    reprovisioned): what an image build installs. Without one, only the agent."""
    try:
        stack = json.loads(instance.user_data.get("gpufleet_stack", "{}"))
    except ValueError:
        stack = {}
    pinned = {k: str(v) for k, v in stack.items() if k in NodeSoftware.model_fields}
    return NodeSoftware.model_validate({"kernel": SIM_KERNEL, "agent": AGENT_VERSION, **pinned})
