"""What to run for an active check: the command lines per check, GPU count and launcher.

Pure: no I/O. ``plan_check`` turns a check kind, its parameters and the nodes into
``Invocation``s, one per command to start somewhere, each with the node it runs on, the
nodes its output speaks for, its argv and its timeout. A backend (the agent's command
channel, a Slurm job) starts them and hands back each one's output; ``evaluate`` judges
them. Command lines follow ``shared/reference/failure-signatures.md`` §3.2 and §4:

- ``dcgmi diag -r N -j`` on each node (N = 1..4);
- ``all_reduce_perf -b 8 -e 8G -f 2 -g <gpus>`` on each node (NVLink, one process), or
  once across the nodes: ``srun -N k -w a,b --ntasks-per-node=<gpus> --gpus-per-task=1
  all_reduce_perf ... -g 1`` on Slurm, ``mpirun -np k*g -H a:g,b:g ... -g 1`` elsewhere
  (nccl-tests is an MPI program; torchrun runs Python, not these binaries). On exactly
  two nodes ``NCCL_ALGO=Ring`` is forced: NCCL would pick a tree there and report a
  busbw above what the network carries (§4.1 caveat);
- ``ib_write_bw -d <hca> --report_gbits -a -F -p <port>`` as a server on one node and the
  same plus the server's host on the other, per HCA, around a ring of the nodes (each
  node is a client once and a server once per HCA, so every port is used in both
  directions at once but never twice in one direction); only the clients are judged;
- ``gpu_burn -d <seconds>`` on each node.

A check that does not finish within its timeout is killed and fails ("did not finish").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.checks.models import CheckKind
from gpufleet.core.errors import InvalidInput


class Launcher(StrEnum):
    """How a multi-node NCCL run starts its ranks."""

    SRUN = "srun"  # inside a Slurm job
    MPIRUN = "mpirun"  # from the first node, over ssh (Open MPI)


class NcclScope(StrEnum):
    PER_NODE = "per-node"  # one all_reduce per node over NVLink
    MULTI_NODE = "multi-node"  # one all_reduce across every node, over the fabric


# Seconds a check may run before it is killed and counted as "did not finish". DCGM's own
# durations (§3.2): level 1 seconds, level 2 ~2 min, level 3 ~10-15 min, level 4 > 1 h.
DCGM_TIMEOUT_S = {1: 300.0, 2: 900.0, 3: 2700.0, 4: 4 * 3600.0}
NCCL_TIMEOUT_S = 1200.0  # -e 8G on 8 GPUs takes ~1-2 min; hangs are what this catches
IB_TIMEOUT_S = 600.0  # -a over 23 sizes takes seconds per HCA
GPU_BURN_EXTRA_S = 300.0  # start-up and tear-down on top of the burn itself
IB_BASE_PORT = 18515  # perftest's default TCP port; one per HCA so servers can share a node
DEFAULT_HCAS = tuple(f"mlx5_{i}" for i in range(8))
MAX_NODES = 4096
_SIZE = re.compile(r"^\d+[KMG]?$")
_HCA = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True, slots=True)
class NodeTarget:
    """One node a check runs on: its name (the scheduler's), the host others reach it
    by (ib_write_bw's client, mpirun's host list) and its GPU count."""

    name: str
    host: str
    gpus: int


@dataclass(frozen=True, slots=True)
class Invocation:
    """One command to start. ``nodes`` are the nodes its output speaks for (the clients'
    pair for ib_write_bw, every node for a multi-node NCCL run). ``judged`` is False for
    an ib_write_bw server, whose output only says it served. ``after`` names an
    invocation that must have started first (the server a client connects to)."""

    id: str
    kind: CheckKind
    node: str
    nodes: tuple[str, ...]
    launcher: tuple[str, ...]  # prefix that places it (srun ...), empty on the node itself
    program: tuple[str, ...]  # the tool's own command line
    timeout_s: float
    judged: bool = True
    after: str | None = None
    hca: str | None = None
    peer: str | None = None  # ib_write_bw: the server node a client reaches
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.launcher, *self.program)


@dataclass(frozen=True, slots=True)
class CheckPlan:
    kind: CheckKind
    params: Mapping[str, Any]
    invocations: tuple[Invocation, ...]

    @property
    def timeout_s(self) -> float:
        """The whole run's limit when every invocation starts at once (steps of one Slurm
        job): the longest one."""
        return max((i.timeout_s for i in self.invocations), default=0.0)

    @property
    def serial_timeout_s(self) -> float:
        """The whole run's limit when each node runs its invocations one at a time (a node
        agent's default): the node with the most to do, its limits summed. ib_write_bw
        on 8 HCAs is 16 commands on every node of the ring."""
        per_node: dict[str, float] = {}
        for inv in self.invocations:
            per_node[inv.node] = per_node.get(inv.node, 0.0) + inv.timeout_s
        return max(per_node.values(), default=0.0)


def normalise_params(
    kind: CheckKind, raw: Mapping[str, object] | None, *, nodes: int
) -> dict[str, Any]:
    """Check and complete a check's parameters; the stored form of a run's ``params``.

    dcgm-diag: ``level`` 1..4 (default 3). nccl: ``scope`` per-node | multi-node (default
    multi-node for 2+ nodes), ``min_bytes``/``max_bytes`` (nccl-tests sizes, default 8 and
    8G). ib-write-bw: ``hcas`` (default mlx5_0..mlx5_7). gpu-burn: ``duration_s`` (default
    60). Every kind: ``fabric`` (NDR, HDR, EDR: judges IB and multi-node NCCL figures),
    ``timeout_s`` (overrides the default), ``localise`` (multi-node NCCL: bisect a
    failure, default true), ``known_good`` (node names a localisation may pair with).

    Raises:
        InvalidInput: an unknown key or a value out of range, naming ``params.<key>``.
    """
    values = dict(raw or {})
    common = {"fabric", "timeout_s", "known_good"}
    allowed: dict[CheckKind, set[str]] = {
        CheckKind.DCGM_DIAG: {"level"},
        CheckKind.NCCL: {"scope", "min_bytes", "max_bytes", "localise"},
        CheckKind.IB_WRITE_BW: {"hcas"},
        CheckKind.GPU_BURN: {"duration_s"},
    }
    unknown = sorted(set(values) - allowed[kind] - common)
    if unknown:
        known = ", ".join(sorted(allowed[kind] | common))
        raise InvalidInput(
            f"{kind.value} takes no parameter {unknown[0]!r} (known: {known})",
            field=f"params.{unknown[0]}",
        )
    out: dict[str, Any] = {}
    if kind is CheckKind.DCGM_DIAG:
        out["level"] = _int(values.get("level", 3), "level", low=1, high=4)
    elif kind is CheckKind.NCCL:
        default = NcclScope.MULTI_NODE if nodes > 1 else NcclScope.PER_NODE
        scope = values.get("scope", default.value)
        if scope not in {s.value for s in NcclScope}:
            raise InvalidInput(
                f"nccl scope must be per-node or multi-node, got {scope!r}", field="params.scope"
            )
        if scope == NcclScope.MULTI_NODE and nodes < 2:
            raise InvalidInput(
                "a multi-node all_reduce needs at least 2 nodes", field="params.scope"
            )
        out["scope"] = scope
        for key, default_size in (("min_bytes", "8"), ("max_bytes", "8G")):
            size = str(values.get(key, default_size))
            if not _SIZE.match(size):
                raise InvalidInput(
                    f"{key} must be a size as nccl-tests takes it (8, 256M, 8G), got {size!r}",
                    field=f"params.{key}",
                )
            out[key] = size
        localise = values.get("localise", True)
        if not isinstance(localise, bool):
            raise InvalidInput("localise must be true or false", field="params.localise")
        out["localise"] = localise
    elif kind is CheckKind.IB_WRITE_BW:
        hcas = values.get("hcas", list(DEFAULT_HCAS))
        if (
            not isinstance(hcas, list)
            or not hcas
            or len(hcas) > 32
            or not all(isinstance(h, str) and _HCA.match(h) for h in hcas)
        ):
            raise InvalidInput(
                "hcas must be a list of 1..32 HCA names such as mlx5_0", field="params.hcas"
            )
        out["hcas"] = list(dict.fromkeys(hcas))
    else:
        out["duration_s"] = _int(values.get("duration_s", 60), "duration_s", low=10, high=86400)
    if values.get("fabric") is not None:
        fabric = values["fabric"]
        if not isinstance(fabric, str) or not 1 <= len(fabric) <= 32:
            raise InvalidInput("fabric must be a name such as NDR", field="params.fabric")
        out["fabric"] = fabric
    if values.get("timeout_s") is not None:
        out["timeout_s"] = float(_int(values["timeout_s"], "timeout_s", low=10, high=86400))
    known_good = values.get("known_good")
    if known_good is not None:
        if not isinstance(known_good, list) or not all(isinstance(n, str) for n in known_good):
            raise InvalidInput("known_good must be a list of node names", field="params.known_good")
        out["known_good"] = list(dict.fromkeys(known_good))
    return out


def _int(value: object, key: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{key} must be a whole number {low}..{high}", field=f"params.{key}")
    return value


def default_timeout_s(kind: CheckKind, params: Mapping[str, Any]) -> float:
    if "timeout_s" in params:
        return float(params["timeout_s"])
    if kind is CheckKind.DCGM_DIAG:
        return DCGM_TIMEOUT_S[int(params.get("level", 3))]
    if kind is CheckKind.NCCL:
        return NCCL_TIMEOUT_S
    if kind is CheckKind.IB_WRITE_BW:
        return IB_TIMEOUT_S
    return float(params.get("duration_s", 60)) + GPU_BURN_EXTRA_S


# -- programs ---------------------------------------------------------------------------


def dcgm_diag_argv(level: int) -> tuple[str, ...]:
    if not 1 <= level <= 4:
        raise ValueError(f"dcgmi diag levels are 1..4, got {level}")
    return ("dcgmi", "diag", "-r", str(level), "-j")


def all_reduce_argv(*, gpus: int, min_bytes: str = "8", max_bytes: str = "8G") -> tuple[str, ...]:
    """``-g`` GPUs per process: all of the node's in one process, or 1 under srun/mpirun."""
    return ("all_reduce_perf", "-b", min_bytes, "-e", max_bytes, "-f", "2", "-g", str(gpus))


def ib_write_bw_argv(*, hca: str, port: int, server_host: str | None) -> tuple[str, ...]:
    """The server side without ``server_host``; the client with it."""
    argv = ("ib_write_bw", "-d", hca, "--report_gbits", "-a", "-F", "-p", str(port))
    return argv if server_host is None else (*argv, server_host)


def gpu_burn_argv(duration_s: int) -> tuple[str, ...]:
    return ("gpu_burn", "-d", str(duration_s))  # -d: doubles; the number is the seconds


# -- launchers --------------------------------------------------------------------------


def srun_multi_node(nodes: Sequence[NodeTarget], *, gpus: int) -> tuple[str, ...]:
    """One rank per GPU on every node of a Slurm job (nccl-tests then runs with ``-g 1``)."""
    return (
        "srun",
        "-N",
        str(len(nodes)),
        "-w",
        ",".join(n.name for n in nodes),
        f"--ntasks-per-node={gpus}",
        "--gpus-per-task=1",
    )


def mpirun_multi_node(
    nodes: Sequence[NodeTarget], *, gpus: int, env: Mapping[str, str]
) -> tuple[str, ...]:
    """Open MPI from the first node: ``-H host:slots`` per node, one rank per GPU."""
    exported: list[str] = []
    for key, value in sorted(env.items()):
        exported += ["-x", f"{key}={value}"]
    return (
        "mpirun",
        "-np",
        str(len(nodes) * gpus),
        "-H",
        ",".join(f"{n.host}:{gpus}" for n in nodes),
        "--bind-to",
        "none",
        *exported,
    )


def srun_on_node(node: str) -> tuple[str, ...]:
    """One task on one node of the job, with all of the job's GPUs there. ``--overlap``:
    steps on one node run side by side (an ib_write_bw server and client per HCA), each
    seeing the whole allocation (dcgmi needs every GPU)."""
    return ("srun", "-N", "1", "-n", "1", "-w", node, "--overlap")


# -- plans ------------------------------------------------------------------------------


def plan_check(
    kind: CheckKind,
    *,
    nodes: Sequence[NodeTarget],
    params: Mapping[str, Any],
    launcher: Launcher,
) -> CheckPlan:
    """The invocations of one check run (``params`` as ``normalise_params`` made them).

    ``launcher``: SRUN places every invocation with srun inside one Slurm job; MPIRUN
    sends each to its node's agent (a multi-node NCCL run goes to the first node, whose
    mpirun reaches the others).
    """
    if not nodes:
        raise ValueError("a check needs at least one node")
    if len(nodes) > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes in one check, got {len(nodes)}")
    timeout = default_timeout_s(kind, params)
    slurm = launcher is Launcher.SRUN
    out: list[Invocation] = []
    if kind is CheckKind.DCGM_DIAG:
        program = dcgm_diag_argv(int(params.get("level", 3)))
        out = [
            _per_node(kind, f"dcgm-{i}", n, program, timeout, slurm) for i, n in enumerate(nodes)
        ]
    elif kind is CheckKind.GPU_BURN:
        program = gpu_burn_argv(int(params.get("duration_s", 60)))
        out = [
            _per_node(kind, f"burn-{i}", n, program, timeout, slurm) for i, n in enumerate(nodes)
        ]
    elif kind is CheckKind.NCCL:
        sizes = {
            "min_bytes": str(params.get("min_bytes", "8")),
            "max_bytes": str(params.get("max_bytes", "8G")),
        }
        if params.get("scope", NcclScope.PER_NODE) == NcclScope.MULTI_NODE:
            out = [_multi_node_nccl(nodes, sizes=sizes, timeout=timeout, launcher=launcher)]
        else:
            out = [
                _per_node(
                    kind, f"nccl-{i}", n, all_reduce_argv(gpus=n.gpus, **sizes), timeout, slurm
                )
                for i, n in enumerate(nodes)
            ]
    else:
        out = _ib_ring(
            nodes, hcas=list(params.get("hcas", DEFAULT_HCAS)), timeout=timeout, slurm=slurm
        )
    return CheckPlan(kind=kind, params=dict(params), invocations=tuple(out))


def _per_node(
    kind: CheckKind,
    ident: str,
    node: NodeTarget,
    program: tuple[str, ...],
    timeout: float,
    slurm: bool,
) -> Invocation:
    return Invocation(
        id=ident,
        kind=kind,
        node=node.name,
        nodes=(node.name,),
        launcher=srun_on_node(node.name) if slurm else (),
        program=program,
        timeout_s=timeout,
    )


def _multi_node_nccl(
    nodes: Sequence[NodeTarget], *, sizes: dict[str, str], timeout: float, launcher: Launcher
) -> Invocation:
    gpus = min(n.gpus for n in nodes)
    env = {"NCCL_ALGO": "Ring"} if len(nodes) == 2 else {}
    prefix = (
        srun_multi_node(nodes, gpus=gpus)
        if launcher is Launcher.SRUN
        else mpirun_multi_node(nodes, gpus=gpus, env=env)
    )
    return Invocation(
        id="nccl-multi",
        kind=CheckKind.NCCL,
        node=nodes[0].name,
        nodes=tuple(n.name for n in nodes),
        launcher=prefix,
        program=all_reduce_argv(gpus=1, **sizes),
        timeout_s=timeout,
        env=env,
    )


def _ib_ring(
    nodes: Sequence[NodeTarget], *, hcas: Sequence[str], timeout: float, slurm: bool
) -> list[Invocation]:
    """Client i → server i+1 around the ring, per HCA; one node tests itself (loopback)."""
    out: list[Invocation] = []
    count = len(nodes)
    for h, hca in enumerate(hcas):
        port = IB_BASE_PORT + h
        for i, client in enumerate(nodes):
            server = nodes[(i + 1) % count]
            server_id = f"ib-{hca}-{i}-server"
            out.append(
                Invocation(
                    id=server_id,
                    kind=CheckKind.IB_WRITE_BW,
                    node=server.name,
                    nodes=(server.name,),
                    launcher=srun_on_node(server.name) if slurm else (),
                    program=ib_write_bw_argv(hca=hca, port=port, server_host=None),
                    timeout_s=timeout,
                    judged=False,
                    hca=hca,
                )
            )
            out.append(
                Invocation(
                    id=f"ib-{hca}-{i}-client",
                    kind=CheckKind.IB_WRITE_BW,
                    node=client.name,
                    nodes=tuple(dict.fromkeys((client.name, server.name))),
                    launcher=srun_on_node(client.name) if slurm else (),
                    program=ib_write_bw_argv(hca=hca, port=port, server_host=server.host),
                    timeout_s=timeout,
                    after=server_id,
                    hca=hca,
                    peer=server.name,
                )
            )
    return out


def stand_in(invocation: Invocation, program: Sequence[str]) -> Invocation:
    """The same invocation with its tool replaced by ``program`` (a stand-in for a machine
    without the hardware, e.g. ``cat`` of a recorded output); launcher and timeout kept."""
    if not program:
        raise ValueError("a stand-in needs a program")
    values = {
        "{node}": invocation.node,
        "{hca}": invocation.hca or "",
        "{peer}": invocation.peer or "",
    }
    return Invocation(
        id=invocation.id,
        kind=invocation.kind,
        node=invocation.node,
        nodes=invocation.nodes,
        launcher=invocation.launcher,
        program=tuple(_fill(part, values) for part in program),
        timeout_s=invocation.timeout_s,
        judged=invocation.judged,
        after=invocation.after,
        hca=invocation.hca,
        peer=invocation.peer,
        env=invocation.env,
    )


def _fill(part: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        part = part.replace(key, value)
    return part
