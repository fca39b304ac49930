"""The agent's command channel: take commands from the server, run them, report back.

``CommandChannel.run()`` is two loops and one task per running command:

* **poll**: ``GET /agent/commands`` with ``wait_s`` (a long poll: a queued command starts
  within a second), asking for as many commands as there are free slots
  (``command_concurrency``, default 1: one heavy check at a time) and listing in ``have``
  every id the journal holds, so none is handed out twice. A slot freed while a poll
  waits with no room abandons that poll and asks again with room. Ids the server sends
  back in ``cancel`` are killed (as on a timeout).
* **results**: each finished command's result is sent until the server acknowledges it
  (it stores a result once, so a resend after a lost answer is harmless).

Crash safety, through the journal (``<state_dir>/commands/<id>.json``, written whole and
fsynced): an entry is written *before* the process starts and updated with its pid and
start time right after; the result goes into it before it is sent; it is deleted only
once the server has the result. On start, ``recover`` turns every entry left running by
an earlier agent into a failed result ("agent restarted while it ran"), SIGKILLing the
process group it left behind if that is still alive (checked by pid *and* start time,
so a reused pid is never killed), and the results loop sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.agent.command_runner import (
    AGENT_STOPPED,
    kill_group,
    proc_start_time,
    run_command,
)
from gpufleet.agent.sender import Backoff
from gpufleet.agent.settings import KERNEL_BOOT_ID
from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import AGENT_RESTARTED, CommandResult, NodeCommand
from gpufleet.core.clock import utcnow

log = logging.getLogger(__name__)

COMMANDS_DIR = "commands"
# A result the server refuses for good (the command is gone, the body is malformed) is
# dropped after being logged; anything else is retried until it is taken.
_REFUSED_FOR_GOOD = frozenset({400, 404, 409, 413, 422})


def new_boot_id() -> str:
    """One per agent process: the server records which run took each command."""
    return uuid.uuid4().hex


def kernel_boot_id(path: Path = KERNEL_BOOT_ID) -> str | None:
    """The kernel's boot id (new on every boot), or None where it cannot be read."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class CommandJournal:
    """Commands this node took and the server has not acknowledged a result for."""

    def __init__(self, state_dir: Path, *, boot_id_file: Path = KERNEL_BOOT_ID) -> None:
        self.dir = state_dir / COMMANDS_DIR
        self.boot_id_file = boot_id_file
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, command_id: str) -> Path:
        return self.dir / f"{command_id}.json"

    def ids(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json"))

    def __contains__(self, command_id: str) -> bool:
        return self._path(command_id).exists()

    def load(self, command_id: str) -> dict[str, Any] | None:
        try:
            entry: dict[str, Any] = json.loads(self._path(command_id).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.error("command journal %s unreadable (%s); renamed .bad", command_id, exc)
            with contextlib.suppress(OSError):
                self._path(command_id).rename(self._path(command_id).with_suffix(".bad"))
            return None
        return entry

    def _write(self, command_id: str, entry: dict[str, Any]) -> None:
        path = self._path(command_id)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(entry, separators=(",", ":")))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename survives a power cut too
        finally:
            os.close(fd)

    def begin(self, command: NodeCommand, *, boot_id: str) -> None:
        """Before the process starts: a crash from here on is reported, never rerun."""
        self._write(
            command.id,
            {
                "command": command.model_dump(mode="json"),
                "boot_id": boot_id,
                "kernel_boot_id": kernel_boot_id(self.boot_id_file),
                "state": "starting",
            },
        )

    def started(self, command_id: str, *, pid: int) -> None:
        entry = self.load(command_id) or {}
        entry.update(
            state="running",
            pid=pid,
            pid_start=proc_start_time(pid),
            started_at=utcnow().isoformat(),
        )
        self._write(command_id, entry)

    def finish(self, result: CommandResult) -> None:
        entry = self.load(result.id) or {}
        entry.update(state="done", result=result.model_dump(mode="json"))
        self._write(result.id, entry)

    def results(self) -> list[CommandResult]:
        """Finished, not yet acknowledged, oldest first."""
        out: list[CommandResult] = []
        for command_id in self.ids():
            entry = self.load(command_id)
            if entry is None or entry.get("state") != "done":
                continue
            try:
                out.append(CommandResult.model_validate(entry["result"]))
            except (KeyError, ValidationError) as exc:
                log.error("command journal %s: bad result (%s); dropped", command_id, exc)
                self.forget(command_id)
        return out

    def forget(self, command_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(command_id).unlink()

    def recover(self, *, boot_id: str) -> list[str]:
        """Entries an earlier agent left starting or running: kill what they left and
        record them failed. Returns their ids."""
        recovered: list[str] = []
        boot = kernel_boot_id(self.boot_id_file)
        for command_id in self.ids():
            entry = self.load(command_id)
            if entry is None or entry.get("state") == "done":
                continue
            killed = _kill_leftover(entry, boot=boot)
            error = AGENT_RESTARTED + (f" (killed process group {killed})" if killed else "")
            result = CommandResult(
                id=command_id,
                agent_boot_id=boot_id,
                error=error,
                started_at=entry.get("started_at"),
                finished_at=utcnow(),
            )
            self.finish(result)
            recovered.append(command_id)
            log.warning("command %s: %s", command_id, error)
        return recovered


def _kill_leftover(
    entry: dict[str, Any], *, boot: str | None, proc: Path = Path("/proc")
) -> int | None:
    """SIGKILL the process group an earlier agent's command left, if it is still ours:
    same kernel boot, and its leader is the very process started (pid and start time),
    or the leader is gone and its group lives on (a group id is not reused while any
    member lives). Returns the group id killed, or None."""
    pid = entry.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return None
    if entry.get("kernel_boot_id") != boot:
        return None  # the node rebooted: nothing of it survived
    leader_start = proc_start_time(pid, proc=proc)
    if leader_start is not None:
        if leader_start != entry.get("pid_start"):
            return None  # the pid now belongs to another process
        return pid if kill_group(pid, signal.SIGKILL) else None
    return pid if kill_group(pid, signal.SIGKILL) else None


def _retry_after(exc: ApiError, backoff: Backoff) -> float:
    # A 4xx will fail the same way until someone fixes the token or the agent.
    return backoff.next() if exc.status >= 500 or exc.status == 429 else backoff.slowest()


class CommandChannel:
    def __init__(
        self,
        client: AgentClient,
        journal: CommandJournal,
        *,
        boot_id: str,
        concurrency: int = 1,
        wait_s: float = 20.0,
        poll_s: float = 5.0,
        kill_grace_s: float = 10.0,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 30.0,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self.journal = journal
        self.boot_id = boot_id
        self._concurrency = concurrency
        self._wait_s = wait_s
        self._poll_s = poll_s
        self._kill_grace_s = kill_grace_s
        self._retry = (retry_initial_s, retry_max_s)
        self._base_env = base_env
        self._running: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._slot_freed = asyncio.Event()
        self._results_wake = asyncio.Event()
        self.started: list[str] = []  # command ids, in the order they started (tests)

    # -- loops ------------------------------------------------------------------------

    async def run(self) -> None:
        """Recover, then poll and report until cancelled; running commands are killed
        and recorded failed (``AGENT_STOPPED``) on the way out."""
        self.journal.recover(boot_id=self.boot_id)
        self._results_wake.set()
        loops = [
            asyncio.create_task(self._poll_loop(), name="commands-poll"),
            asyncio.create_task(self._results_loop(), name="commands-results"),
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            running = [task for task, _ in self._running.values()]
            for task in running:
                task.cancel()
            for task in [*loops, *running]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _poll_loop(self) -> None:
        backoff = Backoff(initial_s=self._retry[0], max_s=self._retry[1])
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                got = await self.poll_once()
            except ServerUnreachable as exc:
                delay = backoff.next()
                log.warning("commands: server unreachable (retry in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                continue
            except ApiError as exc:
                delay = _retry_after(exc, backoff)
                log.error("commands: poll refused (retry in %.0fs): %s", delay, exc)
                await asyncio.sleep(delay)
                continue
            except Exception:  # a bad answer or a full disk: log it, go on
                delay = backoff.slowest()
                log.exception("commands: poll failed (retry in %.0fs)", delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            quick = loop.time() - began < min(1.0, self._wait_s / 2)
            if not got and (self._wait_s <= 0 or quick):
                # Plain polling, or a server that does not hold polls open: keep a pace.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), timeout=self._poll_s)

    async def poll_once(self) -> bool:
        """One poll: start what it hands out, kill what it cancels. Returns whether it
        got anything. A slot that frees while a poll with no room waits ends that poll."""
        free = self._concurrency - len(self._running)
        self._slot_freed.clear()
        request = asyncio.ensure_future(
            self._client.poll_commands(
                boot_id=self.boot_id,
                have=self.journal.ids(),
                max_commands=max(0, free),
                wait_s=self._wait_s,
            )
        )
        if free <= 0:
            freed = asyncio.ensure_future(self._slot_freed.wait())
            await asyncio.wait({request, freed}, return_when=asyncio.FIRST_COMPLETED)
            freed.cancel()
            if not request.done():
                request.cancel()  # a command taken by it is handed out again (not in have)
                with contextlib.suppress(asyncio.CancelledError):
                    await request
                return True
        poll = await request
        for command_id in poll.cancel:
            running = self._running.get(command_id)
            if running is not None:
                log.warning("command %s: cancelled by the server; killing it", command_id)
                running[1].set()
        for command in poll.commands:
            if command.id in self._running or command.id in self.journal:
                continue  # taken before: never started twice
            self._start(command)
        return bool(poll.commands or poll.cancel)

    def _start(self, command: NodeCommand) -> None:
        self.journal.begin(command, boot_id=self.boot_id)
        cancel = asyncio.Event()
        task = asyncio.create_task(self._execute(command, cancel), name=f"command-{command.id}")
        self._running[command.id] = (task, cancel)
        self.started.append(command.id)
        log.info("command %s started: %s", command.id, command.argv[:3])

    async def _execute(self, command: NodeCommand, cancel: asyncio.Event) -> None:
        try:
            result = await run_command(
                command,
                boot_id=self.boot_id,
                kill_grace_s=self._kill_grace_s,
                cancel=cancel,
                on_started=lambda pid: self.journal.started(command.id, pid=pid),
                base_env=self._base_env,
            )
        except asyncio.CancelledError:
            self.journal.finish(
                CommandResult(
                    id=command.id,
                    agent_boot_id=self.boot_id,
                    error=AGENT_STOPPED,
                    finished_at=utcnow(),
                )
            )
            raise
        except Exception as exc:  # a bug here must still answer the server
            log.exception("command %s: runner failed", command.id)
            result = CommandResult(
                id=command.id,
                agent_boot_id=self.boot_id,
                error=f"agent failed to run it: {exc!r}"[:4000],
                finished_at=utcnow(),
            )
        finally:
            self._running.pop(command.id, None)
            self._slot_freed.set()
        self.journal.finish(result)
        self._results_wake.set()
        log.info("command %s ended: exit %s signal %s", command.id, result.exit_code, result.signal)

    async def _results_loop(self) -> None:
        backoff = Backoff(initial_s=self._retry[0], max_s=self._retry[1])
        delay: float | None = None
        while True:
            if delay is None:
                await self._results_wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._results_wake.wait(), timeout=delay)
            self._results_wake.clear()
            try:
                await self.send_results_once()
            except ServerUnreachable as exc:
                delay = backoff.next()
                log.warning("commands: results wait, server unreachable: %s", exc)
                continue
            except ApiError as exc:
                delay = _retry_after(exc, backoff)
                log.error("commands: result refused (retry in %.0fs): %s", delay, exc)
                continue
            except Exception:  # never let the results stop for good
                delay = backoff.slowest()
                log.exception("commands: sending results failed (retry in %.0fs)", delay)
                continue
            backoff.reset()
            delay = None

    async def send_results_once(self) -> int:
        """Send every finished result; forget each the server takes. Returns how many."""
        sent = 0
        for result in self.journal.results():
            try:
                await self._client.send_command_result(result)
            except ApiError as exc:
                if exc.status not in _REFUSED_FOR_GOOD:
                    raise
                log.error("command %s: result refused for good, dropped: %s", result.id, exc)
            self.journal.forget(result.id)
            sent += 1
        return sent
