"""Run one command the way an operator wants a root-run check run on a GPU node.

* exec'd with ``asyncio.create_subprocess_exec``: no shell unless argv names one;
* in a session of its own (``setsid``), so the timeout, a cancel or an agent stop kills
  the whole process group — ``mpirun`` and its ranks, a script and its children;
* timeout: SIGTERM to the group, then SIGKILL after ``kill_grace_s``; once the main
  process has exited, whatever it left in its group is SIGKILLed too (a check must not
  leave a GPU burner behind);
* stdout and stderr keep their last ``max_output_bytes`` each; a grandchild that left
  the group but holds a pipe open does not hold the result back (``DRAIN_S``);
* the environment is the agent's, minus its own ``GPUFLEET_AGENT_*`` settings (the node
  token may be one), plus the command's ``env`` and ``GPUFLEET_COMMAND_ID``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from gpufleet.core.agent_protocol import (
    RESULT_BODY_BUDGET,
    CommandResult,
    NodeCommand,
    OutputTail,
)
from gpufleet.core.clock import utcnow

log = logging.getLogger(__name__)

DRAIN_S = 2.0  # after the process group is gone, how long to read what the pipes still hold
AGENT_STOPPED = "agent stopped while it ran"


def proc_start_time(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22):
    with the pid, it names one process for good (pids are reused, this pair is not)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def child_env(base: Mapping[str, str], command: NodeCommand) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith("GPUFLEET_AGENT_")}
    env.update(command.env)
    env["GPUFLEET_COMMAND_ID"] = command.id
    return env


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False if it is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pid reused by someone else's group: not ours to kill
        log.warning("command process group %d: no permission to signal it", pgid)
        return False
    return True


class _Capture(asyncio.SubprocessProtocol):
    """Output straight into the tails (never more than the tail in memory), and an event
    for each of "the process exited" and "every pipe closed": Python 3.11's ``wait()``
    waits for both, and a grandchild that left the group can hold a pipe for days."""

    def __init__(self, out: OutputTail, err: OutputTail) -> None:
        self.tails = {1: out, 2: err}
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.tails[fd].add(data if isinstance(data, bytes) else data.encode())

    def process_exited(self) -> None:
        self.exited.set()

    def connection_lost(self, exc: Exception | None) -> None:
        del exc
        self.closed.set()


async def run_command(
    command: NodeCommand,
    *,
    boot_id: str,
    kill_grace_s: float,
    cancel: asyncio.Event,
    on_started: Callable[[int], None],
    base_env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run ``command`` to its end and say how it ended.

    ``on_started(pid)`` runs right after the spawn (the caller journals the pid before
    anything else can happen). ``cancel`` set: killed as on a timeout, ``cancelled``.
    If this coroutine is cancelled (the agent stops), the group is killed and the
    cancellation propagates; the caller records ``AGENT_STOPPED``.
    """
    env = child_env(os.environ if base_env is None else base_env, command)
    out, err = OutputTail(command.max_output_bytes), OutputTail(command.max_output_bytes)
    loop = asyncio.get_running_loop()
    try:
        # loop.subprocess_exec is what create_subprocess_exec wraps: exec, no shell.
        transport, capture = await loop.subprocess_exec(
            lambda: _Capture(out, err),
            *command.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=command.cwd or "/",
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(
            id=command.id,
            agent_boot_id=boot_id,
            error=f"could not start {command.argv[0]!r}: {exc.strerror or exc}",
            finished_at=utcnow(),
        )
    started_at = utcnow()
    pid = transport.get_pid()
    try:
        on_started(pid)
        ended = await _wait_or(capture.exited, cancel, timeout_s=command.timeout_s)
        if ended != "exited":
            await _terminate(capture.exited, pid, grace_s=kill_grace_s)
        kill_group(pid, signal.SIGKILL)  # whatever it left behind in its group
        try:
            await asyncio.wait_for(capture.closed.wait(), timeout=DRAIN_S)
        except TimeoutError:
            log.warning("command %s: a process outside its group holds its output", command.id)
    except BaseException:  # the agent stops, or journalling the pid failed: no orphan
        kill_group(pid, signal.SIGKILL)
        raise
    finally:
        transport.close()  # the pipes too, even if someone outside the group holds them
    code = transport.get_returncode()
    assert code is not None
    return fit_result(
        command=command,
        boot_id=boot_id,
        returncode=code,
        timed_out=ended == "timeout",
        cancelled=ended == "cancel",
        out=out,
        err=err,
        started_at=started_at,
        finished_at=utcnow(),
    )


async def _wait_or(exited: asyncio.Event, cancel: asyncio.Event, *, timeout_s: float) -> str:
    """ "exited", "timeout" or "cancel", whichever comes first."""
    waits = {
        asyncio.create_task(exited.wait()): "exited",
        asyncio.create_task(cancel.wait()): "cancel",
    }
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    if exited.is_set():
        return "exited"
    return "cancel" if done else "timeout"


async def _terminate(exited: asyncio.Event, pid: int, *, grace_s: float) -> None:
    """SIGTERM to the group; SIGKILL after ``grace_s`` if the main process lives on."""
    kill_group(pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(exited.wait(), timeout=grace_s)
    except TimeoutError:
        kill_group(pid, signal.SIGKILL)
        await exited.wait()


def fit_result(
    *,
    command: NodeCommand,
    boot_id: str,
    returncode: int,
    timed_out: bool,
    cancelled: bool,
    out: OutputTail,
    err: OutputTail,
    started_at: dt.datetime,
    finished_at: dt.datetime,
) -> CommandResult:
    """The result, with both tails shrunk if need be so the body stays within
    ``RESULT_BODY_BUDGET`` once JSON-escaped (binary output can escape 6:1)."""
    limit = command.max_output_bytes
    while True:
        stdout, stdout_cut = out.cut(limit)
        stderr, stderr_cut = err.cut(limit)
        result = CommandResult(
            id=command.id,
            agent_boot_id=boot_id,
            exit_code=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None,
            timed_out=timed_out,
            cancelled=cancelled,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=stdout_cut,
            stderr_truncated=stderr_cut,
            stdout_bytes=out.total,
            stderr_bytes=err.total,
            started_at=started_at,
            finished_at=finished_at,
        )
        if limit <= 1024 or len(result.model_dump_json().encode()) <= RESULT_BODY_BUDGET:
            return result
        limit //= 2
