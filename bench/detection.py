"""Detection latency: a fault line written to the followed kernel log → the finding in the API.

    python bench/detection.py [--count 1000] [--db sqlite|postgres] [--poll-ms 5]
                              [--pg-url postgresql://postgres@127.0.0.1:5432/test]

The real server in a subprocess (SQLite in a temp dir, or a scratch PostgreSQL database
created and dropped), a 1-node sim cluster with ``GPUFLEET_SIM_AGENTS=false``, and the
real agent (``gpufleet agent``, collectors ``kmsg`` only) in a subprocess following a
temp file (``kernel_log=file:PATH``) with the node's token from the sim world. Then
``--count`` injections, one at a time: each appends one Xid line with a fold key not
used before (signature × PCI address), so each must open a NEW finding, and the clock
runs until ``GET /api/v1/findings?node=…&signature=…`` returns a finding with that PCI
address (polled every ``--poll-ms``). Baseline in the same run: the round trip of the same
findings query for a signature with no findings, and of ``GET /readyz``.

Nothing is asserted; figures are printed. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    ServerProcess,
    check_loopback,
    free_port,
    machine_lines,
    new_pg_database_name,
    percentile,
    pg_create_database,
    pg_drop_database,
    pg_url_with_database,
)

TARGET_P99_S = 0.1
# Plain Xids (no extra contains/excludes in the catalog): one finding per (xid, PCI).
XIDS = (8, 13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 79, 92, 94, 95, 119, 120)


def fault(k: int) -> tuple[str, str, str]:
    """Injection ``k``: (signature id, normalised PCI address, the log line)."""
    xid = XIDS[k % len(XIDS)]
    slot = k // len(XIDS)  # distinct per xid: bus × device
    bus, dev = slot % 256, slot // 256
    pci = f"0000:{bus:02x}:{dev:02x}.0"
    line = (
        f"[{1000 + k * 0.001:12.6f}] NVRM: Xid (PCI:0000:{bus:02x}:{dev:02x}): {xid}, "
        f"pid=4242, name=python, bench injection {k}\n"
    )
    return f"xid-{xid}", pci, line


def stats_line(name: str, values: list[float]) -> str:
    v = sorted(values)
    if not v:
        return f"| {name:<38} | {'n/a':>7} | {'':>7} | {'':>7} | {'':>7} | {0:>5} |"
    cells = [percentile(v, p) * 1000 for p in (50, 90, 99)] + [v[-1] * 1000]
    return f"| {name:<38} | " + " | ".join(f"{c:7.1f}" for c in cells) + f" | {len(v):>5} |"


class Agent:
    def __init__(
        self,
        *,
        url: str,
        token: str,
        hostname: str,
        log: Path,
        work: Path,
        collectors: str = '["kmsg"]',
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.work = work
        token_file = work / "node-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        env.update(
            {
                "GPUFLEET_AGENT_SERVER_URL": url,
                "GPUFLEET_AGENT_NODE_TOKEN_FILE": str(token_file),
                "GPUFLEET_AGENT_STATE_DIR": str(work / "state"),
                "GPUFLEET_AGENT_HOSTNAME": hostname,
                "GPUFLEET_AGENT_COLLECTORS": collectors,
                "GPUFLEET_AGENT_KERNEL_LOG": f"file:{log}",
                "GPUFLEET_AGENT_METRICS_LISTEN": f"127.0.0.1:{free_port()}",
                "PYTHONUNBUFFERED": "1",
                **(extra_env or {}),
            }
        )
        gpufleet = Path(sys.executable).with_name("gpufleet")
        cmd = [str(gpufleet)] if gpufleet.exists() else [sys.executable, "-m", "gpufleet"]
        self.log_path = work / "agent.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [*cmd, "agent"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no agent log)"
        return "\n".join("  | " + line for line in text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


async def create_node(url: str, owner: str, data_dir: Path) -> tuple[str, str, str]:
    """A project and a 1-node cluster; (node id, node token, hostname) once it is ready."""
    from gpufleet.sim.models import USER_DATA_TOKEN
    from gpufleet.sim.world import SimWorld

    headers = {"authorization": f"Bearer {owner}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as api:
        (await api.post("/api/v1/projects", json={"name": "bench"})).raise_for_status()
        r = await api.post(
            "/api/v1/clusters",
            json={
                "project": "bench",
                "name": "detect",
                "size": 1,
                "gpus_per_node": 8,
                "acceptance_tests": False,  # measured here: detection, not acceptance
            },
        )
        r.raise_for_status()
        cid = str(r.json()["id"])
        deadline = time.monotonic() + 60
        while True:
            r = await api.get(f"/api/v1/clusters/{cid}")
            r.raise_for_status()
            status = str(r.json()["status"])
            if status == "ready":
                break
            if status in ("failed", "deleting", "deleted") or time.monotonic() > deadline:
                raise RuntimeError(f"cluster {cid} is {status!r}")
            await asyncio.sleep(0.2)
        r = await api.get("/api/v1/nodes", params={"cluster": cid})
        r.raise_for_status()
        [node] = r.json()["items"]
    world = SimWorld(data_dir / "sim-world.json")
    [inst] = [i for i in world.list_instances() if i.cluster_id == cid]
    return str(node["id"]), inst.user_data[USER_DATA_TOKEN], inst.hostname


async def wait_finding(
    api: httpx.AsyncClient, node: str, sig: str, pci: str, *, poll_s: float, timeout_s: float
) -> float | None:
    """Seconds (monotonic) when the finding showed up, or None on timeout."""
    deadline = time.monotonic() + timeout_s
    params = {"node": node, "signature": sig, "limit": "1000"}
    while time.monotonic() < deadline:
        r = await api.get("/api/v1/findings", params=params)
        seen = time.perf_counter()
        if r.status_code == 200 and any(f["pci_bus_id"] == pci for f in r.json()["items"]):
            return seen
        await asyncio.sleep(poll_s)
    return None


async def measure(
    args: argparse.Namespace, url: str, owner: str, data_dir: Path, work: Path
) -> None:
    node, token, hostname = await create_node(url, owner, data_dir)
    log = work / "kern.log"
    log.write_text("[    0.000000] Linux version 6.8.0 (bench)\n")
    agent = Agent(url=url, token=token, hostname=hostname, log=log, work=work)
    try:
        headers = {"authorization": f"Bearer {owner}"}
        limits = httpx.Limits(max_keepalive_connections=2)
        async with httpx.AsyncClient(
            base_url=url, headers=headers, timeout=10, limits=limits
        ) as api:
            # Warm-up: the agent starts at the end of the file; wait until it follows.
            ready = time.monotonic() + 60
            warm = 0
            while True:
                if agent.proc.poll() is not None:
                    raise RuntimeError(f"agent exited\n{agent.log_tail()}")
                sig, pci, line = fault(args.count + warm)
                with log.open("a") as f:
                    f.write(line)
                if await wait_finding(api, node, sig, pci, poll_s=0.05, timeout_s=3) is not None:
                    break
                warm += 1
                if time.monotonic() > ready:
                    raise RuntimeError(f"no finding after 60 s\n{agent.log_tail()}")
            print(f"agent following after {warm + 1} warm-up line(s)")

            floor: list[float] = []
            ready_rt: list[float] = []
            for _ in range(200):
                t0 = time.perf_counter()
                r = await api.get("/api/v1/findings", params={"node": node, "signature": "none"})
                floor.append(time.perf_counter() - t0)
                r.raise_for_status()
                t0 = time.perf_counter()
                (await api.get("/readyz")).raise_for_status()
                ready_rt.append(time.perf_counter() - t0)

            latencies: list[float] = []
            lost = 0
            rng = random.Random(args.seed)
            poll_s = args.poll_ms / 1000
            began = time.monotonic()
            fd = os.open(log, os.O_WRONLY | os.O_APPEND)
            try:
                for k in range(args.count):
                    sig, pci, line = fault(k)
                    data = line.encode()
                    t0 = time.perf_counter()
                    os.write(fd, data)
                    seen = await wait_finding(
                        api, node, sig, pci, poll_s=poll_s, timeout_s=args.timeout
                    )
                    if seen is None:
                        lost += 1
                    else:
                        latencies.append(seen - t0)
                    # A random pause, so injections do not all land at the same phase of
                    # anything periodic (the agent follows the file through inotify; its
                    # fallback polls every 200 ms where inotify is missing).
                    await asyncio.sleep(rng.uniform(0, args.jitter_ms) / 1000)
            finally:
                os.close(fd)
            wall = time.monotonic() - began
            total_open = 0
            cursor: str | None = None
            for _ in range(100):  # pages of 1,000
                params = {"node": node, "limit": "1000", **({"cursor": cursor} if cursor else {})}
                r = await api.get("/api/v1/findings", params=params)
                r.raise_for_status()
                page = r.json()
                total_open += len(page["items"])
                cursor = page.get("next_cursor")
                if not cursor:
                    break
    finally:
        agent.stop()
    follower = await follower_latencies(work, count=min(args.count, 300), seed=args.seed)

    print()
    print(f"injections: {args.count} in {wall:.1f} s, poll every {args.poll_ms} ms, db {args.db}")
    print(f"target: p99 ≤ {TARGET_P99_S * 1000:.0f} ms (line written → finding in GET /findings)")
    print()
    print(f"| {'ms':<38} | {'p50':>7} | {'p90':>7} | {'p99':>7} | {'max':>7} | {'n':>5} |")
    print("|" + "-" * 40 + "|---------|---------|---------|---------|-------|")
    print(stats_line("detection (write → API)", latencies))
    print(stats_line("baseline: GET /findings (empty), RTT", floor))
    print(stats_line("baseline: GET /readyz, RTT", ready_rt))
    print(stats_line("file follower alone (in-process)", follower))
    print()
    p99 = percentile(sorted(latencies), 99) if latencies else float("nan")
    verdict = "meets" if p99 <= TARGET_P99_S else "misses"
    print(
        f"p99 {p99 * 1000:.1f} ms {verdict} the target; {lost} injection(s) not seen within "
        f"{args.timeout:.0f} s; findings listed for the node at the end: {total_open}"
    )


async def follower_latencies(work: Path, *, count: int, seed: int) -> list[float]:
    """Write → event from the agent's ``KernelLogFollower`` on ``FileTail``, run in this
    process with an ``emit`` that only timestamps: the follower's share of detection
    (inotify wake-up, read, match), without the spool, the POST and the server."""
    from gpufleet.agent.collectors.base import Event
    from gpufleet.agent.collectors.kmsg import FileTail, KernelLogFollower

    log = work / "follower.log"
    log.write_text("")
    seen: asyncio.Queue[float] = asyncio.Queue()

    async def emit(events: list[Event]) -> None:
        stamp = time.perf_counter()
        for _ in events:
            seen.put_nowait(stamp)

    follower = KernelLogFollower(FileTail(log, work / "follower-state.json"))
    task = asyncio.create_task(follower.run(emit))
    rng = random.Random(seed)
    out: list[float] = []
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        await asyncio.sleep(0.2)  # real sleep: let the follower open the file and watch it
        for k in range(count):
            data = fault(k)[2].encode()
            t0 = time.perf_counter()
            os.write(fd, data)
            with contextlib.suppress(TimeoutError):
                out.append(await asyncio.wait_for(seen.get(), 10) - t0)
            await asyncio.sleep(rng.uniform(0, 0.02))
    finally:
        os.close(fd)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return out


async def amain(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-detect-"))
    pg_db: str | None = None
    server: ServerProcess | None = None
    try:
        env = {
            "GPUFLEET_SIM_AGENTS": "false",
            "GPUFLEET_RUN_WORKERS": "true",
            "GPUFLEET_SIM_PROVISION_DELAY_S": "[0, 0]",
            "GPUFLEET_REPLICA_ID": "bench-detect",
        }
        if args.db == "postgres":
            check_loopback(args.pg_url)
            pg_db = new_pg_database_name()
            await pg_create_database(args.pg_url, pg_db)
            env["GPUFLEET_DATABASE_URL"] = pg_url_with_database(args.pg_url, pg_db)
        server = ServerProcess(data_dir=tmp / "data", env_overrides=env)
        server.start()
        owner = server.wait_ready(timeout_s=60)
        work = tmp / "agent"
        work.mkdir()
        await measure(args, server.url, owner, server.data_dir, work)
        return 0
    except Exception as exc:  # noqa: BLE001 - print what failed, clean up, exit 1
        print(f"run failed: {exc!r}")
        if server is not None:
            print(server.log_tail())
        return 1
    finally:
        if server is not None:
            server.stop()
        if pg_db is not None:
            with contextlib.suppress(Exception):
                await pg_drop_database(args.pg_url, pg_db)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=1000, help="injections (default 1000)")
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--poll-ms", type=float, default=5.0, help="API poll interval (default 5)")
    ap.add_argument(
        "--jitter-ms", type=float, default=250.0, help="random pause between injections, 0..N"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0, help="per injection, seconds")
    args = ap.parse_args()
    if not 1 <= args.count <= len(XIDS) * 256 * 32:
        raise SystemExit(f"--count must be 1..{len(XIDS) * 256 * 32} (distinct fold keys)")
    for line in machine_lines():
        print(line)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
