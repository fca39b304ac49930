"""Slurm reads over slurmrestd next to the CLI, on the Slurm lab, in the same run.

    python bench/slurm_rest.py [--lab-dir DIR] [--nodes 3] [--repeat 50]

With ``--lab-dir`` it uses the lab running there (``deploy/slurm-lab/slurm-lab up``);
without, it starts a fresh lab in a temp dir on free ports and purges it at the end
(root and the Slurm packages needed, as for the tests). One job runs on the first node so
the answers are not all-idle. Then, round-robin so that load on the machine hits every
contender alike, ``--repeat`` times each (after one warm-up call each):

* ``sinfo --all --json``: the command the CLI driver runs for nodes, as a subprocess;
* ``GET /slurm/v0.0.38/nodes`` over the unix socket (local auth), on the driver's
  client (kept-alive connection), body read, not parsed;
* ``list_nodes()`` of the CLI driver (``sinfo --all --json`` + ``squeue --all --json``
  at once, parsed);
* ``list_nodes()`` over slurmrestd: unix socket (local auth), TCP with a JWT.

Prints min / p50 / p90 in milliseconds. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_lines, percentile
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.schedulers.slurm.rest import SlurmRest
from gpufleet.testing.slurm_lab import SlurmLab, free_port_base


async def sinfo_json(env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        "sinfo",
        "--all",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0 or b'"nodes"' not in out:
        raise RuntimeError(f"sinfo --json failed: {err.decode(errors='replace')}")


async def measure(lab: SlurmLab, repeat: int) -> dict[str, list[float]]:
    env = {**os.environ, **lab.env(), "PATH": os.environ.get("PATH", "") + ":/usr/sbin"}
    socket_url = f"unix://{lab.rest_socket}"
    cli = SlurmScheduler(SlurmConfig(env=lab.env()))
    over_socket = SlurmScheduler(SlurmConfig(env=lab.env(), rest_url=socket_url))
    over_tcp = SlurmScheduler(
        SlurmConfig(env=lab.env(), rest_url=lab.rest_url, rest_token=lab.jwt(lifespan_s=3600))
    )
    raw = SlurmRest(SlurmConfig(rest_url=socket_url))

    async def raw_get() -> None:
        await raw.get("nodes")

    contenders: dict[str, Callable[[], Awaitable[object]]] = {
        "sinfo --all --json (subprocess)": lambda: sinfo_json(env),
        "GET /slurm/v0.0.38/nodes (unix socket)": raw_get,
        "list_nodes() CLI (sinfo + squeue)": cli.list_nodes,
        "list_nodes() REST, unix socket": over_socket.list_nodes,
        "list_nodes() REST, TCP + JWT": over_tcp.list_nodes,
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for call in contenders.values():
        await call()  # warm-up: version probe, connection, page cache
    if await over_socket.list_nodes() != await cli.list_nodes():
        print("warning: REST and CLI disagreed once (a node changed between the calls?)")
    for _ in range(repeat):
        for name, call in contenders.items():
            start = time.perf_counter()
            await call()
            times[name].append((time.perf_counter() - start) * 1000)
    for sched in (over_socket, over_tcp):
        await sched.aclose()
    await raw.aclose()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab-dir", type=Path, help="a running lab to use (else a fresh one)")
    parser.add_argument("--nodes", type=int, default=3, help="nodes of a fresh lab")
    parser.add_argument("--repeat", type=int, default=50, help="calls per contender")
    args = parser.parse_args()

    fresh = args.lab_dir is None
    if fresh:
        base = free_port_base(nodes=args.nodes)
        lab = SlurmLab(
            dir=Path(tempfile.mkdtemp(prefix="gpufleet-bench-lab-", dir="/tmp")),
            nodes=args.nodes,
            port_base=base,
            first_job_id=(base // 200) * 1000 + 1,
        )
    else:
        lab = SlurmLab(dir=args.lab_dir, nodes=args.nodes)
    try:
        lab.up()
        job = lab.run(
            "sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", "--gres=gpu:1",
            "-w", lab.node_names[0], "--wrap=sleep 600",
        ).stdout.strip()  # fmt: skip
        try:
            times = asyncio.run(measure(lab, args.repeat))
        finally:
            lab.run("scancel", job, check=False)
        for line in machine_lines():
            print(line)
        print(f"lab: {lab.dir}, Slurm {lab.version}, {lab.nodes} nodes, {args.repeat} calls each")
        print(f"{'':42} {'min':>8} {'p50':>8} {'p90':>8}  (ms)")
        for name, values in times.items():
            values.sort()
            print(
                f"{name:42} {values[0]:8.2f} {percentile(values, 50):8.2f} "
                f"{percentile(values, 90):8.2f}"
            )
    finally:
        if fresh:
            lab.purge()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
