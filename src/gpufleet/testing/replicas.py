"""Server replicas on one PostgreSQL for the chaos tests: starting them, killing a random
one (SIGKILL) at random moments, watching the loop leases change hands, and an API client
that, like the CLI, goes to the next replica when one does not answer."""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from gpufleet.client.errors import ServerUnreachable
from gpufleet.client.http import ServerUrls, send_with_failover
from gpufleet.testing.processes import ServerProcess, free_port

T = TypeVar("T")

# The pause before each kill, drawn from the chaos's seeded generator.
KILL_EVERY_S = (1.0, 2.5)

# A 32-byte key shared by the replicas: what one encrypts (a BMC password), another reads.
SECRET_KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # noqa: S105 - a test key


def chaos_seed(default: int) -> int:
    """A chaos test's seed: fixed (``default``) and printed by the test;
    ``GPUFLEET_CHAOS_SEED=N`` replays or explores another run of kills."""
    return int(os.environ.get("GPUFLEET_CHAOS_SEED", str(default)))


def wait_for(predicate: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    """``predicate()`` until it returns something true; a replica not answering is a
    retry, not a failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            value = predicate()
            if value:
                return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)  # real sleep: real server and agent processes moving


@dataclass
class Replica:
    index: int
    proc: ServerProcess
    url: str

    def ready(self, *, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=timeout_s).status_code == 200
        except httpx.TransportError:
            return False


def make_replicas(
    count: int, *, database_url: str, tmp: Path, env: dict[str, str]
) -> tuple[list[Replica], Path]:
    """``count`` ``gpufleet server`` processes (not started) on one database, each with
    its own data dir and port; the owner's token file they share (the first start writes
    it)."""
    token_file = tmp / "owner-token"
    replicas: list[Replica] = []
    for i in range(count):
        port = free_port()
        own = {
            "GPUFLEET_DATA_DIR": str(tmp / f"data{i}"),
            "GPUFLEET_DATABASE_URL": database_url,
            "GPUFLEET_PORT": str(port),
            "GPUFLEET_SECRET_KEY": SECRET_KEY,
            "GPUFLEET_BOOTSTRAP_TOKEN_FILE": str(token_file),
            "GPUFLEET_ANNOUNCE_BOOTSTRAP_TOKEN": "false",
        }
        proc = ServerProcess(args=["server"], env={**own, **env}, log_path=tmp / f"server{i}.log")
        replicas.append(Replica(i, proc, f"http://127.0.0.1:{port}"))
    return replicas, token_file


@dataclass
class Chaos:
    """Kills a random replica (SIGKILL) at random moments and starts it again at once.

    ``spare_one``: the victim is one of the replicas serving, and only while another one
    serves too (one failure at a time, the case a highly available deployment is built
    for); a round with fewer than two serving kills nobody. Otherwise any replica may be
    killed, so all may be down or starting at once."""

    replicas: list[Replica]
    rng: random.Random
    every_s: tuple[float, float] = KILL_EVERY_S  # the pause before each kill
    spare_one: bool = False
    kills: Counter[int] = field(default_factory=Counter)
    left_none_serving: int = 0  # kills while no other replica was serving (restarting)
    spared: int = 0  # rounds without a kill: none other serving (``spare_one``)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.every_s)):
            if self.spare_one:
                serving = [r for r in self.replicas if r.ready(timeout_s=0.5)]
                if len(serving) < 2:
                    self.spared += 1
                    continue
                victim = self.rng.choice(serving)
            else:
                victim = self.rng.choice(self.replicas)
                if not any(r.ready(timeout_s=0.5) for r in self.replicas if r is not victim):
                    self.left_none_serving += 1
            victim.proc.kill()
            self.kills[victim.index] += 1
            victim.proc.start()  # a supervisor restarting it; it takes seconds to serve

    def total(self) -> int:
        return sum(self.kills.values())


@dataclass
class LeaseWatch:
    """Samples the lease table: per lease, how far past its expiry it stayed before it
    was renewed or taken (seconds, by PostgreSQL's clock), and how often it changed hands."""

    dsn: str
    overdue_s: dict[str, float] = field(default_factory=dict)
    handovers: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        tokens: dict[str, str] = {}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.2):
                rows = conn.execute(
                    "SELECT name, token, EXTRACT(EPOCH FROM now() - expires_at) FROM lease"
                ).fetchall()
                for name, token, past in rows:
                    if name in tokens and tokens[name] != token:
                        self.handovers[name] += 1
                    tokens[name] = token
                    self.overdue_s[name] = max(self.overdue_s.get(name, 0.0), float(past))

    def late(self, intervals: dict[str, float], *, allowance_s: float) -> dict[str, float]:
        """Leases that stayed expired longer than their loop's interval plus
        ``allowance_s``: seconds past expiry, by lease."""
        return {
            name: round(past, 1)
            for name, past in self.overdue_s.items()
            if past > intervals[name] + allowance_s
        }


def loop_intervals(url: str, token: str) -> dict[str, float]:
    """Each loop's interval, from a replica's /metrics (``loop:<name>`` is its lease)."""
    got = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    got.raise_for_status()
    return {
        f"loop:{m.group(1)}": float(m.group(2))
        for m in re.finditer(
            r'^gpufleet_loop_interval_seconds\{loop="([^"]+)"\} (\S+)$', got.text, re.MULTILINE
        )
    }


class FailoverApi:
    """An owner's API client over every replica, with the clients' own failover
    (``send_with_failover``): a request a replica does not answer goes to the next one. A
    POST that may have reached a replica is never sent twice: ``post`` returns None then,
    and the caller reads what became of it."""

    def __init__(self, replicas: list[Replica], token: str) -> None:
        self.urls = ServerUrls([r.url for r in replicas])
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def get(self, path: str, **params: Any) -> Any:
        for _ in range(60):
            with contextlib.suppress(ServerUnreachable):
                got = send_with_failover(
                    self.http, self.urls, "GET", path, idempotent=True, params=params
                )
                if got.status_code < 500:
                    got.raise_for_status()
                    return got.json()
            time.sleep(0.5)  # real sleep: every replica restarting at once
        raise AssertionError(f"no replica answered GET {path}")

    def put(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """PUT is idempotent: sent again to the next replica when one did not answer."""
        return send_with_failover(self.http, self.urls, "PUT", path, idempotent=True, json=body)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response | None:
        try:
            return send_with_failover(
                self.http, self.urls, "POST", path, idempotent=False, json=body
            )
        except ServerUnreachable:
            return None
