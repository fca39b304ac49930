"""Helpers shared by the benchmarks: the server as a subprocess, scratch databases, CPU.

Nothing here measures anything by itself; it sets up and tears down what a benchmark
needs, loopback only, and always cleans up (the callers use it in ``try/finally``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import httpx

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_CLK_TCK = os.sysconf("SC_CLK_TCK")

# The server reads every setting from GPUFLEET_* (see gpufleet.server.settings).
SERVER_CODE = (
    "from gpufleet.server.main import run_server\n"
    "from gpufleet.server.settings import ServerSettings\n"
    "run_server(ServerSettings())\n"
)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(p / 100.0 * len(sorted_values) + 0.5))
    return sorted_values[min(len(sorted_values), rank) - 1]


# -- CPU accounting ----------------------------------------------------------------------


def process_cpu_s(pid: int, *, reaped_children: bool = False) -> float:
    """User + system CPU seconds of one process (0.0 if it is gone); with
    ``reaped_children``, plus those of its children that exited and that it waited for."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may hold spaces; the fields after it are fixed.
    fields = raw.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _CLK_TCK


def cpu_of_command(name: str) -> float:
    """CPU seconds of every running process whose command name is ``name`` (e.g. postgres),
    and of the children they reaped.

    PostgreSQL's backends end with their connection (the server's pool recycles each
    one every 5 minutes): the postmaster reaps them, and the kernel adds their CPU to its
    children's times, so a backend that ended between two readings still counts. (Read
    without those, a 5-minute fleet run found PostgreSQL at 0.06 cores and 0.36 of
    "other".)
    """
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != name:
                continue
        except OSError:
            continue
        total += process_cpu_s(int(entry.name), reaped_children=True)
    return total


def machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds, total CPU seconds) of the whole machine since boot, all cores."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in first]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal
    return (total - idle) / _CLK_TCK, total / _CLK_TCK


@dataclass
class CpuSnapshot:
    at: float
    server_s: float
    postgres_s: float
    clients_s: float
    bench_s: float  # this (coordinating) process
    machine_busy_s: float
    machine_total_s: float

    @classmethod
    def take(
        cls,
        server_pid: int | None,
        client_pids: Sequence[int] = (),
        *,
        more_server_pids: Sequence[int] = (),  # replicas: counted as "server"
    ) -> CpuSnapshot:
        busy, total = machine_busy_s()
        return cls(
            at=time.monotonic(),
            server_s=(process_cpu_s(server_pid) if server_pid else 0.0)
            + sum(process_cpu_s(pid) for pid in more_server_pids),
            postgres_s=cpu_of_command("postgres"),
            clients_s=sum(process_cpu_s(pid) for pid in client_pids),
            bench_s=process_cpu_s(os.getpid()),
            machine_busy_s=busy,
            machine_total_s=total,
        )


@dataclass(frozen=True)
class CpuUse:
    """Share of one core used over a window (1.0 = one core fully busy)."""

    server: float
    postgres: float
    clients: float
    bench: float
    machine: float  # busy cores, all processes together
    machine_cores: float  # cores the machine has, as /proc/stat counted them

    @property
    def other(self) -> float:
        """Busy cores not accounted to the processes above (kernel, other processes)."""
        known = self.server + self.postgres + self.clients + self.bench
        return max(0.0, self.machine - known)

    @classmethod
    def between(cls, a: CpuSnapshot, b: CpuSnapshot) -> CpuUse:
        wall = max(b.at - a.at, 1e-9)
        total = max(b.machine_total_s - a.machine_total_s, 1e-9)
        return cls(
            server=(b.server_s - a.server_s) / wall,
            postgres=(b.postgres_s - a.postgres_s) / wall,
            clients=(b.clients_s - a.clients_s) / wall,
            bench=(b.bench_s - a.bench_s) / wall,
            machine=(b.machine_busy_s - a.machine_busy_s) / wall,
            machine_cores=total / wall,
        )


# -- the machine ---------------------------------------------------------------------------


def machine_lines() -> list[str]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f"{kib / 1024 / 1024:.1f} GiB RAM"
    affinity = len(os.sched_getaffinity(0))
    return [
        f"machine: nproc={affinity} ({os.cpu_count()} online) {cpu_model} {mem}".rstrip(),
        f"os: {platform.platform()}",
        f"python: {sys.version.split()[0]} ({platform.python_implementation()}) {sys.executable}",
    ]


# -- the server as a subprocess ------------------------------------------------------------


@dataclass
class ServerProcess:
    """``run_server`` in a child process on 127.0.0.1, settings from the environment."""

    data_dir: Path
    env_overrides: Mapping[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    log_name: str = "server.log"  # replicas sharing a data dir each keep their own log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / self.log_name

    @property
    def token_file(self) -> Path:
        return self.data_dir / "owner-token"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        env.update(
            {
                "GPUFLEET_HOST": "127.0.0.1",
                "GPUFLEET_PORT": str(self.port),
                "GPUFLEET_DATA_DIR": str(self.data_dir),
                "GPUFLEET_ANNOUNCE_BOOTSTRAP_TOKEN": "false",
                "GPUFLEET_BOOTSTRAP_TOKEN_FILE": str(self.token_file),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env_overrides)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        # Its own session: a Ctrl-C in the terminal reaches only the benchmark, which
        # then stops the server itself (and can report what it measured so far).
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_CODE],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, *, timeout_s: float) -> str:
        """Wait for /readyz; return the owner token. Raises with the log tail on failure."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    raise RuntimeError(f"server exited during start-up\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/readyz").status_code == 200 and self.token_file.exists():
                        token = self.token_file.read_text().strip()
                        if token:
                            return token
                time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join("  | " + line for line in text.splitlines()[-lines:])

    def count_log(self, pattern: str) -> int:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return 0
        return len(re.findall(pattern, text))

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``. Safe to call twice."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None


# -- PostgreSQL scratch databases ------------------------------------------------------------


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        raise SystemExit(f"refusing non-loopback database host {host!r} (loopback only)")


def pg_plain_url(url: str) -> str:
    """postgresql+asyncpg:// or postgres:// → postgresql:// (what asyncpg takes)."""
    scheme, rest = url.split("://", 1)
    if scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise SystemExit(f"not a PostgreSQL URL: {url!r}")
    return "postgresql://" + rest


def pg_url_with_database(url: str, database: str) -> str:
    parts = urlsplit(pg_plain_url(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))


def new_pg_database_name(prefix: str = "gpufleet_bench") -> str:
    return f"{prefix}_{secrets.token_hex(4)}"


async def pg_create_database(admin_url: str, name: str) -> None:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    conn = await asyncpg.connect(pg_plain_url(admin_url), timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def pg_drop_database(admin_url: str, name: str) -> None:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    conn = await asyncpg.connect(pg_plain_url(admin_url), timeout=10)
    try:
        # FORCE (PostgreSQL 13+) ends connections a killed server may have left behind.
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def pg_server_version(url: str) -> str:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    conn = await asyncpg.connect(pg_plain_url(url), timeout=10)
    try:
        return str(await conn.fetchval("SELECT version()"))
    finally:
        await conn.close()


async def pg_setting(url: str, name: str) -> str:
    """A server setting (``SHOW name``): the figures of an update-heavy bench depend on
    some, ``autovacuum`` first (this machine's PostgreSQL has it off, production never)."""
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    conn = await asyncpg.connect(pg_plain_url(url), timeout=10)
    try:
        return str(await conn.fetchval(f"SHOW {name}"))
    finally:
        await conn.close()


def sqlite_versions() -> str:
    import sqlite3

    import aiosqlite

    return f"SQLite {sqlite3.sqlite_version} (aiosqlite {aiosqlite.__version__})"


def sigterm_cancels(task: object) -> None:
    """Make SIGTERM cancel the main task, so ``finally`` blocks clean up as on Ctrl-C."""
    import asyncio

    assert isinstance(task, asyncio.Task)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
