"""Agent overhead: CPU per sampling cycle and RSS, 8 GPUs at 1 Hz, next to a bare Python.

    python bench/agent.py [--duration 60] [--warmup 5] [--gpus 8]

The real server in a subprocess (SQLite in a temp dir) with a 1-node sim cluster
(``GPUFLEET_SIM_AGENTS=false``), and the real agent (``gpufleet agent``) in a subprocess
with the node's token: collectors ``sim`` (8 simulated GPUs through the sim collector,
not NVML: no NVIDIA driver here) and ``kmsg`` following a temp file (polled every 200 ms),
sampling every 1 s and sending a metrics report every 10 s, as deployed. After
``--warmup`` seconds the bench reads the agent's CPU time and RSS from /proc for
``--duration`` seconds (RSS every second). Baselines in the same run, measured over the
same window: ``python -c 'while True: time.sleep(1)'``, and the same loop after
``import gpufleet.agent.main`` (what importing the agent's code costs in memory).

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

from _common import ServerProcess, machine_lines, process_cpu_s
from detection import Agent, create_node

TARGET_CORE_PCT = 0.5
TARGET_RSS_MB = 60.0
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
            },
        )
        for code in (SLEEPER, SLEEPER_IMPORTS):
            sleepers.append(spawn_python(code))
        await asyncio.sleep(args.warmup)
        if agent.proc.poll() is not None:
            raise RuntimeError(f"agent exited\n{agent.log_tail()}")
        watches = [
            Watch("agent (sim 8 GPUs + kmsg file)", agent.proc.pid),
            Watch("baseline: python sleep(1) loop", sleepers[0].pid),
            Watch("baseline: same + import gpufleet.agent", sleepers[1].pid),
        ]
        server_cpu0 = process_cpu_s(server.pid or 0)
        for w in watches:
            w.start()
        t0 = time.monotonic()
        for _ in range(int(args.duration)):
            await asyncio.sleep(1.0)
            for w in watches:
                w.tick()
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
    args = ap.parse_args()
    if not 1 <= args.duration <= 3600:
        raise SystemExit("--duration must be 1..3600 s")
    for line in machine_lines():
        print(line)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
