"""The programs a simulated node "runs" when the server sends its agent a command.

A program is a function ``fn(ctx) -> ProgramResult``: it reads the node it runs on (and
any other node of its cluster, e.g. the hosts an ``mpirun -H`` names) from ``ctx`` and
says what the real program would have printed, how it would have exited and how long it
would have taken (``duration_s``, in simulated time: the simulated agent reports the
result once the world's clock has moved that far, so a 20-minute ``dcgmi diag -r 3``
takes 20 minutes of a demo and one tick of a test's fake clock).

``register_program("dcgmi", fn)`` adds one to the registry every ``SimFleetRunner`` uses
by default (``PROGRAMS``); a test can build its own ``ProgramRegistry``. A program is
looked up by the basename of ``argv[0]``; none found: exit 127, "command not found", as
a shell says. Built in:

* ``true``, ``false``, ``echo``, ``sleep N`` (N simulated seconds: past the command's
  timeout it ends ``timed_out``);
* ``sh`` / ``bash``: run **for real** with ``/bin/sh`` (e.g. ``/bin/sh -c SCRIPT``, a
  startup script), in a scratch directory deleted afterwards, with the command's
  timeout in real seconds and an environment naming the node (``GPUFLEET_NODE_NAME``,
  ``GPUFLEET_HOSTNAME``, ``GPUFLEET_CLUSTER_ID``, ``GPUFLEET_GPU_COUNT``,
  ``GPUFLEET_GPU_MODEL``) plus the command's ``env``.

Programs run in a worker thread (the real shell blocks), so they may call the world's
methods, which lock; they must not touch the event loop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import re
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.sim.faults import SimFault
from gpufleet.sim.models import SimGpu, SimInstance, SimInstanceState
from gpufleet.sim.world import SimWorld

log = logging.getLogger(__name__)

# Exit statuses as a shell gives them.
NOT_FOUND = 127
SOFTWARE_ERROR = 70  # EX_SOFTWARE: the simulated program itself crashed
_HOST_SPLIT = re.compile(r"[\s,=]+")


class ProgramOutcome(Protocol):
    """What a program returns; ``ProgramResult`` is the usual one."""

    @property
    def exit_code(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def duration_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class ProgramResult:
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    # Simulated seconds the real program would take; math.inf: it never ends by itself
    # (it runs until the command's timeout kills it).
    duration_s: float = 0.0


@dataclass(frozen=True)
class ProgramContext:
    """What a program can see: the command, the node it runs on, the world."""

    world: SimWorld
    instance: SimInstance  # the machine the command runs on, as it was when it started
    argv: tuple[str, ...]
    env: Mapping[str, str]
    timeout_s: float
    command_id: str
    now: dt.datetime  # the world's clock when the command started
    faults: tuple[SimFault, ...] = ()  # the machine's active faults then
    _peers: dict[str, SimInstance] = field(default_factory=dict, repr=False)

    @property
    def node_name(self) -> str:
        return self.instance.node_name

    @property
    def hostname(self) -> str:
        return self.instance.hostname

    @property
    def cluster_id(self) -> str:
        return self.instance.cluster_id

    @property
    def gpus(self) -> tuple[SimGpu, ...]:
        return self.instance.gpus

    def peer(self, ref: str) -> SimInstance | None:
        """The running machine of this cluster whose node name or hostname is ``ref``
        (``host:slots`` and ``host:port`` forms too), this node included."""
        if not self._peers:
            for inst in self.world.list_instances(cluster_id=self.cluster_id):
                if inst.state is SimInstanceState.RUNNING:
                    self._peers[inst.node_name] = inst
                    self._peers.setdefault(inst.hostname, inst)
        return self._peers.get(ref) or self._peers.get(ref.split(":", 1)[0])

    def hosts_in_argv(self) -> list[SimInstance]:
        """The machines of this cluster that ``argv`` names, in order, each once:
        ``mpirun -H a:8,b:8 ...``, ``ib_write_bw b``, ``--hosts=a,b``."""
        seen: dict[str, SimInstance] = {}
        for arg in self.argv[1:]:
            for token in _HOST_SPLIT.split(arg):
                inst = self.peer(token) if token else None
                if inst is not None:
                    seen.setdefault(inst.instance_id, inst)
        return list(seen.values())

    def faults_of(self, instance: SimInstance) -> tuple[SimFault, ...]:
        """Another machine's active faults (this one's are ``faults``)."""
        if instance.instance_id == self.instance.instance_id:
            return self.faults
        return tuple(self.world.faults_of(instance.instance_id))


Program = Callable[[ProgramContext], ProgramOutcome]


class ProgramRegistry:
    def __init__(self, *, builtins: bool = True) -> None:
        self._programs: dict[str, Program] = {}
        self._lock = threading.Lock()
        if builtins:
            for name, fn in BUILTINS.items():
                self._programs[name] = fn

    def register(self, name: str, fn: Program) -> None:
        """Add (or replace) the program run for ``argv[0]`` named ``name`` (a basename;
        a path is cut to its basename)."""
        with self._lock:
            self._programs[_basename(name)] = fn

    def get(self, name: str) -> Program | None:
        with self._lock:
            return self._programs.get(_basename(name))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._programs)

    def run(self, ctx: ProgramContext) -> ProgramOutcome:
        """Run the program ``ctx.argv`` names: 127 if none, 70 if it raises."""
        program = _basename(ctx.argv[0])
        fn = self.get(program)
        if fn is None:
            return ProgramResult(NOT_FOUND, "", f"{program}: command not found\n")
        try:
            return fn(ctx)
        except Exception as exc:  # a broken simulated tool is a failed command, not a crash
            log.exception("sim program %s failed on %s", program, ctx.node_name)
            return ProgramResult(SOFTWARE_ERROR, "", f"{program}: internal error: {exc!r}\n")


def _basename(name: str) -> str:
    return name.rsplit("/", 1)[-1]


# -- built-ins --------------------------------------------------------------------------


def _true(ctx: ProgramContext) -> ProgramResult:
    del ctx
    return ProgramResult(0)


def _false(ctx: ProgramContext) -> ProgramResult:
    del ctx
    return ProgramResult(1)


def _echo(ctx: ProgramContext) -> ProgramResult:
    args = list(ctx.argv[1:])
    newline = True
    if args and args[0] == "-n":
        newline, args = False, args[1:]
    return ProgramResult(0, " ".join(args) + ("\n" if newline else ""))


def _sleep(ctx: ProgramContext) -> ProgramResult:
    try:
        seconds = sum(float(a) for a in ctx.argv[1:]) if len(ctx.argv) > 1 else None
    except ValueError:
        seconds = None
    if seconds is None or seconds < 0 or math.isnan(seconds):
        return ProgramResult(1, "", f"sleep: invalid time interval {' '.join(ctx.argv[1:])!r}\n")
    return ProgramResult(0, duration_s=seconds)


def shell_env(ctx: ProgramContext, home: str) -> dict[str, str]:
    """The environment a simulated node's shell gets: names for the node, none of the
    server's own settings."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LANG": "C.UTF-8",
        "GPUFLEET_NODE_NAME": ctx.node_name,
        "GPUFLEET_HOSTNAME": ctx.hostname,
        "GPUFLEET_CLUSTER_ID": ctx.cluster_id,
        "GPUFLEET_GPU_COUNT": str(len(ctx.gpus)),
        "GPUFLEET_GPU_MODEL": ctx.instance.gpu_model,
        **ctx.env,
        "GPUFLEET_COMMAND_ID": ctx.command_id,
    }


def _shell(ctx: ProgramContext) -> ProgramResult:
    """The real ``/bin/sh`` with the command's arguments, in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-sim-") as scratch:
        proc = subprocess.Popen(  # noqa: S603 - the point: run the node's script for real
            ["/bin/sh", *ctx.argv[1:]],
            cwd=scratch,
            env=shell_env(ctx, scratch),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=ctx.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            return ProgramResult(
                -signal.SIGKILL, _text(out), _text(err), duration_s=math.inf
            )  # ran past its timeout
        _kill_group(proc.pid)  # whatever the script left running
        return ProgramResult(proc.returncode, _text(out), _text(err))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


BUILTINS: dict[str, Program] = {
    "true": _true,
    "false": _false,
    "echo": _echo,
    "sleep": _sleep,
    "sh": _shell,
    "bash": _shell,
}

# The registry simulated agents use unless given their own.
PROGRAMS = ProgramRegistry()


def register_program(name: str, fn: Program) -> None:
    """Make every simulated node run ``fn`` for a command whose ``argv[0]`` is ``name``."""
    PROGRAMS.register(name, fn)
