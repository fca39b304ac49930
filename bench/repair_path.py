"""Approval → first BMC call, and the whole reboot, through the server, per bare-metal kind.

    python bench/repair_path.py [--providers ipmi,redfish,ssh] [--reps 5]

Per provider, a bare-metal cluster of one node runs in-process on SQLite, on a fake clock,
behind its real peer on 127.0.0.1 (OpenIPMI's ``ipmi_sim``, sushy-tools' emulator, a real
sshd), the machine behind it played by the tests' stand-in
(``gpufleet.testing.machine_room``): created through the API, its host imported, its
agent enrolled. Each repetition injects Xid 79 into the machine, waits for the proposal,
then measures:

* **approve → reboot call**: from the approve request to the server's driver entering
  ``reboot`` (the BMC is asked a few µs later: bench/providers.py's "→1st call"),
  running only the repair executor, pass after pass, and counting the passes. This is
  the server's own work on the path (cordon, drain, the request recorded before the
  call); in production each pass also waits ``GPUFLEET_REPAIR_INTERVAL_S``.
* **approve → repair succeeded**: the whole reboot, every loop and agent stepped on the
  fake clock 5 s at a time until the agent reports a new boot id and the node verifies
  clean. Wall time is the server's work, the peer's calls and the stand-in's; the fake
  seconds (the simulated machine's 20 s boot, the verify settle) are not waited out.
* **baseline**: the peer's own call, made raw in the same run (``ipmitool chassis power
  status``; an ``httpx`` GET of the system; an ``asyncssh`` connect + ``true``).

Between repetitions the fake clock moves 8 days, past the ladder's window, so each
repetition is a first reboot. Nothing is asserted; exit 1 when a provider could not run
(its row says why).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The peers are the tests' own (tests/providers/peers.py), so the benchmark drives exactly
# what the tests do; bench/ runs from a checkout with tests/ next to it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import machine_lines, percentile

# tests/providers is a namespace package: bench/providers.py would shadow it.
_BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]

KINDS = ("ipmi", "redfish", "ssh")
KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="  # a throwaway 32-byte key
HOSTNAME = "bench-01"


@dataclass
class Row:
    kind: str
    peer: str = ""
    baseline: list[float] = field(default_factory=list)
    first_call: list[float] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)
    whole: list[float] = field(default_factory=list)
    ticks: list[int] = field(default_factory=list)
    failed: str | None = None


def _blocking(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    """A baseline made raw: the blocking call itself, on this thread, no executor hop."""

    async def call() -> None:
        fn()

    return call


def _peer(kind: str, workdir: Path) -> AbstractContextManager[Any]:
    from providers.peers import ipmi_peer, redfish_peer, ssh_peer

    return {"ipmi": ipmi_peer, "redfish": redfish_peer, "ssh": ssh_peer}[kind](workdir)


def _baseline(kind: str, peer: Any) -> Callable[[], Awaitable[None]]:
    """The peer's own call, made raw."""
    if kind == "ipmi":
        from gpufleet.providers.base import Credential, HostAccess
        from gpufleet.providers.ipmi.client import IpmitoolClient
        from gpufleet.providers.ipmi.config import IpmiConfig

        access = HostAccess(
            host_id="raw", hostname=HOSTNAME, address=peer.address, port=peer.port,
            credential=Credential(username=peer.username, secret=peer.secret),
        )  # fmt: skip
        argv = IpmitoolClient(IpmiConfig(cipher_suite=3)).argv(
            access, ("chassis", "power", "status")
        )
        env = {"PATH": os.environ.get("PATH", ""), "IPMI_PASSWORD": peer.secret}

        def ipmitool() -> None:
            subprocess.run(argv, env=env, capture_output=True, check=True, timeout=20)

        return _blocking(ipmitool)
    if kind == "redfish":
        from providers.redfish.redfish_fakes import SYSTEMS

        url = f"{peer.address}/redfish/v1/Systems/{next(iter(SYSTEMS))}"
        http = httpx.Client(auth=(peer.username, peer.secret), timeout=10)

        def get() -> None:
            http.get(url).raise_for_status()

        return _blocking(get)
    import asyncssh

    key = asyncssh.import_private_key(peer.secret)
    known = asyncssh.import_known_hosts(f"* {peer.host_key}\n")

    async def connect() -> None:
        async with asyncssh.connect(
            peer.address, peer.port, username=peer.username, client_keys=[key],
            known_hosts=known, preferred_auth="publickey", config=[], agent_path=None,
        ) as conn:  # fmt: skip
            await conn.run("true", check=True)

    return connect


async def _run(kind: str, workdir: Path, reps: int) -> Row:
    from gpufleet.server.workers.repairs.executor import RepairExecutor
    from gpufleet.testing.fleet import sim_app
    from gpufleet.testing.machine_room import (
        IpmiView,
        MachineRoom,
        PeerView,
        RedfishView,
        SshView,
        use_logged_ssh_reboot,
        use_quick_redfish,
    )
    from providers.redfish.redfish_fakes import SYSTEMS

    row = Row(kind)
    with _peer(kind, workdir / "peer") as peer:
        row.peer = f"{kind} peer on 127.0.0.1:{peer.port or peer.address.rsplit(':', 1)[-1]}"
        baseline = _baseline(kind, peer)
        url = f"sqlite+aiosqlite:///{workdir / 'gpufleet.db'}"
        async with (
            sim_app(
                url,
                workdir,
                policy={"breaker_max_share": 1.0},
                secret_key=KEY,
                ipmi_cipher_suite=3,
            ) as fleet,  # fmt: skip
            httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
        ):
            view: PeerView
            if kind == "ipmi":
                view = IpmiView({HOSTNAME: peer.peer})
            elif kind == "redfish":
                use_quick_redfish(fleet)
                view = RedfishView(peer.peer.journal, {HOSTNAME: next(iter(SYSTEMS))})
            else:
                use_logged_ssh_reboot(fleet, workdir / "reboots.log")
                view = SshView(workdir / "reboots.log")
            room = MachineRoom(fleet, kind, view, http)
            fleet.loops.insert(0, room)  # type: ignore[arg-type]
            node_id = await _metal_cluster(fleet, room, kind, peer)
            executor = fleet.loop(RepairExecutor)
            client = fleet.app.client
            for _ in range(reps):
                started = time.perf_counter()
                await baseline()
                row.baseline.append(time.perf_counter() - started)
                fleet.world.inject_fault(room.sim_id(HOSTNAME), signature_id="xid-79")
                repair = await fleet.until(lambda: fleet.proposed_for(node_id), what="proposal")
                calls = len(room.calls)
                started = time.perf_counter()
                approved = await client.post(
                    f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "bench"}
                )
                approved.raise_for_status()
                passes = 0
                while not [c for c in room.calls[calls:] if c[0] == "reboot"] and passes < 50:
                    await executor.run_once()
                    passes += 1
                entered = next(t for name, t in room.calls[calls:] if name == "reboot")
                row.first_call.append(entered - started)
                row.passes.append(passes)
                ticks = 0
                while (await fleet.repair(repair["id"]))["status"] not in ("succeeded", "failed"):
                    await fleet.tick(5)
                    ticks += 1
                    if ticks > 200:
                        raise RuntimeError(f"repair {repair['id']} did not end")
                row.whole.append(time.perf_counter() - started)
                row.ticks.append(ticks)
                done = await fleet.repair(repair["id"])
                if done["status"] != "succeeded":
                    raise RuntimeError(f"the reboot failed: {done['detail']}")
                fleet.clock.advance(8 * 86400)  # past the ladder's window: a first reboot again
                await fleet.tick(0)
    return row


async def _metal_cluster(fleet: Any, room: Any, kind: str, peer: Any) -> str:
    client = fleet.app.client
    stored = await client.put(
        f"/api/v1/projects/ml/credentials/{peer.credential}",
        json={"kind": peer.credential_kind, "username": peer.username, "secret": peer.secret},
    )
    stored.raise_for_status()
    created = await client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "metal", "size": 1, "provider": kind,
              "acceptance_tests": False},
    )  # fmt: skip
    created.raise_for_status()
    cid = created.json()["id"]
    imported = await client.post(
        "/api/v1/projects/ml/hosts/import",
        json={"hosts": [peer.row(cluster="metal", hostname=HOSTNAME)]},
    )
    imported.raise_for_status()
    issued = await client.post(f"/api/v1/clusters/{cid}/enroll-token", json={"ttl_s": 3600})
    issued.raise_for_status()
    room.enroll_token = issued.json()["token"]
    await fleet.until(lambda: fleet.status_is(cid, "ready"), ticks=30, what="cluster ready")
    nodes = (await fleet.get("/api/v1/nodes", cluster=cid))["items"]
    return str(nodes[0]["id"])


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}" if values else ""


def _p95(values: list[float]) -> str:
    return f"{percentile(sorted(values), 95) * 1000:.1f}" if values else ""


def _table(rows: list[Row]) -> Iterator[str]:
    head = (
        "provider", "baseline ms", "approve→reboot call ms", "p95", "passes",
        "approve→succeeded ms", "p95", "ticks", "× baseline",
    )  # fmt: skip
    cells: list[tuple[str, ...]] = [head]
    for r in rows:
        if r.failed is not None:
            cells.append((r.kind, f"not run: {r.failed}", *[""] * 7))
            continue
        base = statistics.median(r.baseline)
        cells.append((
            r.kind, _ms(r.baseline), _ms(r.first_call), _p95(r.first_call),
            f"{min(r.passes)}-{max(r.passes)}", _ms(r.whole), _p95(r.whole),
            f"{min(r.ticks)}-{max(r.ticks)}", f"{statistics.median(r.whole) / base:.0f}",
        ))  # fmt: skip
    widths = [max(len(c[i]) for c in cells if not c[1].startswith("not run")) for i in range(9)]
    for c in cells:
        if c[1].startswith("not run"):
            yield f"{c[0]:<{widths[0]}}  {c[1]}"
            continue
        yield "  ".join(
            [c[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(c[1:], widths[1:], strict=True)]
        )


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--providers", default=",".join(KINDS), help="default: %(default)s")
    parser.add_argument("--reps", type=int, default=5, help="reboots per provider (default 5)")
    args = parser.parse_args(argv)
    args.chosen = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in args.chosen if p not in KINDS]
    if unknown or not args.chosen or args.reps < 1:
        parser.error(f"--providers from {', '.join(KINDS)}; --reps >= 1 (got {unknown})")
    return args


async def _main(args: argparse.Namespace) -> int:
    for line in machine_lines():
        print(line)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"reps: {args.reps} reboots per provider; SQLite; peers on 127.0.0.1\n")
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-repair-"))
    rows: list[Row] = []
    try:
        for kind in args.chosen:
            (root / kind).mkdir()
            try:
                rows.append(await _run(kind, root / kind, args.reps))
            except BaseException as exc:  # the tests' helpers fail through pytest.fail
                if isinstance(exc, KeyboardInterrupt | SystemExit | asyncio.CancelledError):
                    raise
                first = (str(exc).strip().splitlines() or ["(no message)"])[0]
                rows.append(Row(kind, failed=f"{type(exc).__name__}: {first[:300]}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for line in _table(rows):
        print(line)
    print()
    print("baseline: the peer's own call, raw. approve→reboot call: approve request →")
    print("the server's driver entering reboot, the repair executor run pass after pass")
    print("(passes: how many; production waits GPUFLEET_REPAIR_INTERVAL_S between them).")
    print("approve→succeeded: the whole reboot to a verified node, every loop and agent")
    print("stepped 5 fake seconds a tick (ticks: how many); the simulated boot is not")
    print("waited out, a real machine's boot (minutes) comes on top. × baseline: the")
    print("whole reboot's median ÷ the baseline's. Medians and nearest-rank p95.")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 1 if any(r.failed for r in rows) else 0


def main() -> int:
    return asyncio.run(_main(_args()))


if __name__ == "__main__":
    sys.exit(main())
