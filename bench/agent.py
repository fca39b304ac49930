"""Agent overhead: CPU per sampling cycle and RSS, 8 GPUs at 1 Hz, next to a bare Python;
and the time of one /metrics scrape, next to a floor.

    python bench/agent.py [--duration 60] [--warmup 5] [--gpus 8] [--scrape-interval 15]
                          [--scrapes 50]

The real server in a subprocess (SQLite in a temp dir) with a 1-node sim cluster
(``GPUFLEET_SIM_AGENTS=false``), and the real agent (``gpufleet agent``) in a subprocess
with the node's token: collectors ``sim`` (8 simulated GPUs through the sim collector,
not NVML: no NVIDIA driver here) and ``kmsg`` following a temp file (polled every 200 ms),
sampling every 1 s and sending a metrics report every 10 s, as deployed, with the
exporter on: /metrics reads the host-I/O trees of tests/fixtures/hostio (one HCA with 2
ports, NICs, diskstats, two NFS mounts, two Lustre clients) and the bench scrapes it every
``--scrape-interval`` seconds during the window, as Prometheus would. After
``--warmup`` seconds the bench reads the agent's CPU time and RSS from /proc for
``--duration`` seconds (RSS every second). Baselines in the same run, measured over the
same window: ``python -c 'while True: time.sleep(1)'``, and the same loop after
``import gpufleet.agent.main`` (what importing the agent's code costs in memory).

Scrape time, after the window: ``--scrapes`` GETs of the agent's /metrics (8 GPUs + host
I/O) over HTTP, next to the same GETs of a static server that answers the same bytes (the
HTTP floor); and, in this process, ``exporter.scrape()`` of an 8-GPU agent with the
fixture trees (files read in a thread, text rendered), next to ``render()`` without host
I/O (what /metrics cost before the host series).

Nothing is asserted; figures are printed. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ServerProcess, free_port, machine_lines, percentile, process_cpu_s
from detection import Agent, create_node

TARGET_CORE_PCT = 0.5
TARGET_RSS_MB = 60.0
TARGET_SCRAPE_MS = 10.0
HOSTIO = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hostio"
# The HTTP floor: answers every request with the bytes in argv[1], as the agent does.
STATIC_SERVER = """
import asyncio, sys
BODY = open(sys.argv[1], "rb").read()
HEAD = b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain; version=0.0.4\\r\\n"
async def handle(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(HEAD + b"Content-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(BODY))
    writer.write(BODY)
    await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[2]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""
SLEEPER = "import time\nwhile True:\n    time.sleep(1)\n"
SLEEPER_IMPORTS = "import gpufleet.agent.main\n" + SLEEPER


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB (10^6 bytes) of a live process; NaN if gone."""
    rss = hwm = float("nan")
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024 / 1e6
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024 / 1e6
    return rss, hwm


def spawn_python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def spawn_static(body: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", STATIC_SERVER, str(body), str(port)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


async def http_get(port: int) -> tuple[float, bytes]:
    """(seconds, body) of one GET /metrics on a fresh connection, as Prometheus does."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
    data = await reader.read()
    elapsed = time.perf_counter() - t0
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET /metrics on {port}: {head[:80]!r}")
    return elapsed, body


async def wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await http_get(port)
            return
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def scrape_times(port: int, n: int) -> list[float]:
    return sorted([(await http_get(port))[0] for _ in range(n)])


async def in_process_scrapes(gpus: int, n: int, tmp: Path) -> tuple[list[float], list[float]]:
    """Seconds per ``scrape()`` with the fixture trees, and per ``render()`` without host
    I/O, of one 8-GPU agent built in this process (sim GPUs, sampled a few times)."""
    from gpufleet.agent.collectors.sim import SimCollector
    from gpufleet.agent.exporter import last_xid_from, render, scrape
    from gpufleet.agent.main import build_agent, build_host_reader
    from gpufleet.agent.settings import AgentSettings
    from gpufleet.client.agent import AgentClient

    settings = AgentSettings(
        node_token="bench",  # type: ignore[arg-type]
        state_dir=tmp / "inproc",
        metrics_listen=None,
        sys_root=HOSTIO / "sys",
        proc_root=HOSTIO / "proc",
    )
    client = AgentClient(base_url="http://127.0.0.1:1", node_token="bench")
    agent = build_agent(settings, client=client, collectors=[SimCollector(gpus=gpus)], sources=[])
    host = build_host_reader(settings)
    try:
        for _ in range(3):
            await agent.sample_once()
        with_host: list[float] = []
        bare: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await scrape(agent, hostname="bench-node", host=host)
            with_host.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            render(agent, hostname="bench-node", last_xid=last_xid_from(agent))
            bare.append(time.perf_counter() - t0)
        return sorted(with_host), sorted(bare)
    finally:
        agent.spool.close()
        await client.aclose()


def ms_row(name: str, times: list[float], extra: str = "") -> str:
    p50, p95 = percentile(times, 50) * 1000, percentile(times, 95) * 1000
    return f"| {name:<52} | {p50:7.2f} | {p95:7.2f} | {times[-1] * 1000:7.2f} | {extra:<22} |"


class Watch:
    def __init__(self, name: str, pid: int) -> None:
        self.name, self.pid = name, pid
        self.cpu0 = self.cpu1 = 0.0
        self.rss_max = 0.0
        self.rss_end = self.hwm = float("nan")

    def start(self) -> None:
        self.cpu0 = process_cpu_s(self.pid)

    def tick(self) -> None:
        rss, _ = rss_mb(self.pid)
        if rss == rss:
            self.rss_max = max(self.rss_max, rss)

    def end(self) -> None:
        self.cpu1 = process_cpu_s(self.pid)
        self.rss_end, self.hwm = rss_mb(self.pid)


async def amain(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-agent-"))
    server: ServerProcess | None = None
    agent: Agent | None = None
    sleepers: list[subprocess.Popen[bytes]] = []
    try:
        server = ServerProcess(
            data_dir=tmp / "data",
            env_overrides={
                "GPUFLEET_SIM_AGENTS": "false",
                "GPUFLEET_RUN_WORKERS": "true",
                "GPUFLEET_SIM_PROVISION_DELAY_S": "[0, 0]",
                "GPUFLEET_REPLICA_ID": "bench-agent",
            },
        )
        server.start()
        owner = server.wait_ready(timeout_s=60)
        _, token, hostname = await create_node(server.url, owner, server.data_dir)
        work = tmp / "agent"
        work.mkdir()
        log = work / "kern.log"
        log.write_text("[    0.000000] Linux version 6.8.0 (bench)\n")
        metrics_port = free_port()
        agent = Agent(
            url=server.url,
            token=token,
            hostname=hostname,
            log=log,
            work=work,
            collectors='["sim", "kmsg"]',
            extra_env={
                "GPUFLEET_AGENT_SIM_GPUS": str(args.gpus),
                "GPUFLEET_AGENT_SAMPLE_INTERVAL_S": "1.0",
                "GPUFLEET_AGENT_REPORT_INTERVAL_S": "10.0",
                "GPUFLEET_AGENT_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
                "GPUFLEET_AGENT_SYS_ROOT": str(HOSTIO / "sys"),
                "GPUFLEET_AGENT_PROC_ROOT": str(HOSTIO / "proc"),
            },
        )
        for code in (SLEEPER, SLEEPER_IMPORTS):
            sleepers.append(spawn_python(code))
        await wait_listening(metrics_port)
        await asyncio.sleep(args.warmup)
        if agent.proc.poll() is not None:
            raise RuntimeError(f"agent exited\n{agent.log_tail()}")
        watches = [
            Watch("agent (sim GPUs, kmsg, /metrics scraped)", agent.proc.pid),
            Watch("baseline: python sleep(1) loop", sleepers[0].pid),
            Watch("baseline: same + import gpufleet.agent", sleepers[1].pid),
        ]
        server_cpu0 = process_cpu_s(server.pid or 0)
        for w in watches:
            w.start()
        t0 = time.monotonic()
        scrapes_in_window = 0
        next_scrape = t0
        for _ in range(int(args.duration)):
            await asyncio.sleep(1.0)
            for w in watches:
                w.tick()
            if time.monotonic() >= next_scrape:
                await http_get(metrics_port)
                scrapes_in_window += 1
                next_scrape += args.scrape_interval
            if agent.proc.poll() is not None:
                raise RuntimeError(f"agent exited\n{agent.log_tail()}")
        wall = time.monotonic() - t0
        for w in watches:
            w.end()
        server_cpu = process_cpu_s(server.pid or 0) - server_cpu0

        cycles = wall * 1.0  # 1 Hz
        print()
        print(f"window: {wall:.1f} s = {cycles:.0f} sampling cycles at 1 Hz, {args.gpus} GPUs")
        print(f"target: ≤ {TARGET_CORE_PCT} % of one core, RSS ≤ {TARGET_RSS_MB:.0f} MB")
        print()
        print(
            f"| {'process':<40} | {'CPU s':>6} | {'ms/cycle':>8} | {'% core':>6} "
            f"| {'RSS max MB':>10} | {'RSS end MB':>10} | {'HWM MB':>7} |"
        )
        print("|" + "-" * 42 + "|--------|----------|--------|------------|------------|---------|")
        for w in watches:
            cpu = w.cpu1 - w.cpu0
            print(
                f"| {w.name:<40} | {cpu:6.2f} | {cpu / cycles * 1000:8.2f} "
                f"| {cpu / wall * 100:6.2f} | {w.rss_max:10.1f} | {w.rss_end:10.1f} "
                f"| {w.hwm:7.1f} |"
            )
        a, b = watches[0], watches[1]
        own = (a.cpu1 - a.cpu0) - (b.cpu1 - b.cpu0)
        print(
            f"| {'agent − bare python':<40} | {own:6.2f} | {own / cycles * 1000:8.2f} "
            f"| {own / wall * 100:6.2f} | {a.rss_max - b.rss_max:10.1f} "
            f"| {a.rss_end - b.rss_end:10.1f} | {a.hwm - b.hwm:7.1f} |"
        )
        print()
        print(
            f"agent total: {(a.cpu1 - a.cpu0) / wall * 100:.2f} % of one core "
            f"(target {TARGET_CORE_PCT} %), RSS max {a.rss_max:.1f} MB "
            f"(target {TARGET_RSS_MB:.0f} MB); server CPU in the window {server_cpu:.2f} s"
        )
        print("CPU is /proc/PID/stat utime+stime (clock ticks of 10 ms: ±0.01 s per reading)")
        print(
            f"/metrics was scraped {scrapes_in_window} times in the window "
            f"(every {args.scrape_interval:g} s), host-I/O trees of tests/fixtures/hostio"
        )

        cpu_before, wall_before = process_cpu_s(agent.proc.pid), time.monotonic()
        agent_times = await scrape_times(metrics_port, args.scrapes)
        scrape_cpu = process_cpu_s(agent.proc.pid) - cpu_before
        # less what its 1 Hz loop used meanwhile, at the window's rate
        scrape_cpu -= (a.cpu1 - a.cpu0) / wall * (time.monotonic() - wall_before)
        _, body = await http_get(metrics_port)
        body_file = tmp / "metrics.txt"
        body_file.write_bytes(body)
        static_port = free_port()
        sleepers.append(spawn_static(body_file, static_port))
        await wait_listening(static_port)
        static_times = await scrape_times(static_port, args.scrapes)
        inproc, bare = await in_process_scrapes(args.gpus, args.scrapes, tmp)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        print()
        print(
            f"scrape of an {args.gpus}-GPU node with host I/O: {args.scrapes} scrapes each, "
            f"{len(body) / 1024:.1f} KiB, {series} series; target ≤ {TARGET_SCRAPE_MS:g} ms"
        )
        print()
        print(f"| {'what':<52} | {'p50 ms':>7} | {'p95 ms':>7} | {'max ms':>7} | {'':<22} |")
        print("|" + "-" * 54 + "|---------|---------|---------|" + "-" * 24 + "|")
        print(ms_row("GET /metrics, agent subprocess", agent_times, "HTTP, fresh connection"))
        print(ms_row("baseline: GET of the same bytes, static server", static_times, "HTTP floor"))
        print(ms_row("scrape() in-process: host files + render", inproc, "thread hop included"))
        print(ms_row("baseline: render() without host I/O (before)", bare, "GPU + agent series"))
        own = percentile(agent_times, 50) - percentile(static_times, 50)
        print()
        print(
            f"agent's own time per scrape (p50 GET − p50 floor): {own * 1000:.2f} ms; "
            f"its CPU per scrape: {scrape_cpu / args.scrapes * 1000:.2f} ms "
            f"(utime+stime over the {args.scrapes} GETs ÷ {args.scrapes}, less the 1 Hz "
            f"loop's share; ±{10 / args.scrapes:.2f} ms); target {TARGET_SCRAPE_MS:g} ms"
        )
        return 0
    except Exception as exc:  # noqa: BLE001 - print what failed, clean up, exit 1
        print(f"run failed: {exc!r}")
        if server is not None:
            print(server.log_tail())
        return 1
    finally:
        for p in sleepers:
            p.kill()
            p.wait(timeout=10)
        if agent is not None:
            agent.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds (default 60)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    ap.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    ap.add_argument(
        "--scrape-interval",
        type=float,
        default=15.0,
        help="seconds between scrapes during the window (default 15, the Helm chart's)",
    )
    ap.add_argument("--scrapes", type=int, default=50, help="timed scrapes after it (default 50)")
    args = ap.parse_args()
    if not 1 <= args.duration <= 3600:
        raise SystemExit("--duration must be 1..3600 s")
    if args.scrape_interval <= 0 or not 1 <= args.scrapes <= 10_000:
        raise SystemExit("--scrape-interval must be > 0 and --scrapes 1..10000")
    for line in machine_lines():
        print(line)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
