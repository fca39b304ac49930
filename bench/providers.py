"""Provider drivers against their real peers: each call next to the peer's own latency.

    python bench/providers.py [--providers ipmi,redfish,ssh,aws] [--reps 20] [--warmup 2]

Per provider, one peer on 127.0.0.1 (the same peers the driver suites test against):

* ``ipmi``: OpenIPMI's ``ipmi_sim`` with the tests' chassis-control script;
* ``redfish``: sushy-tools' emulator (fake driver, power changes applied at once);
* ``ssh``: a real ``sshd`` for the current user, key login, pinned host key;
* ``aws``: moto in server mode (a subprocess), one EC2 instance.

Each repetition runs, in turn: the baseline (the peer's own call, made raw: ``ipmitool
chassis power status``; an ``httpx`` GET of the system; an ``asyncssh`` connect + ``true``;
a ``boto3`` ``describe_instances``), then the driver's ``check_reach``, ``power_state``
(where the driver has it) and ``reboot``. Prints median and p95 of each, the ratio of
medians to the baseline, and — by wrapping the driver's one call method — how long the
driver took to reach its first peer call and how many calls it made.

Approval → first BMC call through the server is bench/repair_path.py; this is the
driver's share of that path.

Nothing is asserted; exit 0 when every provider ran, 1 when one could not (its row says
why). Everything started is stopped and the temp dir removed, on failure and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The peers are started by the driver suites' own helpers (tests/providers/*), so the
# benchmark drives exactly the peers the tests do. bench/ runs from a checkout; tests/
# is next to it. Imported lazily, per provider, so a missing peer is one row, not a crash.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "providers"))

from _common import free_port, machine_lines, percentile
from gpufleet.providers.base import Credential, HostAccess

PROVIDERS = ("ipmi", "redfish", "ssh", "aws")
HOST = "h1"


@dataclass
class Op:
    """One measured call: a baseline (the peer's own call) or a driver method."""

    name: str
    call: Callable[[], Awaitable[object]]
    baseline: bool = False


@dataclass
class Series:
    name: str
    baseline: bool
    wall: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)  # op start → first peer call
    calls: list[int] = field(default_factory=list)


@dataclass
class Result:
    provider: str
    peer: str = ""
    series: list[Series] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: str | None = None


class Probe:
    """Wraps a driver's call method (the one place its I/O starts) on one instance:
    when the first call of an operation began, and how many calls it made."""

    def __init__(self) -> None:
        self.started = 0.0
        self.first: float | None = None
        self.calls = 0

    def wrap(self, obj: object, name: str) -> None:
        inner = getattr(obj, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            if self.first is None:
                self.first = time.perf_counter()
            self.calls += 1
            return await inner(*args, **kwargs)

        setattr(obj, name, counted)

    def reset(self) -> None:
        self.first = None
        self.calls = 0


class Directory:
    """A one-host ``HostDirectory``."""

    def __init__(self, access: HostAccess) -> None:
        self.access = access

    async def host(self, host_id: str) -> HostAccess | None:
        return self.access if host_id == self.access.host_id else None

    async def hosts(self, cluster_id: str) -> list[HostAccess]:
        return [self.access] if self.access.cluster_id == cluster_id else []

    async def claim_spare(self, cluster_id: str, client_token: str) -> HostAccess | None:
        del cluster_id, client_token  # no spares: nothing here replaces a machine
        return None

    async def release(self, host_id: str) -> None:
        del host_id


def blocking(fn: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """A baseline made raw: the blocking call itself, on this thread, no executor hop."""

    async def call() -> object:
        return fn()

    return call


# -- the peers --------------------------------------------------------------------------------

Setup = tuple[list[Op], Probe]


@contextlib.asynccontextmanager
async def ipmi(workdir: Path, result: Result) -> AsyncIterator[Setup]:
    from ipmi.ipmi_lab import BMC_PASSWORD, BMC_USER, IpmiSim, require_tools

    from gpufleet.providers.ipmi.client import IpmitoolClient
    from gpufleet.providers.ipmi.config import IpmiConfig
    from gpufleet.providers.ipmi.driver import IpmiProvider

    require_tools()
    sim = IpmiSim(workdir)
    try:
        sim.start()
        # Cipher suite 3: ipmi_sim cannot list its suites, and asking costs ~3.5 s a call
        # (docs/providers.md, GPUFLEET_IPMI_CIPHER_SUITE). The baseline uses the same.
        config = IpmiConfig(cipher_suite=3)
        access = HostAccess(
            host_id=HOST,
            hostname="ipmi-01",
            address="127.0.0.1",
            port=sim.port,
            credential=Credential(username=BMC_USER, secret=BMC_PASSWORD),
        )
        provider = IpmiProvider(config, Directory(access))
        probe = Probe()
        probe.wrap(provider._client, "run")
        # The driver's own command line for a power status: the baseline is that process.
        argv = IpmitoolClient(config).argv(access, ("chassis", "power", "status"))
        env = {"PATH": os.environ.get("PATH", ""), "IPMI_PASSWORD": BMC_PASSWORD}

        def raw() -> None:
            subprocess.run(argv, env=env, capture_output=True, check=True, timeout=20)

        result.peer = f"ipmi_sim on udp 127.0.0.1:{sim.port}, lanplus, cipher suite 3"
        result.notes.append(
            "ipmi: reboot = power status + `chassis power reset` (ipmi_sim records it)"
        )
        yield (
            [
                Op("baseline: ipmitool chassis power status", blocking(raw), baseline=True),
                Op("check_reach", lambda: provider.check_reach(HOST)),
                Op("power_state", lambda: provider.power_state(HOST)),
                Op("reboot", lambda: provider.reboot(HOST)),
            ],
            probe,
        )
    finally:
        sim.stop()


@contextlib.asynccontextmanager
async def redfish(workdir: Path, result: Result) -> AsyncIterator[Setup]:
    from redfish.redfish_fakes import PASSWORD, SYSTEMS, USER, start_emulator, stop_emulator

    from gpufleet.providers.redfish.config import RedfishConfig
    from gpufleet.providers.redfish.driver import RedfishProvider

    uuid, (name, _power) = next(iter(SYSTEMS.items()))
    systems = [{"uuid": uuid, "name": name, "power_state": "On", "nics": []}]
    emulator = start_emulator(workdir, systems=systems, users={USER: PASSWORD})
    stack = contextlib.ExitStack()
    try:
        access = HostAccess(
            host_id=HOST,
            hostname="redfish-01",
            address=f"http://{emulator.address}",
            credential=Credential(username=USER, secret=PASSWORD),
        )
        provider = RedfishProvider(RedfishConfig(scheme="http"), Directory(access))
        probe = Probe()
        probe.wrap(provider, "_request")
        url = f"http://{emulator.address}/redfish/v1/Systems/{uuid}"
        # One client (building one costs more than the GET), a new connection per GET:
        # the driver opens one per operation.
        http = stack.enter_context(httpx.Client(auth=(USER, PASSWORD), timeout=15))

        def raw() -> None:
            http.get(url, headers={"Connection": "close"}).raise_for_status()

        result.peer = f"sushy-emulator (fake driver, no delay) on http://{emulator.address}"
        result.notes.append(
            "redfish: power_state = 3 GETs (service root, systems, the system: the host "
            "names no system_id; with one it is 1); check_reach = those + the root again; "
            "reboot = the 3 GETs + POST GracefulRestart (the first advertised type), which "
            "the emulator carries out at once"
        )
        yield (
            [
                Op("baseline: httpx GET /Systems/{id}", blocking(raw), baseline=True),
                Op("check_reach", lambda: provider.check_reach(HOST)),
                Op("power_state", lambda: provider.power_state(HOST)),
                Op("reboot", lambda: provider.reboot(HOST)),
            ],
            probe,
        )
    finally:
        stack.close()
        stop_emulator(emulator)


@contextlib.asynccontextmanager
async def ssh(workdir: Path, result: Result) -> AsyncIterator[Setup]:
    import asyncssh
    from ssh.sshpeer import start_sshd

    from gpufleet.providers.ssh.config import SshConfig
    from gpufleet.providers.ssh.driver import SshProvider

    peer = start_sshd(workdir)
    try:
        access = peer.access(HOST)
        # Never the real reboot: `true` stands in for `sudo -n systemctl reboot`, run at
        # once (no delay); the wrapper that detaches it is the driver's own.
        config = SshConfig(reboot_command="true", reboot_delay_s=0.0, reboot_wait_s=3.0)
        provider = SshProvider(config, Directory(access))
        probe = Probe()
        client = provider._client
        probe.wrap(client, "run")
        probe.wrap(client, "run_detached")
        key = asyncssh.import_private_key(peer.client_key.private)
        known = asyncssh.import_known_hosts(f"* {peer.host_key.public}\n")

        async def raw() -> None:
            async with asyncssh.connect(
                "127.0.0.1",
                peer.port,
                username=peer.user,
                client_keys=[key],
                known_hosts=known,
                preferred_auth="publickey",
                config=[],
                agent_path=None,
            ) as conn:
                await conn.run("true", check=True)

        result.peer = f"OpenSSH sshd on 127.0.0.1:{peer.port} (user {peer.user}, ed25519 key)"
        result.notes.append(
            "ssh: check_reach = connect + `cat boot_id uptime`; reboot = connect + the "
            "driver's detach wrapper around `true` (stand-in: nothing reboots), which "
            "polls the command's status every 0.2 s; no power_state (SSH cannot see power)"
        )
        yield (
            [
                Op("baseline: asyncssh connect + `true`", raw, baseline=True),
                Op("check_reach", lambda: provider.check_reach(HOST)),
                Op("reboot", lambda: provider.reboot(HOST)),
            ],
            probe,
        )
    finally:
        peer.stop()


def start_moto(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto in server mode on a free loopback port, answering; its own process (in this
    one, moto's threads would share the GIL with the driver being timed)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with (workdir / "moto.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            tail = (workdir / "moto.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"moto server exited {proc.returncode}: {tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{endpoint}/moto-api/", timeout=1).status_code < 500:
                return proc, endpoint
        if time.monotonic() > deadline:
            stop_process(proc)
            raise RuntimeError("moto server not answering after 30 s")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def aws(workdir: Path, result: Result) -> AsyncIterator[Setup]:
    import boto3

    from gpufleet.providers.aws.config import AwsConfig
    from gpufleet.providers.aws.driver import AwsProvider

    # boto3 must never look for real credentials or probe the instance metadata service.
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }.items():
        os.environ[key] = value
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    proc, endpoint = start_moto(workdir)
    try:
        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        ec2 = boto3.session.Session(region_name="us-east-1", **keys).client(
            "ec2", endpoint_url=endpoint
        )
        launched = ec2.run_instances(
            ImageId="ami-12345678", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1
        )
        instance_id = str(launched["Instances"][0]["InstanceId"])
        config = AwsConfig(region="us-east-1", endpoint_url=endpoint)
        provider = AwsProvider(config, Credential(username="testing", secret="testing"))
        probe = Probe()
        probe.wrap(provider._aws, "call")

        def raw() -> None:
            ec2.describe_instances(InstanceIds=[instance_id])

        result.peer = f"moto server (subprocess) on {endpoint}, instance {instance_id}"
        result.notes.append(
            "aws: check_reach = DescribeInstanceStatus; power_state = DescribeInstances; "
            "reboot = DescribeInstances + RebootInstances; boto3 clients built in warm-up"
        )
        yield (
            [
                Op("baseline: boto3 describe_instances", blocking(raw), baseline=True),
                Op("check_reach", lambda: provider.check_reach(instance_id)),
                Op("power_state", lambda: provider.power_state(instance_id)),
                Op("reboot", lambda: provider.reboot(instance_id)),
            ],
            probe,
        )
    finally:
        stop_process(proc)


PEERS: dict[str, Callable[[Path, Result], contextlib.AbstractAsyncContextManager[Setup]]] = {
    "ipmi": ipmi,
    "redfish": redfish,
    "ssh": ssh,
    "aws": aws,
}


# -- measuring --------------------------------------------------------------------------------


async def measure(ops: list[Op], probe: Probe, *, reps: int, warmup: int) -> list[Series]:
    for _ in range(warmup):
        for op in ops:
            await op.call()
    series = [Series(op.name, op.baseline) for op in ops]
    # Interleaved: every repetition runs each op once, so drift hits them all alike.
    for _ in range(reps):
        for op, s in zip(ops, series, strict=True):
            probe.reset()
            started = time.perf_counter()
            answer = await op.call()
            s.wall.append(time.perf_counter() - started)
            if getattr(answer, "reachable", True) is False:
                raise RuntimeError(f"{op.name}: not reachable: {answer}")
            if not op.baseline and probe.first is not None:
                s.first.append(probe.first - started)
                s.calls.append(probe.calls)
    return series


async def run_provider(name: str, workdir: Path, *, reps: int, warmup: int) -> Result:
    result = Result(name)
    try:
        async with PEERS[name](workdir, result) as (ops, probe):
            result.series = await measure(ops, probe, reps=reps, warmup=warmup)
    except BaseException as exc:
        # A row that says why, never a traceback. The tests' helpers fail through
        # pytest.fail, a BaseException; a Ctrl-C or a cancel still stops the run.
        if isinstance(exc, KeyboardInterrupt | SystemExit | asyncio.CancelledError):
            raise
        first_line = (str(exc).strip().splitlines() or ["(no message)"])[0]
        result.failed = f"{type(exc).__name__}: {first_line[:300]}"
    return result


# -- printing ---------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def table(results: list[Result]) -> list[str]:
    head = ("provider", "call", "median ms", "p95 ms", "× baseline", "→1st call ms", "calls")
    rows: list[tuple[str, ...]] = [head]
    for r in results:
        if r.failed is not None:
            rows.append((r.provider, f"not run: {r.failed}", "", "", "", "", ""))
            continue
        base = next((s for s in r.series if s.baseline), None)
        base_median = statistics.median(base.wall) if base else float("nan")
        for s in r.series:
            ordered = sorted(s.wall)
            median = statistics.median(ordered)
            ratio = "1.00" if s.baseline else f"{median / base_median:.2f}"
            first = f"{statistics.median(s.first) * 1000:.2f}" if s.first else ""
            calls = (
                ""
                if not s.calls
                else f"{min(s.calls)}"
                + (f"-{max(s.calls)}" if max(s.calls) != min(s.calls) else "")
            )
            rows.append(
                (r.provider, s.name, ms(median), ms(percentile(ordered, 95)), ratio, first, calls)
            )
    widths = [max(len(row[i]) for row in rows if len(row[1]) < 60 or i != 1) for i in range(7)]
    lines = []
    for row in rows:
        if row[1].startswith("not run:"):
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
            continue
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Time the ipmi, redfish, ssh and aws drivers against their real peers on "
            "loopback, each next to the peer's own call latency measured in the same run. "
            "Approval → first call through the server: bench/repair_path.py."
        )
    )
    parser.add_argument(
        "--providers",
        default=",".join(PROVIDERS),
        help="comma-separated providers to run, in that order (default: %(default)s)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=20,
        help="measured repetitions of every call, per provider (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="unmeasured runs of every call first: imports, boto3 clients, ipmi_sim "
        "sessions (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PROVIDERS]
    if unknown or not chosen:
        parser.error(
            f"--providers: unknown {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(PROVIDERS)}"
        )
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    args.chosen = chosen
    return args


async def main_async(args: argparse.Namespace) -> int:
    for line in machine_lines():
        print(line)
    load = os.getloadavg()
    print(f"load average before: {' '.join(f'{v:.2f}' for v in load)}")
    cpus = len(os.sched_getaffinity(0))
    if load[0] > 0.5 * cpus:
        print(f"warning: the machine is busy (load {load[0]:.1f} on {cpus} CPUs): every")
        print("figure, baselines included, is slower and noisier than on an idle machine")
    print(f"reps: {args.reps} per call, warm-up: {args.warmup}; all peers on 127.0.0.1")
    print()
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-providers-"))
    results: list[Result] = []
    try:
        for name in args.chosen:
            workdir = root / name
            workdir.mkdir()
            results.append(await run_provider(name, workdir, reps=args.reps, warmup=args.warmup))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in results:
        if r.peer:
            print(f"{r.provider}: {r.peer}")
    print()
    for line in table(results):
        print(line)
    print()
    print("median/p95: wall time of the whole call, nearest-rank p95; × baseline: median ÷")
    print("the baseline's median; →1st call: op start → the driver's first peer call")
    print("(its call method entered); calls: peer calls the driver made per op.")
    for r in results:
        for note in r.notes:
            print(textwrap.fill(note, width=92, initial_indent="- ", subsequent_indent="  "))
    print("- approval → first call through the server: bench/repair_path.py.")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 1 if any(r.failed for r in results) else 0


def main() -> int:
    args = parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
