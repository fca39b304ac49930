"""Self-healing node daemons: the agent keeps slurmd and munged running.

A supervised daemon is known by its pid file. Each check (``check_s``) it is one of:

* **up** — the pid in the file is a live process;
* **dead** — the file is there but names no live process (a crash, SIGKILL, OOM kill: a
  clean ``systemctl stop`` removes the file, and a stopped daemon is left stopped);
* **hung** — the process is stopped (state T) for ``hang_s``, or, for slurmd, slurmctld
  has reported the node not responding for ``hang_s`` while the process lives.

A dead daemon is started again with its start command (``systemctl restart slurmd`` on
a host, ``slurmd -N <node>`` in the lab); a hung one is SIGKILLed first. Restarts back
off — ``backoff_initial_s`` doubling to ``backoff_max_s`` — and the backoff resets once
the daemon has stayed up for ``stable_s``. Every restart, and every failed start, is a
``node.daemon`` event. ``flap_restarts`` restarts within ``flap_window_s`` mean it keeps
dying: the ``daemon_flapping`` condition holds (a finding: ``slurmd-keeps-dying`` /
``munge-keeps-dying``) until it has stayed up for ``stable_s``.

Nothing here blocks the sample loop for long: commands run as child processes with a
timeout. The restart history survives agent restarts in ``<state_dir>/daemons.json``,
so an agent that crashes along with slurmd still counts the flapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.collectors.base import CollectorResult, Condition
from gpufleet.agent.outbox import queue_event
from gpufleet.core.agent_protocol import AgentEventKind

log = logging.getLogger(__name__)

FLAPPING = "daemon_flapping"


@dataclass(frozen=True, slots=True)
class DaemonSpec:
    name: str  # "slurmd", "munge": the finding's component
    pidfile: Path
    start: tuple[str, ...]  # argv, no shell
    # for slurmd: the Slurm node name whose NOT_RESPONDING state counts as a hang
    slurm_node: str | None = None


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    check_s: float = 5.0
    hang_s: float = 60.0
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0
    stable_s: float = 600.0
    flap_restarts: int = 3
    flap_window_s: float = 600.0
    start_timeout_s: float = 60.0


def _read_pid(pidfile: Path) -> int | None:
    try:
        text = pidfile.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else 0  # 0: a file that names no process


def _proc_state(pid: int) -> str | None:
    """``R``/``S``/``T``/``Z``... or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split(" ", 1)[0]


@dataclass
class _History:
    restarts: list[float] = field(default_factory=list)  # wall-clock times
    next_allowed: float = 0.0
    backoff_s: float = 0.0
    up_since: float | None = None
    hang_since: float | None = None
    seen: bool = False  # its pid file has existed: it is installed and was started


class DaemonSupervisor:
    """One collector for all supervised daemons; ``collect`` is called each sample."""

    name = "daemons"

    def __init__(
        self,
        specs: Sequence[DaemonSpec],
        *,
        state_dir: Path,
        policy: SupervisorPolicy | None = None,
        not_responding: Callable[[str], bool | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.specs = list(specs)
        self.policy = policy or SupervisorPolicy()
        self._state_dir = state_dir
        self._file = state_dir / "daemons.json"
        self._clock = clock
        self._not_responding = not_responding
        self._last_check = 0.0
        self._history = {s.name: _History() for s in self.specs}
        self._load()

    # -- collector protocol ---------------------------------------------------------

    async def collect(self, now: dt.datetime) -> CollectorResult:
        del now
        result = CollectorResult()
        t = self._clock()
        if t - self._last_check >= self.policy.check_s:
            self._last_check = t
            for spec in self.specs:
                try:
                    await self.check(spec)
                except Exception:  # one daemon's trouble must not stop the others
                    log.exception("supervising %s failed", spec.name)
        for spec in self.specs:
            result.conditions.append(self._flapping(spec))
        return result

    async def close(self) -> None:
        return None

    # -- one check --------------------------------------------------------------------

    async def check(self, spec: DaemonSpec) -> str:
        """Look at one daemon, restart it if it is dead or hung; returns what it saw."""
        h = self._history[spec.name]
        t = self._clock()
        pid = _read_pid(spec.pidfile)
        if pid is None:
            if h.seen:
                log.info("%s: no pid file %s (stopped on purpose?)", spec.name, spec.pidfile)
            h.up_since = None
            return "absent"
        h.seen = True
        state = _proc_state(pid) if pid > 0 else None
        if state is None or state in ("Z", "X"):
            h.hang_since = None
            return await self._restart(spec, h, t, why=f"dead (pid {pid or '?'} is gone)")
        hung_now = state in ("T", "t") or (
            spec.slurm_node is not None
            and self._not_responding is not None
            and self._not_responding(spec.slurm_node) is True
        )
        if hung_now:
            h.hang_since = h.hang_since if h.hang_since is not None else t
            if t - h.hang_since >= self.policy.hang_s:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                await self._gone(pid)
                h.hang_since = None
                why = "stopped (state T)" if state in ("T", "t") else "not responding to Slurm"
                return await self._restart(spec, h, t, why=f"hung: pid {pid} {why}")
            return "hung?"
        h.hang_since = None
        if h.up_since is None:
            h.up_since = t
        if t - h.up_since >= self.policy.stable_s and h.backoff_s:
            h.backoff_s = 0.0  # it stayed up: the next crash restarts at once again
            self._save()
        return "up"

    async def _restart(self, spec: DaemonSpec, h: _History, t: float, *, why: str) -> str:
        h.up_since = None
        if t < h.next_allowed:
            return "waiting"  # backing off
        h.restarts = [r for r in h.restarts if t - r < self.policy.flap_window_s] + [t]
        h.backoff_s = min(
            self.policy.backoff_max_s, max(self.policy.backoff_initial_s, h.backoff_s * 2)
        )
        h.next_allowed = t + h.backoff_s
        self._save()
        ok, output = await self._run(spec.start)
        attempt = len(h.restarts)
        if ok:
            message = f"{spec.name} was {why}; restarted ({attempt} in the last window)"
            log.warning(message)
        else:
            message = f"{spec.name} was {why}; restart failed: {output[-400:]}"
            log.error(message)
        self._event(
            message,
            {
                "daemon": spec.name,
                "restarted": ok,
                "restarts_in_window": attempt,
                "next_restart_after_s": round(h.backoff_s, 1),
            },
        )
        return "restarted" if ok else "restart failed"

    def _flapping(self, spec: DaemonSpec) -> Condition:
        h = self._history[spec.name]
        t = self._clock()
        recent = [r for r in h.restarts if t - r < self.policy.flap_window_s]
        stable = h.up_since is not None and t - h.up_since >= self.policy.stable_s
        active = len(recent) >= self.policy.flap_restarts and not stable
        if stable and h.restarts:
            h.restarts = []
            self._save()
        return Condition(
            FLAPPING,
            active,
            f"{spec.name}: restarted {len(recent)} times in the last "
            f"{self.policy.flap_window_s:g} s",
            component=spec.name,
            attrs={"daemon": spec.name},
        )

    # -- helpers ---------------------------------------------------------------------

    async def _run(self, argv: Sequence[str]) -> tuple[bool, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # the daemon must not die with the agent
            )
        except OSError as exc:
            return False, repr(exc)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.policy.start_timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return False, f"{' '.join(argv)} did not finish in {self.policy.start_timeout_s} s"
        text = out.decode(errors="replace").strip()
        return proc.returncode == 0, text or f"exit {proc.returncode}"

    @staticmethod
    async def _gone(pid: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _proc_state(pid) not in (None, "Z", "X"):  # noqa: ASYNC110 - another process, no event to wait on
            await asyncio.sleep(0.05)

    def _event(self, message: str, data: dict[str, str | int | float | bool]) -> None:
        try:
            queue_event(self._state_dir, AgentEventKind.DAEMON, message, data)
        except OSError:
            log.exception("could not queue the daemon event")

    def _save(self) -> None:
        data = {
            n: {"restarts": h.restarts, "backoff_s": h.backoff_s, "next_allowed": h.next_allowed}
            for n, h in self._history.items()
        }
        tmp = self._file.with_suffix(".tmp")
        try:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self._file)
        except OSError:
            log.exception("could not save %s", self._file)

    def _load(self) -> None:
        try:
            data = json.loads(self._file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        for name, saved in data.items() if isinstance(data, dict) else ():
            h = self._history.get(name)
            if h is None or not isinstance(saved, dict):
                continue
            h.restarts = [float(r) for r in saved.get("restarts", [])]
            h.backoff_s = float(saved.get("backoff_s", 0.0))
            h.next_allowed = float(saved.get("next_allowed", 0.0))
