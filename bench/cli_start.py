"""How fast the CLI starts: ``gpufleet --help`` and ``gpufleet nodes list`` against the
demo, each against ``python -c pass`` (the interpreter's own start) in the same run.

    .venv/bin/python bench/cli_start.py [--runs 15]

Starts ``gpufleet demo`` on a free port in a scratch dir, waits until it answers, then
times each command ``--runs`` times in a child process (wall time, median and p90).
Targets (issue 19): ``--help`` ≤ 150 ms, ``nodes list`` ≤ 400 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_lines, percentile
from gpufleet.testing.processes import ServerProcess, free_port, printed_value

GPUFLEET = [sys.executable, "-c", "from gpufleet.cli.main import run; run()"]


def timed(argv: list[str], *, runs: int, env: dict[str, str]) -> list[float]:
    """Wall seconds of ``runs`` runs of ``argv`` (after one warm-up run), sorted."""
    subprocess.run(argv, env=env, capture_output=True, check=True, timeout=60)
    out: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True, timeout=60)
        out.append(time.perf_counter() - started)
    return sorted(out)


def row(what: str, times: list[float], base: float) -> str:
    median = statistics.median(times)
    return (
        f"{what:<34} {median * 1000:7.0f} ms {percentile(times, 90) * 1000:7.0f} ms "
        f"{(median - base) * 1000:+8.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = {**os.environ}
    with tempfile.TemporaryDirectory(prefix="gpufleet-cli-bench-") as tmp:
        port = free_port()
        demo = ServerProcess(
            args=["demo", "--port", str(port), "--data-dir", str(Path(tmp) / "demo")],
            env={"GPUFLEET_DATABASE_URL": "", "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0"},
            log_path=Path(tmp) / "demo.log",
        )
        demo.start()
        try:
            url = printed_value(demo, "GPUFLEET_URL", timeout_s=60)
            token = printed_value(demo, "GPUFLEET_TOKEN")
            demo.wait_ready(url)
            cli_env = {**env, "GPUFLEET_URL": url, "GPUFLEET_TOKEN": token}
            base = timed([sys.executable, "-c", "pass"], runs=args.runs, env=env)
            helped = timed([*GPUFLEET, "--help"], runs=args.runs, env=env)
            listed = timed([*GPUFLEET, "nodes", "list"], runs=args.runs, env=cli_env)
        finally:
            demo.stop()
    base_median = statistics.median(base)
    for line in machine_lines():
        print(line)
    print(f"{args.runs} runs each, wall time of a child process; the demo on 127.0.0.1")
    print(f"{'command':<34} {'median':>10} {'p90':>10} {'over python':>11}")
    print("-" * 70)
    print(row("python -c pass (baseline)", base, base_median))
    print(row("gpufleet --help", helped, base_median) + "   (target ≤ 150 ms)")
    print(row("gpufleet nodes list", listed, base_median) + "   (target ≤ 400 ms)")


if __name__ == "__main__":
    main()
