"""Check-output parse throughput, next to the cheapest pass over the same text, same run.

    python bench/check_parsers.py [--nccl-mb 32] [--dcgm-mb 16] [--burn-mb 24] [--repeat 3]

Generates, in memory, outputs as large as real ones get:

* nccl-tests: a 128-rank (16 nodes × 8 GPUs) all_reduce_perf ``-b 8 -e 8G -f 2`` run
  with ``NCCL_DEBUG=INFO`` chatter (about 40 INFO lines per rank at start-up, as NCCL
  prints) and ``mpirun --tag-output`` prefixes, repeated (one run after another, as a
  soak test writes them) up to ``--nccl-mb``. Baseline: ``text.splitlines()``.
* dcgmi diag: ``dcgmi diag -r 4 -j --iterations N`` on 8 GPUs, DCGM 4.x layout, info
  strings as DCGM writes them, N chosen to reach ``--dcgm-mb``. Baseline: ``json.loads``
  of the same text (the parser does that plus the walk).
* gpu-burn: an 8-GPU hour-long run as a file captures it, every progress repaint kept
  (``\\r``, about 70 per 0.1 %), up to ``--burn-mb``. Baseline: ``text.splitlines()``.

Each contender runs ``--repeat`` times; the best time counts. MB/s = text size / time;
"× baseline" = parser time / baseline time. Nothing is asserted; it prints and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from gpufleet.checks.dcgm import parse_dcgm_diag
from gpufleet.checks.gpuburn import parse_gpu_burn
from gpufleet.checks.nccl import parse_nccl

MB = 1_000_000
RNG = random.Random(7)


def nccl_run(nodes: int = 16, gpus: int = 8) -> str:
    out = []
    ranks = nodes * gpus
    for r in range(ranks):
        host, dev = f"gpu-{r // gpus:03d}", r % gpus
        for k in range(40):
            out.append(
                f"{host}:{4000 + r}:{4100 + r} [{dev}] NCCL INFO Channel {k:02d}/32 : "
                f"{r} {(r + 1) % ranks} via P2P/IPC/read"
            )
    out += [
        "# nccl-tests version 2.19.7 nccl-headers=22907 nccl-library=22907",
        "# Collective test starting: all_reduce_perf",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    out += [
        f"#  Rank {r:3d} Group  0 Pid {4000 + r:6d} on  gpu-{r // gpus:03d} device  "
        f"{r % gpus} [0000:{0x1B + r % gpus:02x}:00] NVIDIA H100 80GB HBM3"
        for r in range(ranks)
    ]
    out += [
        "#",
        "#                                                              out-of-place"
        "                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
        "            (us)  (GB/s)  (GB/s)",
    ]
    size = 8
    while size <= 8 << 30:
        t = 30 + size / 2.4e5 * RNG.uniform(0.97, 1.03)
        alg = size / t / 1e3
        bus = alg * 2 * (ranks - 1) / ranks
        out.append(
            f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:7.1f}  "
            f"{alg:6.2f}  {bus:6.2f}      0  {t:7.1f}  {alg:6.2f}  {bus:6.2f}      0"
        )
        size *= 2
    out += [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 101.237",
        "#",
        "# Collective test concluded: all_reduce_perf",
        "",
    ]
    return "".join(f"[1,{i % ranks}]<stdout>:{line}\n" for i, line in enumerate(out))


def dcgm_iteration(gpus: int = 8) -> dict[str, object]:
    def results(name: str) -> list[dict[str, object]]:
        return [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entity_id": g,
                "status": "Pass",
                "info": [
                    f"GPU {g} {name}: allocated space for 138 output matricies from "
                    f"76077622886 bytes available.",
                    "Running with precisions: FP64 1, FP32 1, FP16 1",
                    f"GPU {g} calculated at approximately "
                    f"{RNG.uniform(850, 870):.2f} gigaflops during this test",
                ],
            }
            for g in range(gpus)
        ]

    categories = {
        "Deployment": ["software"],
        "Integration": ["pcie"],
        "Hardware": ["memory", "diagnostic", "nvbandwidth"],
        "Stress": [
            "memory_bandwidth",
            "targeted_stress",
            "targeted_power",
            "memtest",
            "pulse_test",
        ],
    }
    return {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": c,
                    "tests": [
                        {"name": n, "results": results(n), "test_summary": {"status": "Pass"}}
                        for n in names
                    ],
                }
                for c, names in categories.items()
            ]
        },
        "entity_groups": [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entities": [
                    {"entity_id": g, "device_id": "2330", "serial_num": f"165432{g:04d}"}
                    for g in range(gpus)
                ],
            }
        ],
        "metadata": {"version": "4.2.3", "Driver Version Detected": "570.124.06"},
    }


def dcgm_text(target_bytes: int) -> str:
    one = len(json.dumps(dcgm_iteration(), indent=4))
    count = max(1, target_bytes // one)
    doc = {"iterations": [dcgm_iteration() for _ in range(count)], "Overall Result": "Pass"}
    return "Successfully ran diagnostic for group.\n" + json.dumps(doc, indent=4) + "\n"


def burn_text(target_bytes: int, gpus: int = 8) -> str:
    parts = [
        f"GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-{g:08d}-0000-4000-8000-000000000000)\n"
        for g in range(gpus)
    ]
    parts += ["Using compare file: compare.ptx\n", "Burning for 3600 seconds.\n"]
    parts += [
        f"Initialized device {g} with 81008 MB of memory (80361 MB available, using "
        "72325 MB of it), using FLOATS, using Tensor Cores\n"
        for g in range(gpus)
    ]
    size, step, done = sum(map(len, parts)), 0, [0] * gpus
    temps = " - ".join(f"{61 + g % 4} C" for g in range(gpus))
    while size < target_bytes:
        step += 1
        for g in range(gpus):
            done[g] += 7
        line = (
            f"{min(100.0, step / 700):.1f}%  proc'd: "
            + " - ".join(f"{d} ({51000 + g * 13} Gflop/s)" for g, d in enumerate(done))
            + "   errors: "
            + " - ".join("0" for _ in range(gpus))
            + f"   temps: {temps} \r"
        )
        if step % 7000 == 0:
            line += "\n\tSummary at:   Mon Jun  2 10:00:00 UTC 2025\n\n"
        parts.append(line)
        size += len(line)
    parts.append("\nKilling processes with SIGTERM (soft kill)\ndone\n\nTested 8 GPUs:\n")
    parts += [f"\tGPU {g}: OK\n" for g in range(gpus)]
    return "".join(parts)


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nccl-mb", type=float, default=32.0)
    ap.add_argument("--dcgm-mb", type=float, default=16.0)
    ap.add_argument("--burn-mb", type=float, default=24.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    run = nccl_run()
    nccl = run * max(1, int(args.nccl_mb * MB // len(run)))
    dcgm = dcgm_text(int(args.dcgm_mb * MB))
    burn = burn_text(int(args.burn_mb * MB))

    rows = [
        ("nccl-tests", nccl, lambda: parse_nccl(nccl), "str.splitlines()", nccl.splitlines),
        (
            "dcgmi diag -j",
            dcgm,
            lambda: parse_dcgm_diag(dcgm),
            "json.loads()",
            lambda: json.loads(dcgm[dcgm.index("{") :]),
        ),
        ("gpu-burn", burn, lambda: parse_gpu_burn(burn), "str.splitlines()", burn.splitlines),
    ]
    # A sanity check that the inputs are what the parsers expect (not a timing).
    assert parse_nccl(nccl).passed and parse_dcgm_diag(dcgm).passed and parse_gpu_burn(burn).passed
    print(f"best of {args.repeat}; MB = 10^6 bytes\n")
    print(
        f"{'output':<15} {'size MB':>8} {'parser s':>9} {'parser MB/s':>12} "
        f"{'baseline':<17} {'base s':>8} {'base MB/s':>10} {'× baseline':>11}"
    )
    for name, text, parse, base_name, base in rows:
        mb = len(text.encode()) / MB
        t_parse, t_base = best(parse, args.repeat), best(base, args.repeat)
        print(
            f"{name:<15} {mb:8.1f} {t_parse:9.3f} {mb / t_parse:12.1f} {base_name:<17} "
            f"{t_base:8.3f} {mb / t_base:10.1f} {t_parse / t_base:11.1f}"
        )


if __name__ == "__main__":
    main()
