"""The check tools on simulated nodes: ``dcgmi``, ``all_reduce_perf`` (alone or under
``mpirun``), ``ib_write_bw`` and ``gpu_burn``, printing what the real tools print (the
layouts of the recorded outputs in ``tests/fixtures/checks``), with figures that follow
the node's injected faults. Pure: the caller hands in the hosts and a random stream.

Healthy figures are the expected value (``CheckExpectations``, from the thresholds data)
with about 1 % noise. Faults, by their catalog category:

- ``gpu-memory`` on GPU g (ECC, row remap): the DCGM memory test fails on g (the software
  test's page-retirement check at level 1);
- ``gpu-bus`` on GPU g (fallen off the bus, lost): g is missing from every tool's output;
  an all_reduce over the node's GPUs fails with a CUDA error;
- ``gpu-firmware`` / ``gpu-engine`` on GPU g: the DCGM diagnostic (level 3+) fails on g,
  and gpu-burn calls g FAULTY;
- ``nvlink`` / ``nvswitch``: the node's own all_reduce reaches about half its busbw, any
  multi-node ring through the node too, and DCGM's nvbandwidth (level 3+) fails;
- ``infiniband`` (node-wide): one HCA (chosen by the fault) runs at half the line rate in
  ib_write_bw (a link down: the client cannot connect), and multi-node rings through the
  node are slow;
- ``thermal`` / ``power`` on GPU g: gpu-burn shows g about 25 % slower.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.sim.faults import SimFault, hca_index, pci_bus_id, signature_or_error

GIB = 1 << 30
_HEALTHY_NOISE = 0.01
_DEGRADED = 0.55  # busbw share left with a degraded NVLink / a slow NIC in the ring
_MULTIPLIERS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True, slots=True)
class CheckExpectations:
    """What a healthy node measures, from the thresholds data (``checks/thresholds.toml``:
    the ``expected`` values), handed in by the layer that owns that data."""

    nccl_single_node_busbw: Mapping[str, float]  # GPU model → GB/s at the largest size
    nccl_multi_node_busbw: float = 380.0  # GB/s, a ring over 8 NDR NICs per node
    ib_bw_gbits: float = 390.0  # ib_write_bw average at the largest size, NDR
    ib_line_rate_gbits: float = 400.0
    nics_per_node: int = 8
    gpu_burn_gflops: float = 51000.0  # per GPU, doubles on an H100-class part


@dataclass(frozen=True, slots=True)
class SimHost:
    """One simulated node as the tools see it."""

    name: str
    hostname: str
    gpu_model: str
    gpu_count: int
    faults: tuple[SimFault, ...] = ()
    serials: tuple[str, ...] = ()

    def categories(self, *, gpu: int | None = None) -> set[str]:
        """Categories of the active faults (on ``gpu``, or node-wide ones too)."""
        out: set[str] = set()
        for f in self.faults:
            if not f.active:
                continue
            if gpu is not None and f.gpu_index not in (None, gpu):
                continue
            out.add(signature_or_error(f.signature_id).category)
        return out

    def gpu_faults(self, categories: set[str]) -> dict[int, SimFault]:
        out: dict[int, SimFault] = {}
        for f in self.faults:
            category = signature_or_error(f.signature_id).category
            if f.active and f.gpu_index is not None and category in categories:
                out.setdefault(f.gpu_index, f)
        return out

    @property
    def missing_gpus(self) -> set[int]:
        return set(self.gpu_faults({"gpu-bus"}))

    @property
    def nvlink_degraded(self) -> bool:
        return bool(self.categories() & {"nvlink", "nvswitch"})

    def bad_hca(self, nics: int) -> tuple[int, bool] | None:
        """The HCA index an InfiniBand fault hits, and whether its link is down."""
        for f in self.faults:
            if f.active and signature_or_error(f.signature_id).category == "infiniband":
                return hca_index(f, nics=nics), f.signature_id in ("ib-link-down", "ib-port-init")
        return None


@dataclass(frozen=True, slots=True)
class ProgramResult:
    exit_code: int
    stdout: str
    stderr: str = ""
    duration_s: float = 0.0  # how long the real tool would have taken


@dataclass
class Toolbox:
    """The four tools over one simulated cluster. ``resolve(host)`` finds a node of the
    cluster by hostname or name (mpirun's host list, ib_write_bw's server)."""

    expectations: CheckExpectations
    resolve: Callable[[str], SimHost | None]
    rng: random.Random = field(default_factory=random.Random)

    def run(self, argv: Sequence[str], *, host: SimHost) -> ProgramResult:
        """Run ``argv`` on ``host``; an unknown program exits 127 as a shell would."""
        program = argv[0].rsplit("/", 1)[-1]
        tools: dict[str, Callable[[Sequence[str], SimHost], ProgramResult]] = {
            "dcgmi": self.dcgmi,
            "all_reduce_perf": self.all_reduce_perf,
            "mpirun": self.mpirun,
            "ib_write_bw": self.ib_write_bw,
            "gpu_burn": self.gpu_burn,
        }
        tool = tools.get(program)
        if tool is None:
            return ProgramResult(127, "", f"{program}: command not found\n")
        return tool(list(argv), host)

    def _noise(self, value: float) -> float:
        return value * (1.0 + max(-0.03, min(0.03, self.rng.gauss(0.0, _HEALTHY_NOISE))))

    # -- dcgmi diag -r N -j ---------------------------------------------------------------

    def dcgmi(self, argv: Sequence[str], host: SimHost) -> ProgramResult:
        if len(argv) < 2 or argv[1] != "diag" or "-r" not in argv:
            return ProgramResult(1, "", "Usage: dcgmi diag -r <level> [-j]\n")
        level_text = argv[argv.index("-r") + 1] if argv.index("-r") + 1 < len(argv) else ""
        level = {"quick": 1, "short": 1, "medium": 2, "long": 3, "xlong": 4}.get(
            level_text, int(level_text) if level_text.isdigit() else 0
        )
        if not 1 <= level <= 4:
            return ProgramResult(1, "", f"Error: invalid run level {level_text!r}\n")
        gpus = [g for g in range(host.gpu_count) if g not in host.missing_gpus]
        memory = host.gpu_faults({"gpu-memory"})
        compute = host.gpu_faults({"gpu-firmware", "gpu-engine"})
        nvlink = host.nvlink_degraded
        tests: list[tuple[str, str, dict[int, dict[str, object]]]] = []
        remap = {
            g: _warning(
                f"GPU {g} has uncorrectable memory errors and row remappings are pending",
                85,
                10,
                6,
            )
            for g in memory
        }
        tests.append(("Deployment", "software", remap))
        if level >= 2:
            tests.append(("Integration", "pcie", {}))
            tests.append(
                (
                    "Hardware",
                    "memory",
                    {
                        g: _warning(f"A DBE occurred on GPU {g} during the memory test", 57, 10, 6)
                        for g in memory
                    },
                )
            )
        if level >= 3:
            nvb = (
                {
                    g: _warning(f"GPU {g} NVLink bandwidth below the expected value", 30, 11, 2)
                    for g in gpus
                }
                if nvlink
                else {}
            )
            tests.append(("Integration", "nvbandwidth", nvb))
            tests.append(
                (
                    "Hardware",
                    "diagnostic",
                    {
                        g: _warning(
                            f"GPU {g}: the GEMM results did not match (miscompare)", 79, 15, 2
                        )
                        for g in compute
                    },
                )
            )
            for name in ("targeted_stress", "targeted_power", "memory_bandwidth"):
                tests.append(("Stress", name, {}))
        if level >= 4:
            tests.append(
                (
                    "Hardware",
                    "memtest",
                    {
                        g: _warning(f"GPU {g} failed the memory test pattern", 52, 10, 2)
                        for g in memory
                    },
                )
            )
            tests.append(("Stress", "pulse_test", {}))
        categories: list[dict[str, object]] = []
        failed = False
        for category, name, failures in tests:
            results = []
            for g in gpus:
                entry: dict[str, object] = {
                    "entity_group": "GPU",
                    "entity_group_id": 1,
                    "entity_id": g,
                    "status": "Pass",
                }
                if g in failures:
                    entry["status"] = "Fail"
                    entry["warnings"] = [failures[g]]
                    failed = True
                results.append(entry)
            status = "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"
            test = {"name": name, "results": results, "test_summary": {"status": status}}
            for c in categories:
                if c["category"] == category:
                    c["tests"].append(test)  # type: ignore[attr-defined]
                    break
            else:
                categories.append({"category": category, "tests": [test]})
        serials = host.serials or tuple(f"16542{i:08d}" for i in range(host.gpu_count))
        doc = {
            "DCGM Diagnostic": {"test_categories": categories},
            "entity_groups": [
                {
                    "entity_group": "GPU",
                    "entity_group_id": 1,
                    "entities": [
                        {"entity_id": g, "device_id": "2330", "serial_num": serials[g]}
                        for g in gpus
                    ],
                }
            ],
            "metadata": {"version": "4.2.3", "Driver Version Detected": "570.124.06"},
        }
        text = json.dumps(doc, indent="\t", separators=(",", " : ")) + "\n"
        took = {1: 10.0, 2: 150.0, 3: 900.0, 4: 5400.0}[level]
        return ProgramResult(226 if failed else 0, text, duration_s=took)

    # -- nccl-tests ---------------------------------------------------------------------

    def all_reduce_perf(self, argv: Sequence[str], host: SimHost) -> ProgramResult:
        gpus = int(_flag(argv, "-g", "1"))
        return self._all_reduce(argv, [(host, list(range(gpus)))])

    def mpirun(self, argv: Sequence[str], host: SimHost) -> ProgramResult:
        """``mpirun -np N -H a:8,b:8 [--bind-to none] [-x K=V] all_reduce_perf ... -g 1``."""
        hosts_arg = _flag(argv, "-H", "")
        program_at = next(
            (i for i, a in enumerate(argv) if a.rsplit("/", 1)[-1] == "all_reduce_perf"), None
        )
        if not hosts_arg or program_at is None:
            return ProgramResult(1, "", "mpirun: expected -H host:slots,... all_reduce_perf\n")
        placed: list[tuple[SimHost, list[int]]] = []
        for part in hosts_arg.split(","):
            name, _, slots = part.partition(":")
            target = self.resolve(name)
            if target is None:
                return ProgramResult(
                    1,
                    "",
                    f"ssh: Could not resolve hostname {name}: Name or service not known\n"
                    "ORTE was unable to reliably start one or more daemons.\n",
                )
            placed.append((target, list(range(int(slots or "1")))))
        return self._all_reduce(argv[program_at:], placed, launcher_host=host)

    def _all_reduce(
        self,
        argv: Sequence[str],
        placed: Sequence[tuple[SimHost, list[int]]],
        launcher_host: SimHost | None = None,
    ) -> ProgramResult:
        del launcher_host
        lo = _size(_flag(argv, "-b", "8"))
        hi = _size(_flag(argv, "-e", "8G"))
        factor = int(_flag(argv, "-f", "2"))
        per_process = int(_flag(argv, "-g", "1"))
        multi = len(placed) > 1
        for h, devices in placed:
            missing = h.missing_gpus & set(devices)
            if missing:
                g = min(missing)
                return ProgramResult(
                    1,
                    _nccl_header(lo, hi, factor, per_process, []),
                    f"{h.hostname}: Test CUDA failure common.cu:1042 'invalid device ordinal'\n"
                    f" .. {h.hostname} pid 31245: Test failure common.cu:1145 (GPU {g})\n",
                )
        ranks = [(h, d) for h, devices in placed for d in devices]
        n = len(ranks)
        model = placed[0][0].gpu_model
        if multi:
            peak = self.expectations.nccl_multi_node_busbw
            if any(
                h.nvlink_degraded or h.bad_hca(self.expectations.nics_per_node) for h, _ in placed
            ):
                peak *= _DEGRADED
        else:
            peak = self.expectations.nccl_single_node_busbw.get(model, 450.0) * (
                n / 8 if n < 8 else 1.0
            )
            if placed[0][0].nvlink_degraded:
                peak *= _DEGRADED
        peak = self._noise(peak)
        bus_factor = 2 * (n - 1) / n if n > 1 else 1.0
        alg_peak = peak / bus_factor
        latency_us = 30.0 if not multi else 45.0
        rows = []
        size = lo
        busbws = []
        while size <= hi:
            count = max(1, size // 4)
            times = []
            for _ in range(2):
                t = latency_us + size / (alg_peak * 1e3)
                times.append(t * (1.0 + abs(self.rng.gauss(0.0, 0.005))))
            cols = []
            for t in times:
                algbw = size / t / 1e3
                busbw = algbw * bus_factor
                cols.append((t, algbw, busbw))
            busbws.append((cols[0][2] + cols[1][2]) / 2)
            rows.append(
                f"{size:>12} {count:>13}     float     sum      -1"
                + "".join(f" {t:>8.2f} {a:>7.2f} {b:>7.2f} {0:>6}" for t, a, b in cols)
            )
            size = size * factor if factor > 1 else size + 1
        lines = [_nccl_header(lo, hi, factor, per_process, ranks)]
        lines += [
            "#                                                              out-of-place"
            "                       in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw"
            " #wrong     time   algbw   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
            "            (us)  (GB/s)  (GB/s)       ",
            *rows,
            "# Out of bounds values : 0 OK",
            f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4g} ",
            "#",
            "",
        ]
        return ProgramResult(0, "\n".join(lines), duration_s=60.0 + 2 * len(placed))

    # -- perftest ib_write_bw -------------------------------------------------------------

    def ib_write_bw(self, argv: Sequence[str], host: SimHost) -> ProgramResult:
        device = _flag(argv, "-d", "mlx5_0")
        gbits = "--report_gbits" in argv
        positional = _positional(argv[1:], takes_value=_IB_VALUE_FLAGS)
        exp = self.expectations
        index = int(device.rsplit("_", 1)[-1]) if device.rsplit("_", 1)[-1].isdigit() else 0
        if not positional:  # the server side: prints its table once the client is done
            return ProgramResult(0, _ib_banner(device) + _ib_table([], gbits=gbits))
        peer = self.resolve(positional[-1])
        if peer is None:
            return ProgramResult(
                1,
                "",
                f"Couldn't connect to {positional[-1]}:18515\n"
                "Unable to open file descriptor for socket connection Unable to init the socket "
                "connection\n",
            )
        rate = exp.ib_bw_gbits
        for side in (host, peer):
            bad = side.bad_hca(exp.nics_per_node)
            if bad is not None and bad[0] == index:
                if bad[1]:
                    return ProgramResult(
                        1,
                        _ib_banner(device),
                        f" Failed status 12: wr_id 0 syndrom 0x81\nscnt=128, ccnt=0\n"
                        f" Failed to complete run_iter_bw function successfully (HCA {device} "
                        f"on {side.hostname}: port down)\n",
                    )
                rate = min(rate, exp.ib_line_rate_gbits * 0.5)
        rate = self._noise(rate)
        rows = []
        size = 2
        while size <= 8 * (1 << 20):
            bw = rate * size / (size + 2048)
            bw_gbits = bw if gbits else bw * 1e9 / 8 / 1048576
            rows.append((size, bw_gbits * 1.002, bw_gbits, bw * 1e9 / 8 / size / 1e6))
            size *= 2
        return ProgramResult(0, _ib_banner(device) + _ib_table(rows, gbits=gbits), duration_s=10.0)

    # -- gpu-burn -------------------------------------------------------------------------

    def gpu_burn(self, argv: Sequence[str], host: SimHost) -> ProgramResult:
        numbers = [a for a in argv[1:] if a.isdigit()]
        seconds = int(numbers[-1]) if numbers else 10
        gpus = [g for g in range(host.gpu_count) if g not in host.missing_gpus]
        faulty = set(host.gpu_faults({"gpu-firmware", "gpu-engine"}))
        slow = set(host.gpu_faults({"thermal", "power"}))
        speed = {
            g: self._noise(self.expectations.gpu_burn_gflops) * (0.75 if g in slow else 1.0)
            for g in gpus
        }
        lines = [f"GPU {g}: {host.gpu_model} (UUID: GPU-{_uuid(host.name, g)})" for g in gpus]
        lines += ["Using compare file: compare.ptx", f"Burning for {seconds} seconds."]
        lines += [
            f"Initialized device {g} with 81008 MB of memory (80361 MB available, using 72325 "
            "MB of it), using DOUBLES, using Tensor Cores"
            for g in gpus
        ]
        lines.append("Results are 268435456 bytes each, thus performing 280 iterations")
        for step in range(1, 11):
            pct = step * 10.0
            procd = " - ".join(
                f"{int(speed[g] * seconds * step / 10 / 56)} ({speed[g]:.0f} Gflop/s)" for g in gpus
            )
            errors = " - ".join(
                ("4096  (WARNING!)" if g in faulty and step >= 3 else "0") for g in gpus
            )
            temps = " - ".join(f"{61 + g % 3} C" for g in gpus)
            lines.append(f"{pct:.1f}%  proc'd: {procd}   errors: {errors}   temps: {temps}")
            lines.append("\tSummary at:   Mon Jun  2 10:03:00 UTC 2025")
            lines.append("")
        lines.append("Killing processes with SIGTERM (soft kill)")
        for g in gpus:
            lines += [f"Freed memory for dev {g}", "Uninitted cublas"]
        lines += ["done", "", f"Tested {len(gpus)} GPUs:"]
        lines += [f"\tGPU {g}: {'FAULTY' if g in faulty else 'OK'}" for g in gpus]
        return ProgramResult(0, "\n".join(lines) + "\n", duration_s=float(seconds) + 15.0)


def _warning(text: str, error_id: int, category: int, severity: int) -> dict[str, object]:
    return {
        "warning": text,
        "error_id": error_id,
        "error_category": category,
        "error_severity": severity,
    }


# perftest options that take a value (the rest are switches: -a, -F, --report_gbits).
_IB_VALUE_FLAGS = frozenset(
    {"-d", "-p", "-x", "-q", "-D", "-s", "-n", "-i", "-m", "-t", "-u", "-S", "-I", "-c"}
)


def _positional(args: Sequence[str], *, takes_value: frozenset[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in takes_value
        else:
            out.append(arg)
    return out


def _flag(argv: Sequence[str], flag: str, default: str) -> str:
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return default


def _size(text: str) -> int:
    text = text.strip().upper()
    if text and text[-1] in _MULTIPLIERS:
        return int(text[:-1]) * _MULTIPLIERS[text[-1]]
    return int(text)


def _nccl_header(
    lo: int, hi: int, factor: int, per_process: int, ranks: Sequence[tuple[SimHost, int]]
) -> str:
    lines = [
        f"# nThread 1 nGpus {per_process} minBytes {lo} maxBytes {hi} step: {factor}(factor) "
        "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    pid = 31245
    for rank, (h, device) in enumerate(ranks):
        bus = pci_bus_id(device).split(":")[1]
        lines.append(
            f"#  Rank {rank:>2} Group  0 Pid {pid + (rank if per_process == 1 else 0):>6} on "
            f"{h.hostname:>10} device {device:>2} [0x{bus}] {h.gpu_model}"
        )
    lines.append("#")
    return "\n".join(lines)


def _ib_banner(device: str) -> str:
    return (
        "---------------------------------------------------------------------------------------\n"
        "                    RDMA_Write BW Test\n"
        f" Dual-port       : OFF          Device         : {device}\n"
        " Number of qps   : 1            Transport type : IB\n"
        " Connection type : RC           Using SRQ      : OFF\n"
        " PCIe relax order: ON\n"
        " ibv_wr* API     : ON\n"
        " TX depth        : 128\n"
        " CQ Moderation   : 100\n"
        " Mtu             : 4096[B]\n"
        " Link type       : IB\n"
        " Max inline data : 0[B]\n"
        " rdma_cm QPs     : OFF\n"
        " Data ex. method : Ethernet\n"
        "---------------------------------------------------------------------------------------\n"
        " local address: LID 0x0c QPN 0x0094 PSN 0x4d2cb8 RKey 0x1fff00 VAddr 0x007f5bd95e2000\n"
        " remote address: LID 0x0d QPN 0x00a4 PSN 0xabcdef RKey 0x1fff01 VAddr 0x007f746bc41000\n"
        "---------------------------------------------------------------------------------------\n"
    )


def _ib_table(rows: Sequence[tuple[int, float, float, float]], *, gbits: bool) -> str:
    unit = "Gb/sec" if gbits else "MB/sec"
    lines = [f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"]
    lines += [
        f" {size:<10} {5000:<14} {peak:>10.2f}         {avg:>10.2f}         {rate:.6f}"
        for size, peak, avg, rate in rows
    ]
    lines.append(
        "---------------------------------------------------------------------------------------"
    )
    return "\n".join(lines) + "\n"


def _uuid(name: str, gpu: int) -> str:
    digest = hashlib.sha256(f"{name}/{gpu}".encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"
