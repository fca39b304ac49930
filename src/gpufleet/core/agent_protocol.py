"""The agent protocol: what a node agent sends the server, and what it gets back.

Shared by the real agent, the simulated agents and the server, so all three speak one
schema. A node authenticates with its own node token. Reports carry a per-node sequence
number that only grows; the server acknowledges the highest one it has stored and drops
any it has already seen, so an agent may resend a batch after a timeout without harm.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.core.enums import FindingSource, Severity

MAX_GPUS_PER_NODE = 64
MAX_REPORTS_PER_BATCH = 500
_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


NonNegInt = Annotated[int, Field(ge=0, le=2**53)]


class GpuSample(_Wire):
    """One GPU's telemetry at one instant (units in the field names)."""

    index: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: Annotated[str, Field(min_length=1, max_length=80)]
    serial: Annotated[str | None, Field(max_length=80)] = None
    model: Annotated[str | None, Field(max_length=120)] = None
    utilization_pct: Annotated[float, Field(ge=0, le=100)]
    memory_used_mib: Annotated[float, Field(ge=0, le=10_000_000)]
    memory_total_mib: Annotated[float, Field(ge=0, le=10_000_000)]
    temperature_c: Annotated[float, Field(ge=-50, le=200)]
    power_w: Annotated[float, Field(ge=0, le=10_000)]
    sm_clock_mhz: Annotated[float, Field(ge=0, le=10_000)]
    ecc_sbe_volatile: NonNegInt = 0
    ecc_dbe_volatile: NonNegInt = 0
    ecc_sbe_aggregate: NonNegInt = 0
    ecc_dbe_aggregate: NonNegInt = 0


class NodeIdentity(_Wire):
    """What a node says about itself; sent with the first report after agent start."""

    hostname: Annotated[str, Field(min_length=1, max_length=253)]
    serial: Annotated[str | None, Field(max_length=120)] = None
    agent_version: Annotated[str | None, Field(max_length=40)] = None


class NodeReport(_Wire):
    seq: Annotated[int, Field(ge=1, le=2**62)]
    sampled_at: dt.datetime
    gpus: Annotated[list[GpuSample], Field(max_length=MAX_GPUS_PER_NODE)]


class ReportBatch(_Wire):
    """Reports in the order they were sampled (increasing ``seq``)."""

    identity: NodeIdentity | None = None
    reports: Annotated[list[NodeReport], Field(min_length=1, max_length=MAX_REPORTS_PER_BATCH)]


class ReportAck(_Wire):
    node_id: str
    accepted: int  # reports stored by this call
    duplicates: int  # reports with a seq the server had already stored
    last_seq: int  # the highest seq the server holds for this node
    report_interval_s: float  # how often the server wants a report


class FindingState(StrEnum):
    OPEN = "open"
    CLEARED = "cleared"


class FindingReport(_Wire):
    """One change of one finding on a node, as the agent saw it.

    The agent folds repeats: the same signature on the same GPU (or port) is one finding
    whose ``count`` and ``last_seen`` grow. Each change gets the next value of the agent's
    finding sequence, so the server applies every change exactly once and in order.
    """

    seq: Annotated[int, Field(ge=1, le=2**62)]
    key: Annotated[str, Field(min_length=1, max_length=200)]  # the fold key on this node
    signature_id: Annotated[str, Field(min_length=1, max_length=80)]
    state: FindingState
    severity: Severity
    source: FindingSource
    title: Annotated[str, Field(max_length=200)] = ""
    gpu_uuid: Annotated[str | None, Field(max_length=80)] = None
    gpu_index: Annotated[int | None, Field(ge=0, lt=MAX_GPUS_PER_NODE)] = None
    pci_bus_id: Annotated[str | None, Field(max_length=32)] = None
    component: Annotated[str | None, Field(max_length=80)] = None  # e.g. "mlx5_0/1"
    evidence: Annotated[str, Field(max_length=4000)] = ""
    count: Annotated[int, Field(ge=1, le=2**53)] = 1
    first_seen: dt.datetime
    last_seen: dt.datetime


class FindingBatch(_Wire):
    """Finding changes in the order they happened (increasing ``seq``)."""

    identity: NodeIdentity | None = None
    findings: Annotated[list[FindingReport], Field(min_length=1, max_length=MAX_REPORTS_PER_BATCH)]


class FindingAck(_Wire):
    node_id: str
    accepted: int
    duplicates: int
    last_seq: int  # the highest finding seq the server holds for this node


class AgentEventKind(StrEnum):
    """What a node's agent (or a helper it runs, like the Slurm epilog) tells the timeline.

    The values are the server's event kinds, so ``gpufleet events --kind`` finds them.
    """

    DAEMON = "node.daemon"  # slurmd / munge restarted by the agent, or given up on
    CLEANUP = "node.cleanup"  # processes a finished job left behind, killed
    GPU_STATE = "node.gpu_state"  # the scheduler's GPU view compared with the hardware


class NodeEvent(_Wire):
    """One thing that happened on a node. ``id`` is a UUID the node makes: the server
    stores each id once, so resending a batch whose answer was lost does no harm."""

    id: Annotated[str, Field(pattern=_UUID)]
    kind: AgentEventKind
    message: Annotated[str, Field(min_length=1, max_length=2000)]
    at: dt.datetime
    data: Annotated[dict[str, str | int | float | bool], Field(max_length=40)] = Field(
        default_factory=dict
    )


class EventBatch(_Wire):
    identity: NodeIdentity | None = None
    events: Annotated[list[NodeEvent], Field(min_length=1, max_length=MAX_REPORTS_PER_BATCH)]


class EventAck(_Wire):
    node_id: str
    accepted: int
    duplicates: int  # ids the server already held
