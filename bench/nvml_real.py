"""The agent's NVML collector and detectors on a real GPU: what one sample holds, whether a
healthy GPU raises any finding (idle, then under load), and what a sampling cycle costs.

    python bench/nvml_real.py --out DIR [--idle-s 20] [--load-s 30]

Needs an NVIDIA driver (libnvidia-ml) and nvidia-ml-py; the load phase needs PyTorch
with CUDA (a bf16 matrix product loop in a child process) and is skipped, saying so,
without it. Only ``gpufleet.agent`` and ``gpufleet.core`` are imported (the agent's base
install), so it runs with ``PYTHONPATH=src`` beside pydantic and pydantic-settings.

Writes to ``--out``: ``sample-idle.json`` and ``sample-load.json`` (every field of the
first GPU's sample, its conditions), ``findings.json`` (every finding change the
detectors made over both phases: on a healthy GPU, none), and prints the cost of one
``collect`` (CPU ms: the process's user+system time over the cycles; wall ms, p50 and
p99) against a baseline measured in the same run: the same number of cycles of
``nvmlDeviceGetCount`` alone (the least one NVML call costs), and the process's RSS.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.agent.collectors.base import CollectorResult
from gpufleet.agent.collectors.nvml import NvmlCollector
from gpufleet.agent.detectors import Detector

_LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
c = a @ b
torch.cuda.synchronize()
print("loaded", flush=True)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
"""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _dump(result: CollectorResult) -> dict[str, Any]:
    sample = next((s for s in result.samples if s.scope == "gpu"), None)
    return {
        "sample": None
        if sample is None
        else {
            "gpu_index": sample.gpu_index,
            "gpu_uuid": sample.gpu_uuid,
            "pci_bus_id": sample.pci_bus_id,
            "serial": sample.serial,
            "model": sample.model,
            "values": dict(sorted(sample.values.items())),
        },
        "conditions": [
            {"condition": c.condition, "active": c.active, "evidence": c.evidence}
            for c in result.conditions
        ],
        "events": [{"signature": e.signature_id, "evidence": e.evidence} for e in result.events],
    }


def _util(dumped: dict[str, Any]) -> float:
    sample = dumped.get("sample") or {}
    return float(sample.get("values", {}).get("utilization_pct", 0.0))


def _phase(
    collector: NvmlCollector,
    detector: Detector,
    seconds: float,
    findings: list[dict[str, Any]],
    *,
    busiest: bool = False,
) -> tuple[dict[str, Any], list[float], float]:
    """Sample at 1 Hz for ``seconds``; returns the first result (the busiest GPU sample
    with ``busiest``), wall ms per collect, and CPU seconds spent in collect."""
    first: dict[str, Any] | None = None
    walls: list[float] = []
    cpu = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = dt.datetime.now(dt.UTC)
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        result = collector.collect_sync(now)
        walls.append((time.perf_counter() - wall0) * 1000)
        cpu += _cpu_s() - cpu0
        dumped = _dump(result)
        if first is None or (busiest and _util(dumped) > _util(first)):
            first = dumped
        for change in detector.observe(result, now) + detector.tick(now):
            findings.append(change.model_dump(mode="json"))
        time.sleep(max(0.0, 1.0 - walls[-1] / 1000))
    assert first is not None
    return first, walls, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--load-s", type=float, default=30.0)
    parser.add_argument("--cycles", type=int, default=300, help="tight-loop cycles for cost")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    collector = NvmlCollector()
    detector = Detector()
    findings: list[dict[str, Any]] = []

    idle, idle_walls, _ = _phase(collector, detector, args.idle_s, findings)
    (args.out / "sample-idle.json").write_text(json.dumps(idle, indent=2))
    load_proc = None
    try:
        load_proc = subprocess.Popen(
            [sys.executable, "-c", _LOAD.format(seconds=args.load_s + 10)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert load_proc.stdout is not None
        load_proc.stdout.readline()  # "loaded": the first product ran (or it died: "")
        time.sleep(2)
        loaded, load_walls, _ = _phase(collector, detector, args.load_s, findings, busiest=True)
        (args.out / "sample-load.json").write_text(json.dumps(loaded, indent=2))
    except OSError as exc:
        print(f"load phase skipped: {exc}")
        loaded, load_walls = {}, []
    finally:
        if load_proc is not None:
            load_proc.wait(timeout=args.load_s + 60)
    (args.out / "findings.json").write_text(json.dumps(findings, indent=2))

    # Cost: a tight loop of collects against the least NVML call, same process.
    nvml = collector._nvml  # the module the collector loaded
    if idle.get("sample") is None:
        print(f"no NVML on this machine: {idle['conditions']}")
        return
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    for _ in range(args.cycles):
        collector.collect_sync(dt.datetime.now(dt.UTC))
    collect_cpu = (_cpu_s() - cpu0) / args.cycles * 1000
    collect_wall = (time.perf_counter() - wall0) / args.cycles * 1000
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    for _ in range(args.cycles):
        nvml.nvmlDeviceGetCount()
    base_cpu = (_cpu_s() - cpu0) / args.cycles * 1000
    base_wall = (time.perf_counter() - wall0) / args.cycles * 1000

    gpus = len([s for s in (idle.get("sample"),) if s])
    print(f"GPU: {(idle.get('sample') or {}).get('model')} ({gpus} sampled), pid {os.getpid()}")
    print(f"{'':<34} {'CPU ms':>8} {'wall ms':>8}")
    print(f"{'collect() (tight loop)':<34} {collect_cpu:>8.2f} {collect_wall:>8.2f}")
    print(f"{'nvmlDeviceGetCount (baseline)':<34} {base_cpu:>8.3f} {base_wall:>8.3f}")
    for label, walls in (
        ("collect() idle, 1 Hz", idle_walls),
        ("collect() under load", load_walls),
    ):
        if walls:
            p99 = sorted(walls)[min(len(walls) - 1, int(0.99 * len(walls)))]
            print(f"{label:<34} {'':>8} p50 {statistics.median(walls):.2f} / p99 {p99:.2f}")
    print(f"RSS {_rss_mib():.1f} MiB; finding changes over both phases: {len(findings)}")
    for finding in findings:
        print(f"  {finding['state']} {finding['signature_id']}: {finding['evidence'][:120]}")
    if loaded.get("sample"):
        values = loaded["sample"]["values"]
        shown = {
            k: values[k]
            for k in sorted(values)
            if k
            in ("utilization_pct", "power_w", "temperature_c", "sm_clock_mhz", "memory_used_mib")
        }
        print(f"under load: {shown}")


if __name__ == "__main__":
    main()
