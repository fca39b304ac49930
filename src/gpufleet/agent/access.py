"""Apply the project's admins to this node: a sudoers fragment, and on the Slurm
controller each user's ``AdminLevel``.

The server renders both (``GET /api/v1/agent/access``). The agent fetches them every
``access_interval_s`` and applies only when ``content_hash`` changed:

- sudoers: the text goes to a temp file next to the target (its name has a dot, so sudo
  never reads it), ``visudo -cf`` checks it, and a rename puts it in place. Refused text
  leaves the old file as it was and queues a timeline event. The agent also refuses any
  line that is not exactly ``<unix name> ALL=(ALL:ALL) NOPASSWD: ALL``: a server cannot
  make it write anything else into sudoers.
- AdminLevel (only where ``slurm_admin_levels`` is on): ``sacctmgr -i`` changes only the
  users whose level differs, adds a missing admin to ``slurm_account``, and sets back to
  None only the users it made Administrator itself (remembered in ``state_dir``), never
  one an operator made admin by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.outbox import queue_event
from gpufleet.client.agent import AgentClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import AgentEventKind
from gpufleet.core.slurm_admins import AccessConfig, AdminLevel, is_unix_name

log = logging.getLogger(__name__)

STATE_FILE = "access.json"
_RULE = re.compile(r"^[a-z_][a-z0-9_-]{0,31} ALL=\(ALL:ALL\) NOPASSWD: ALL$")
COMMAND_TIMEOUT_S = 30.0

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


class AccessError(RuntimeError):
    """The configuration could not be applied; the message says which step and why."""


@dataclass
class AccessState:
    """What this node last applied, kept across agent restarts."""

    content_hash: str | None = None
    administrators: list[str] = field(default_factory=list)  # made so by gpufleet

    @classmethod
    def load(cls, path: Path) -> AccessState:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                content_hash=data.get("content_hash"),
                administrators=[str(n) for n in data.get("administrators", [])],
            )
        except (OSError, ValueError, AttributeError):
            return cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(
            json.dumps({"content_hash": self.content_hash, "administrators": self.administrators}),
            encoding="utf-8",
        )
        os.replace(tmp, path)


def check_sudoers_text(text: str) -> None:
    """Raise ``AccessError`` unless every line is a comment or one admin's rule.

    A comment must be ``#`` followed by a space: ``#include``, ``#includedir`` and
    ``#1000`` (a uid) are sudoers syntax, not comments."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line in ("", "#") or line.startswith("# "):
            continue
        if not _RULE.fullmatch(line):
            raise AccessError(f"sudoers line {number} is not an admin rule gpufleet writes")


def parse_admin_levels(text: str) -> dict[str, str]:
    """``sacctmgr -n -P show user format=user,adminlevel`` → user → level."""
    levels: dict[str, str] = {}
    for line in text.splitlines():
        user, sep, level = line.strip().partition("|")
        if sep and user:
            levels[user] = level.strip()
    return levels


def _run(argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - argv from settings, names checked; no shell
        list(argv),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


@dataclass
class AccessApplier:
    """Writes sudoers and sets AdminLevels; synchronous (run it in a thread)."""

    state_dir: Path
    sudoers_path: Path | None = Path("/etc/sudoers.d/gpufleet")
    visudo: Sequence[str] = ("visudo",)
    sacctmgr: Sequence[str] | None = None  # None: not the Slurm controller
    slurm_account: str = "root"
    env: Mapping[str, str] | None = None  # e.g. SLURM_CONF for sacctmgr

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    def apply(self, access: AccessConfig) -> list[str]:
        """Apply what changed since the last apply. Returns what was done (for the
        timeline); raises ``AccessError`` and keeps the previous state when a step fails."""
        state = AccessState.load(self.state_path)
        if state.content_hash == access.content_hash:
            return []
        done: list[str] = []
        if self.sudoers_path is not None:
            done += self.write_sudoers(access.sudoers)
        if self.sacctmgr is not None:
            done += self.set_admin_levels(access.admin_levels, state)
        state.content_hash = access.content_hash
        state.save(self.state_path)
        return done

    # -- sudoers ------------------------------------------------------------------------
    def write_sudoers(self, text: str) -> list[str]:
        assert self.sudoers_path is not None
        check_sudoers_text(text)
        target = self.sudoers_path
        with contextlib.suppress(OSError):
            if target.read_text(encoding="utf-8") == text:
                return []
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")  # a dot: sudo skips it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o440)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o440)
            checked = _run([*self.visudo, "-cf", str(tmp)], None)
            if checked.returncode != 0:
                why = (checked.stderr or checked.stdout).strip()[-500:]
                raise AccessError(f"visudo refused the sudoers fragment, kept the old one: {why}")
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        rules = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return [f"wrote {target} ({rules} admin rule{'s' if rules != 1 else ''})"]

    # -- Slurm AdminLevel ---------------------------------------------------------------
    def _sacctmgr(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.sacctmgr is not None
        proc = _run([*self.sacctmgr, *args], self.env)
        if proc.returncode != 0:
            raise AccessError(
                f"`sacctmgr {' '.join(args)}` exited {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-500:]}"
            )
        return proc

    def set_admin_levels(self, wanted: Mapping[str, AdminLevel], state: AccessState) -> list[str]:
        wanted = {name: level for name, level in wanted.items() if is_unix_name(name)}
        current = parse_admin_levels(
            self._sacctmgr("-n", "-P", "show", "user", "format=user,adminlevel").stdout
        )
        # Those gpufleet made admin and no longer wants: back to None. Others are not ours.
        targets = dict(wanted)
        for name in state.administrators:
            if name not in wanted and is_unix_name(name):
                targets[name] = AdminLevel.NONE
        done: list[str] = []
        for name, level in sorted(targets.items()):
            have = current.get(name)
            if have == level.value or (have is None and level is AdminLevel.NONE):
                continue
            if have is None:
                self._sacctmgr(
                    "-i", "add", "user", f"name={name}", f"account={self.slurm_account}",
                    f"adminlevel={level.value}",
                )  # fmt: skip
                done.append(f"added Slurm user {name} ({level.value})")
            else:
                self._sacctmgr(
                    "-i", "modify", "user", "where", f"name={name}", "set",
                    f"adminlevel={level.value}",
                )  # fmt: skip
                done.append(f"Slurm AdminLevel of {name}: {have} → {level.value}")
        state.administrators = sorted(
            n for n, level in wanted.items() if level is AdminLevel.ADMINISTRATOR
        )
        return done


class AccessSync:
    """The agent's loop: fetch, apply when changed, tell the timeline."""

    def __init__(
        self, client: AgentClient, applier: AccessApplier, *, interval_s: float = 60.0
    ) -> None:
        self.client = client
        self.applier = applier
        self.interval_s = interval_s
        self._refused: tuple[str, str] | None = None  # (hash, why): told once, not each pass

    async def run_once(self) -> list[str]:
        try:
            access = await self.client.get_access()
        except (ApiError, ServerUnreachable) as exc:
            log.warning("access: cannot fetch the configuration: %s", exc)
            return []
        try:
            done = await asyncio.to_thread(self.applier.apply, access)
        except (AccessError, OSError, subprocess.SubprocessError) as exc:
            if self._refused != (access.content_hash, str(exc)):
                log.error("access: %s", exc)
                self._event(f"access configuration not applied: {exc}", ok=False)
            self._refused = (access.content_hash, str(exc))
            return []
        self._refused = None
        if done:
            log.info("access: %s", "; ".join(done))
            self._event("; ".join(done), ok=True)
        return done

    def _event(self, message: str, *, ok: bool) -> None:
        try:
            queue_event(self.applier.state_dir, AgentEventKind.ACCESS, message, {"applied": ok})
        except OSError as exc:
            log.warning("access: cannot queue the event: %s", exc)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.run_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
