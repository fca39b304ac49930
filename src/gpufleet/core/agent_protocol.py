"""The agent protocol: what a node agent sends the server, and what it gets back.

Shared by the real agent, the simulated agents and the server, so all three speak one
schema. A node authenticates with its own node token. Reports carry a per-node sequence
number that only grows; the server acknowledges the highest one it has stored and drops
any it has already seen, so an agent may resend a batch after a timeout without harm.
"""

from __future__ import annotations

import datetime as dt
import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufleet.core.enums import FindingSource, Severity
from gpufleet.core.limits import MAX_GPUS_PER_NODE as MAX_GPUS_PER_NODE  # re-exported
from gpufleet.core.stacks import NodeSoftware

MAX_REPORTS_PER_BATCH = 500
MAX_EVIDENCE_CHARS = 4000  # a finding's evidence
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
    # The kernel's boot id (/proc/sys/kernel/random/boot_id): new on every boot. It is
    # how the control plane knows a reboot it asked for happened (never from the BMC's
    # or cloud API's answer). None: an agent that cannot read it.
    boot_id: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9._:-]{1,64}$")] = None
    # What it runs (OS image, kernel, driver, Slurm, agent), compared with its cluster's
    # stack. None: an agent from before stacks.
    software: NodeSoftware | None = None


class EnrollRequest(_Wire):
    """``POST /api/v1/agent/enroll`` with the cluster's enroll token as the bearer: a
    bare-metal machine's agent asks for the token of the node that waits for its host."""

    hostname: Annotated[str, Field(min_length=1, max_length=253)]
    boot_id: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9._:-]{1,64}$")] = None


class EnrollAck(_Wire):
    """The node the machine enrolled as, and its node token (shown this once: the agent
    keeps it in its token file)."""

    node_id: str
    node_name: str
    cluster_id: str
    node_token: str


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
    # Commands wait for this node (GET /agent/commands): an agent that does not hold a
    # long poll open (the simulated ones) asks for them when it reads this.
    commands_waiting: bool = False
    # The node's state in gpufleet (``NodeState``'s value: provisioning, acceptance,
    # in_service, ...). The agent keeps it in ``<state_dir>/node-state`` for the machine's
    # boot: a cloud node's slurmd waits there for in_service (acceptance passed).
    node_state: Annotated[str, Field(max_length=32)] | None = None


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
    evidence: Annotated[str, Field(max_length=MAX_EVIDENCE_CHARS)] = ""
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
    ACCESS = "node.access"  # the project's admins applied to sudoers / Slurm, or refused


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


# -- the command channel ----------------------------------------------------------------
#
# The server has a node's agent run a command (an active check such as
# ``dcgmi diag -r 3 -j``, or a cluster's startup script) and gets its result back:
#
#   GET  /api/v1/agent/commands?wait_s=&max=&boot_id=&have=   → CommandPoll
#   POST /api/v1/agent/commands/{id}/result   CommandResult    → CommandResultAck
#
# Delivery is at least once, start is at most once: the server hands a command out again
# until the agent lists its id in ``have`` (or answers it), and the agent never starts an
# id it has journalled. A result is stored once, whatever the number of resends.

MAX_ARGV = 256
# Linux refuses one argument over MAX_ARG_STRLEN (32 pages = 128 KiB with its NUL) and a
# whole argv + environment over ARG_MAX; these bounds keep a command well inside both.
MAX_ARG_BYTES = 131_071
MAX_COMMAND_BYTES = 262_144  # argv + env, in bytes
MAX_ENV = 64
MAX_TIMEOUT_S = 86_400.0  # a day: the longest burn-in anyone runs as one command
# Per stream. The result body (both tails, JSON-escaped) must fit the server's 1 MiB body
# limit: the agent shrinks the tails further to RESULT_BODY_BUDGET when it would not.
MAX_OUTPUT_BYTES = 262_144
DEFAULT_OUTPUT_BYTES = 65_536
RESULT_BODY_BUDGET = 900_000
MAX_CLAIM = 32  # commands one poll may hand out
MAX_HAVE = 64  # ids one poll may list in ``have``
COMMAND_WAIT_MAX_S = 20.0  # the longest a poll is held open by the server
# Not taken within 10 min: the node's agent is down or gone; whoever queued it should
# know, rather than have it start an hour later on a node in another state.
DEFAULT_EXPIRES_IN_S = 600.0
MAX_EXPIRES_IN_S = 7 * 86_400.0
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_BOOT_ID = r"^[A-Za-z0-9._:-]{1,64}$"


class CommandKind(StrEnum):
    EXEC = "exec"  # run argv with execve: no shell unless argv names one (see script_argv)


class CommandStatus(StrEnum):
    """pending → sent (an agent took it) → succeeded | failed | timed_out; any of
    pending/sent → expired (not taken by ``expires_at``, or taken and not answered by
    ``deadline_at``) or cancelled. The table is ``core.transitions.COMMAND_TRANSITIONS``."""

    PENDING = "pending"
    SENT = "sent"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


# The error text of a command whose agent died (or was restarted) while it ran.
AGENT_RESTARTED = "agent restarted while it ran"


def script_argv(script: str) -> list[str]:
    """The argv that runs a shell script: ``/bin/sh -c SCRIPT``. The one way a command
    gets a shell; everything else is exec'd as given."""
    return ["/bin/sh", "-c", script]


def _no_nul(value: str, what: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    return value


class NodeCommand(_Wire):
    """One command for one node's agent.

    ``argv`` is exec'd as is (``argv[0]`` looked up on PATH); a script is
    ``["/bin/sh", "-c", SCRIPT]`` (``script_argv``). ``env`` is added to the agent's own
    environment (minus the agent's ``GPUFLEET_AGENT_*`` settings). ``timeout_s`` counts
    from the start: then the process group gets SIGTERM and, after the agent's grace,
    SIGKILL. Each of stdout and stderr keeps its last ``max_output_bytes``. An agent must
    not start it after ``expires_at`` (the server will have expired it).
    """

    id: Annotated[str, Field(pattern=_UUID)]
    kind: CommandKind = CommandKind.EXEC
    argv: Annotated[list[str], Field(min_length=1, max_length=MAX_ARGV)]
    env: Annotated[dict[str, str], Field(max_length=MAX_ENV)] = Field(default_factory=dict)
    cwd: Annotated[str | None, Field(max_length=4096, pattern=r"^/")] = None
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
    max_output_bytes: Annotated[int, Field(ge=1, le=MAX_OUTPUT_BYTES)] = DEFAULT_OUTPUT_BYTES
    purpose: Annotated[str, Field(max_length=200)] = ""
    created_at: dt.datetime
    expires_at: dt.datetime

    @field_validator("argv")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("argv[0] (the program) must not be empty")
        for i, arg in enumerate(argv):
            _no_nul(arg, f"argv[{i}]")
            if len(arg.encode()) > MAX_ARG_BYTES:
                raise ValueError(f"argv[{i}] is over {MAX_ARG_BYTES} bytes (Linux's limit)")
        return argv

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not re.match(_ENV_NAME, name):
                raise ValueError(f"env name {name!r} is not a shell variable name")
            _no_nul(value, f"env {name}")
        return env

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, cwd: str | None) -> str | None:
        return None if cwd is None else _no_nul(cwd, "cwd")

    @model_validator(mode="after")
    def _size(self) -> NodeCommand:
        size = sum(len(a.encode()) + 1 for a in self.argv) + sum(
            len(k.encode()) + len(v.encode()) + 2 for k, v in self.env.items()
        )
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"argv and env together are over {MAX_COMMAND_BYTES} bytes")
        if self.expires_at < self.created_at:
            raise ValueError("expires_at must not be before created_at")
        return self


class CommandPoll(_Wire):
    """The answer to ``GET /agent/commands``: commands to start now (at most ``max``),
    and the ids in ``have`` the server no longer wants run (cancelled or expired): the
    agent kills those and still sends their results (stored as late)."""

    commands: list[NodeCommand] = Field(default_factory=list)
    cancel: list[str] = Field(default_factory=list)


class CommandResult(_Wire):
    """How one command ended, as its agent saw it.

    Exactly one way of ending: ``exit_code`` (it exited), ``signal`` (a signal killed it;
    with ``timed_out`` when the agent sent it), or ``error`` with neither when it never
    ran to an end the agent saw (could not start; the agent restarted while it ran).
    ``stdout``/``stderr`` are the LAST ``max_output_bytes`` of each stream, decoded as
    UTF-8 (invalid bytes replaced); ``*_truncated`` says output was cut at the front,
    ``*_bytes`` is how much the stream produced in all.
    """

    id: Annotated[str, Field(pattern=_UUID)]
    agent_boot_id: Annotated[str, Field(pattern=_BOOT_ID)]
    exit_code: Annotated[int | None, Field(ge=-(2**31), lt=2**31)] = None
    signal: Annotated[int | None, Field(ge=1, le=128)] = None
    timed_out: bool = False
    cancelled: bool = False  # killed because the server said so (CommandPoll.cancel)
    error: Annotated[str | None, Field(max_length=4000)] = None
    stdout: Annotated[str, Field(max_length=MAX_OUTPUT_BYTES)] = ""
    stderr: Annotated[str, Field(max_length=MAX_OUTPUT_BYTES)] = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: NonNegInt = 0
    stderr_bytes: NonNegInt = 0
    started_at: dt.datetime | None = None  # None: it never started
    finished_at: dt.datetime

    @model_validator(mode="after")
    def _one_end(self) -> CommandResult:
        if self.exit_code is not None and self.signal is not None:
            raise ValueError("a command ends by exit_code or by signal, not both")
        if self.exit_code is None and self.signal is None and not self.error:
            raise ValueError("a result needs exit_code, signal or error")
        if self.started_at is not None and self.finished_at < self.started_at:
            raise ValueError("finished_at must not be before started_at")
        return self


def status_of_result(result: CommandResult) -> CommandStatus:
    """The status a result gives a command that is still waiting for one."""
    if result.timed_out:
        return CommandStatus.TIMED_OUT
    if result.exit_code == 0 and result.error is None:
        return CommandStatus.SUCCEEDED
    return CommandStatus.FAILED


class CommandResultAck(_Wire):
    id: str
    status: CommandStatus  # the command's status after this result
    duplicate: bool  # the server already held a result for it: nothing changed
    late: bool  # stored, but the command had already ended (cancelled or expired)


class OutputTail:
    """The last ``limit`` bytes of a stream, and how many it produced in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(chunk) >= self.limit:
            self._buf[:] = chunk[-self.limit :]
            return
        self._buf += chunk
        if len(self._buf) > self.limit:
            del self._buf[: len(self._buf) - self.limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._buf)

    def text(self, limit: int | None = None) -> str:
        """The tail as text, at most ``limit`` bytes of it (default: all kept). A cut
        through a UTF-8 character drops its leftover bytes rather than show U+FFFD."""
        return self.cut(limit)[0]

    def cut(self, limit: int | None = None) -> tuple[str, bool]:
        """``text(limit)``, and whether that text leaves out any of the stream."""
        data = bytes(self._buf)
        if limit is not None and len(data) > limit:
            data = data[len(data) - limit :]
        if len(data) < self.total:
            skip = 0
            while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
                skip += 1
            data = data[skip:]
        return data.decode("utf-8", errors="replace"), len(data) < self.total


def tail_of(data: bytes | str, limit: int) -> tuple[str, bool, int]:
    """(text, truncated, total bytes) of the last ``limit`` bytes of ``data``."""
    raw = data.encode() if isinstance(data, str) else data
    tail = OutputTail(limit)
    tail.add(raw)
    return tail.text(), tail.truncated, tail.total


class CommandRecord(_Wire):
    """A command as the server keeps it: what was asked, where it is, how it ended.

    Shown to project members (``GET /api/v1/nodes/{id}/commands``) with its output; the
    values of ``env`` are not (a startup script may be handed a secret), only its names.
    ``result`` is the agent's, as it sent it; ``late_result`` says it came after the
    command had already been cancelled or expired (kept, status unchanged).
    """

    id: str
    node_id: str
    cluster_id: str
    kind: CommandKind
    argv: list[str]
    env_names: list[str]
    cwd: str | None
    timeout_s: float
    max_output_bytes: int
    purpose: str
    ref: str | None  # the caller's key, e.g. "check_run:<id>"
    requested_by: str
    status: CommandStatus
    status_reason: str  # why it is in this status (who cancelled, what expired)
    created_at: dt.datetime
    updated_at: dt.datetime
    expires_at: dt.datetime  # not taken by then: expired
    sent_at: dt.datetime | None  # when an agent last took it
    deadline_at: dt.datetime | None  # taken, not answered by then: expired
    agent_boot_id: str | None  # the agent run that took it
    deliveries: int  # times handed to an agent (more than 1: an answer was lost)
    result: CommandResult | None
    result_at: dt.datetime | None
    late_result: bool
