"""Kernel-log scan throughput: gpufleet's matcher next to ``grep -F``, same file, same run.

    python bench/scan.py [--size-mb 1024] [--nvrm-share 0.01] [--repeat 3] [--jobs N]
                         [--keep PATH | --file PATH]

Generates a realistic kernel log (ordinary kernel lines in five timestamp styles, about
``--nvrm-share`` NVRM lines, of which some are Xids, a few mlx5/AER/SXid lines) in a temp
dir, reads it once so every contender starts from the page cache, then times:

* ``grep -F -c NVRM FILE`` (``-c``: ``grep ... > /dev/null`` stops at the first match,
  GNU grep treats a /dev/null stdout like ``-q``), in the caller's locale and ``LC_ALL=C``,
  and grep with the matcher's prefilter literals (what a prefilter has to find, in C);
* ``KernelLogMatcher.feed_bytes`` over the file in 4 MiB chunks, in this process, on
  each engine (``hyperscan``: the matcher stage, only lines holding a regex's required
  literal reach Python; the ``python`` fallback: every prefilter-token line does);
* ``gpufleet scan FILE -o json > /dev/null`` end to end (a subprocess: start-up, read,
  match, JSON; ``--jobs`` left at its default, one process per CPU for a file of 64 MiB
  or more), and with ``--jobs N`` when given (``--jobs 1``: one process);
* the scan's floor, what no per-line work can go below: its start-up (``gpufleet scan``
  of an empty file), and the prefilter's literal pass with the newline count over the
  ranges the scan splits the file into, one forked process each (in this process: no
  start-up, numpy already imported). The last line says what the 0.5× target leaves for
  the rest (the regex stage, each finding's prefix parse, match and JSON, the output).

Best of ``--repeat`` runs each; MB/s = file size / wall time. Nothing is asserted. The
targets (issue 19): ``gpufleet scan`` at least as fast as the literals' grep, and at
least half as fast as ``grep -F NVRM``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_lines
from gpufleet.core.signatures.prefilter import Engine, hyperscan_available

TARGET_RATIO = 0.5  # of grep -F NVRM
TARGET_LITERALS_RATIO = 1.0  # of grep -F with all the prefilter literals
BLOCK_BYTES = 4 << 20
CHUNK = 4 << 20  # gpufleet scan's chunk (cli/scan.py)
START_UP = "gpufleet scan EMPTY -o json (start-up)"
DISTINCT_BLOCKS = 8
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

# Ordinary kernel messages (no prefilter literal in any of them).
ORDINARY = (
    "usb {a}-{b}: new high-speed USB device number {n} using xhci_hcd",
    "EXT4-fs (nvme0n1p{a}): mounted filesystem with ordered data mode. Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth{a}: link becomes ready",
    'audit: type=1400 audit({t}:{n}): apparmor="STATUS" operation="profile_load" '
    'profile="unconfined" name="snap.lxd.activate" pid={p} comm="apparmor_parser"',
    "perf: interrupt took too long ({n} > {p}), lowering kernel.perf_event_max_sample_rate",
    "nvme nvme{a}: I/O {n} QID {b} timeout, completion polled",
    "systemd[1]: Started Session {n} of user root.",
    "br-{h}: port {a}(veth{h}) entered forwarding state",
    "TCP: request_sock_TCP: Possible SYN flooding on port {p}. Sending cookies.",
    "Out of memory: Killed process {p} (python3) total-vm:{n}kB, anon-rss:{n}kB, file-rss:0kB",
    "device veth{h} entered promiscuous mode",
    "docker0: port {a}(veth{h}) entered disabled state",
    "xfs filesystem being remounted at /var/lib/kubelet/pods/{h}/volumes supports timestamps",
    "igb 0000:{bus}:00.{a} eno{a}: igb: eno{a} NIC Link is Up 1000 Mbps Full Duplex",
    "CPU{a}: Package temperature above threshold, cpu clock throttled (total events = {n})",
    "mce: [Hardware Error]: Machine check events logged",
    "kauditd_printk_skb: {a} callbacks suppressed",
    "IPVS: rr: TCP 10.96.{a}.{b}:443 - no destination available",
    "cgroup: fork rejected by pids controller in /kubepods.slice/kubepods-pod{h}.slice",
    "overlayfs: upper fs does not support RENAME_WHITEOUT.",
    "nfs: server 10.0.{a}.{b} not responding, still trying",
    "bond0: (slave eth{a}): link status definitely up, 25000 Mbps full duplex",
    "infiniband ibp{bus}s0: ib_query_port failed ({n})",
    "loop{a}: detected capacity change from 0 to {n}",
    "scsi {a}:0:0:0: Direct-Access     ATA      SAMSUNG MZ7LH960 304Q PQ: 0 ANSI: 5",
)
# Lines the prefilter lets through but that fire nothing, or fire a signature.
NVRM_INFO = (
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.{a}.05  Sat Aug 19 01:15:15 UTC 2023",
    "NVRM: GPU at PCI:0000:{bus}:00: GPU-{u8}-{u4}-{u4}-{u4}-{u12}",
    "NVRM: GPU Board Serial Number: 16537230{n}",
    "NVRM: Persistence mode is deprecated and will be removed in a future release.",
    "NVRM: nvAssertOkFailedNoLog: Assertion failed: Call timed out [NV_ERR_TIMEOUT] (0x00000065)",
)
NVRM_FAULT = (
    "NVRM: Xid (PCI:0000:{bus}:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
    "Exception on (GPC 9, TPC 1, SM 1): Out Of Range Address",
    "NVRM: Xid (PCI:0000:{bus}:00): 31, pid={p}, name=python, Ch 00000010, intr 00000000. MMU "
    "Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f60_d72f8000. Fault is of type FAULT_PDE",
    "NVRM: Xid (PCI:0000:{bus}:00): 43, pid={p}, name=pt_main_thread, Ch 00000008",
    "NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
    "bus.",
    "NVRM: Xid (PCI:0000:{bus}:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
    "(0x0000000018f31d80) marked for remapping, reset gpu to activate.",
    "NVRM: Xid (PCI:0000:{bus}:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). "
    "RST: No, D-RST: No",
)
OTHER_TOKEN = (
    "mlx5_core 0000:{bus}:00.0 mlx5_{a}: Port: 1 Link ACTIVE",
    "mlx5_core 0000:{bus}:00.0: mlx5_cmd_out_err:838:(pid {p}): ACCESS_REG(0x805) op_mod(0x1) "
    "failed, status bad resource(0x5), syndrome (0x305684), err(-22)",
    "pcieport 0000:{bus}:01.0: AER: Corrected error received: 0000:{bus}:00.0",
    "nvidia-nvswitch{a}: SXid (PCI:0000:0{a}:00.0): 20034, Fatal, Link {b} LTSSM Fault Up",
)
BUSES = ("18", "2a", "3b", "5d", "9a", "ab", "ba", "db")


def _fill(template: str, rng: random.Random) -> str:
    hexd = "0123456789abcdef"

    def hx(k: int) -> str:
        return "".join(rng.choice(hexd) for _ in range(k))

    return template.format(
        a=rng.randrange(8),
        b=rng.randrange(64),
        n=rng.randrange(1, 10**6),
        p=rng.randrange(1, 4 * 10**6),
        t=rng.randrange(1_700_000_000, 1_800_000_000),
        h=hx(7),
        bus=rng.choice(BUSES),
        u8=hx(8),
        u4=hx(4),
        u12=hx(12),
    )


def _prefix(style: int, rng: random.Random, uptime: float) -> str:
    mon, day = rng.choice(MONTHS), rng.randrange(1, 29)
    hms = f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
    if style == 0:  # dmesg
        return f"[{uptime:12.6f}] "
    if style == 1:  # dmesg -T
        return f"[{rng.choice(DAYS)} {mon} {day:2d} {hms} 2025] "
    if style == 2:  # syslog around a dmesg stamp
        return f"{mon} {day:2d} {hms} gpu-node-17 kernel: [{uptime:12.6f}] "
    if style == 3:  # journalctl -o short-iso-precise
        return f"2025-03-{day:02d}T{hms}.{rng.randrange(10**6):06d}+0000 gpu-node-17 kernel: "
    return f"{mon} {day:02d} {hms} gpu-node-17 kernel: "  # journalctl -o short


def make_block(rng: random.Random, nvrm_share: float, uptime: float) -> tuple[bytes, float]:
    lines: list[str] = []
    size = 0
    fault_share = nvrm_share * 0.3
    other_share = nvrm_share * 0.5
    while size < BLOCK_BYTES:
        r = rng.random()
        if r < fault_share:
            msg = _fill(rng.choice(NVRM_FAULT), rng)
        elif r < nvrm_share:
            msg = _fill(rng.choice(NVRM_INFO), rng)
        elif r < nvrm_share + other_share:
            msg = _fill(rng.choice(OTHER_TOKEN), rng)
        else:
            msg = _fill(rng.choice(ORDINARY), rng)
        uptime += rng.random() * 0.5
        line = _prefix(rng.randrange(5), rng, uptime) + msg + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode(), uptime


def generate(path: Path, size_mb: int, nvrm_share: float, seed: int) -> int:
    """Write about ``size_mb`` MiB: ``DISTINCT_BLOCKS`` generated blocks in random order."""
    rng = random.Random(seed)
    uptime = 1000.0
    blocks = []
    for _ in range(min(DISTINCT_BLOCKS, max(1, size_mb * (1 << 20) // BLOCK_BYTES))):
        block, uptime = make_block(rng, nvrm_share, uptime)
        blocks.append(block)
    target = size_mb << 20
    written = 0
    with path.open("wb") as f:
        while written < target:
            block = rng.choice(blocks)
            f.write(block)
            written += len(block)
    return written


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def run_cmd(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, check=False)
    if done.returncode not in (0, 1):  # grep: 1 = no match
        raise RuntimeError(f"{cmd[0]} exited {done.returncode}: {done.stderr[-500:]!r}")
    return done.stdout.decode(errors="replace")


def scan_to_devnull(cmd: list[str], timeout: float) -> None:
    with open(os.devnull, "wb") as devnull:
        done = subprocess.run(
            cmd, stdout=devnull, stderr=subprocess.PIPE, timeout=timeout, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"gpufleet scan exited {done.returncode}: {done.stderr[-500:]!r}")


def matcher_pass(path: Path, engine: Engine) -> int:
    from gpufleet.core.signatures.matcher import KernelLogMatcher

    matcher = KernelLogMatcher(engine=engine)
    found = 0
    with path.open("rb") as f:
        while chunk := f.read(4 << 20):
            found += len(matcher.feed_bytes(chunk))
    return found + len(matcher.finish())


def _pass_range(path: Path, begin: int, end: int) -> int:
    """The part of a range's scan no finding changes: the prefilter's literal pass and the
    newline count, over ``path[begin:end]`` in the scan's chunks; its candidate lines."""
    import mmap

    from gpufleet.core.signatures.matcher import _program
    from gpufleet.core.signatures.prefilter import newlines_before

    finder = _program(None).finder
    found = 0
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = begin
        while pos < end:
            cut = mm.rfind(b"\n", pos, min(pos + CHUNK, end)) + 1
            if cut <= pos:  # a line longer than a chunk, or the last line
                cut = end
            starts = finder.line_starts(mm, cut, pos)
            newlines_before(mm, cut, starts, pos)
            found += len(starts)
            pos = cut
    return found


def literal_pass(path: Path) -> int:
    """:func:`_pass_range` over the ranges ``gpufleet scan`` splits ``path`` into, one
    forked process each, as the scan runs them: the floor of a scan that did nothing per
    line (no start-up: it runs in this process and its children)."""
    from gpufleet.cli.scan import _auto_jobs, _split

    size = path.stat().st_size
    ranges = _split(str(path), size, _auto_jobs(size))
    children = []
    for begin, end in ranges[1:]:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                _pass_range(path, begin, end)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    if ranges:
        _pass_range(path, *ranges[0])
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if status:
            raise RuntimeError(f"a literal-pass child exited with status {status}")
    return len(ranges)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="log size in MiB (default 1024)")
    ap.add_argument("--nvrm-share", type=float, default=0.01, help="share of NVRM lines")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs each (default 3)")
    ap.add_argument("--jobs", type=int, default=0, help="also time `gpufleet scan --jobs N`")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--file", type=Path, help="scan this existing log instead of generating one")
    ap.add_argument("--keep", type=Path, help="also copy the generated log here")
    ap.add_argument("--timeout", type=float, default=900.0, help="per command, seconds")
    args = ap.parse_args()

    for line in machine_lines():
        print(line)
    grep = shutil.which("grep")
    gpufleet = Path(sys.executable).with_name("gpufleet")
    scan_cmd = [str(gpufleet)] if gpufleet.exists() else [sys.executable, "-m", "gpufleet"]
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-scan-"))
    try:
        if args.file:
            path = args.file
            size = path.stat().st_size
        else:
            path = tmp / "kern.log"
            t0 = time.perf_counter()
            size = generate(path, args.size_mb, args.nvrm_share, args.seed)
            print(f"generated {size / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f} s: {path}")
            if args.keep:
                shutil.copyfile(path, args.keep)
        with path.open("rb") as f:  # into the page cache for everyone
            while f.read(16 << 20):
                pass
        mb = size / 1e6
        rows: list[tuple[str, float, str]] = []
        literals_t = float("nan")
        env_c = {**os.environ, "LC_ALL": "C"}
        if grep:
            t, out = best_of(
                args.repeat,
                lambda: run_cmd([grep, "-F", "-c", "NVRM", str(path)], timeout=args.timeout),
            )
            rows.append(("grep -F -c NVRM", t, f"{int(str(out).strip() or 0):,} lines"))
            t, out = best_of(
                args.repeat,
                lambda: run_cmd(
                    [grep, "-F", "-c", "NVRM", str(path)], env=env_c, timeout=args.timeout
                ),
            )
            rows.append(("LC_ALL=C grep -F -c NVRM", t, f"{int(str(out).strip() or 0):,} lines"))
            from gpufleet.core.signatures.matcher import _program

            pats = [a for t in _program(None).tokens for a in ("-e", t)]
            t, out = best_of(
                args.repeat,
                lambda: run_cmd(
                    [grep, "-F", "-c", *pats, str(path)], env=env_c, timeout=args.timeout
                ),
            )
            n_lit = len(pats) // 2
            literals_t = t
            rows.append(
                (
                    f"LC_ALL=C grep -F -c -e <{n_lit} literals>",
                    t,
                    f"{int(str(out).strip() or 0):,} lines",
                )
            )
        engines: list[Engine] = ["hyperscan", "python"] if hyperscan_available() else ["python"]
        for engine in engines:

            def one_pass(e: Engine = engine) -> int:
                return matcher_pass(path, e)

            t, found = best_of(args.repeat, one_pass)
            label = "hyperscan matcher stage" if engine == "hyperscan" else "python prefilter"
            rows.append((f"matcher.feed_bytes, {label}", t, f"{found:,} matches"))
        t, _ = best_of(
            args.repeat,
            lambda: scan_to_devnull([*scan_cmd, "scan", str(path), "-o", "json"], args.timeout),
        )
        rows.append(("gpufleet scan FILE -o json", t, "end to end, > /dev/null"))
        scan_t = t
        # What no per-line work can go below: the start-up (a scan of an empty file) and
        # the literal pass with the line count over the same ranges, in parallel.
        empty = tmp / "empty.log"
        empty.write_bytes(b"")
        start_t, _ = best_of(
            args.repeat,
            lambda: scan_to_devnull([*scan_cmd, "scan", str(empty), "-o", "json"], args.timeout),
        )
        rows.append((START_UP, start_t, "imports, catalog, exit"))
        floor_t, procs = best_of(args.repeat, lambda: literal_pass(path))
        rows.append(
            (
                f"literal pass + line count, {procs} process(es)",
                floor_t,
                "the scan's ranges, no per-line work",
            )
        )
        if args.jobs:
            cmd = [*scan_cmd, "scan", str(path), "-o", "json", "--jobs", str(args.jobs)]
            t, _ = best_of(args.repeat, lambda: scan_to_devnull(cmd, args.timeout))
            rows.append((f"gpufleet scan FILE -o json --jobs {args.jobs}", t, "end to end"))

        grep_t = rows[0][1] if grep else float("nan")
        print()
        print(f"file: {mb:,.0f} MB, NVRM share {args.nvrm_share:.2%}, best of {args.repeat}")
        print(
            f"targets: gpufleet scan ≥ {TARGET_RATIO}× grep -F NVRM and "
            f"≥ {TARGET_LITERALS_RATIO}× the literals' grep, in throughput"
        )
        print()
        head = (
            f"| {'contender':<44} | {'s':>7} | {'MB/s':>8} | {'× NVRM':>6} | {'× lits':>6} | note"
        )
        print(head)
        print("|" + "-" * 46 + "|" + "-" * 9 + "|" + "-" * 10 + ("|" + "-" * 8) * 2 + "|------")
        for name, t, note in rows:
            if name.startswith(START_UP):  # an empty file: no throughput to compare
                print(f"| {name:<44} | {t:7.2f} | {'-':>8} | {'-':>6} | {'-':>6} | {note}")
                continue
            ratio = grep_t / t if t else float("nan")
            lit_ratio = literals_t / t if t else float("nan")
            print(
                f"| {name:<44} | {t:7.2f} | {mb / t:8,.0f} | {ratio:6.2f} | {lit_ratio:6.2f} "
                f"| {note}"
            )
        if grep:
            budget = grep_t / TARGET_RATIO
            floor = start_t + floor_t
            print()
            print(
                f"budget at {TARGET_RATIO}× grep -F NVRM: {budget:.3f} s; start-up + literal pass "
                f"{floor:.3f} s leave {budget - floor:.3f} s for the rest: the regex stage, "
                "each finding's prefix parse, match and JSON, the output, numpy's import "
                f"(the scan spends {scan_t - floor:.3f} s on it)"
            )
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
