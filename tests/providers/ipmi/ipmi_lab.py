"""Test helpers for the IPMI provider: OpenIPMI's ``ipmi_sim`` as a BMC on loopback,
BMCs that never answer, and an in-memory ``HostDirectory``.

``ipmi_sim`` has no power of its own to emulate: every chassis command goes to a
``chassis_control`` program (``<prog> set power "1"``, ``<prog> get power`` printing
``power:1``). Ours keeps the power state in a file and appends every ``set`` to a
transitions file, so a test sees each power transition, reset and boot override the
BMC was asked for: the peer's view, not the driver's.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.providers.base import Credential, HostAccess

BMC_USER = "gpufleet"
BMC_PASSWORD = "bmc-Pa55-zq7"  # distinctive, so a leak is found by searching for it

_CHASSIS_SCRIPT = """#!/bin/sh
# ipmi_sim's chassis_control program: "$0 set power 1 ...", or "$0 get power boot".
dir={dir}
op=$1; shift
if [ "$op" = set ]; then
  while [ $# -gt 1 ]; do
    echo "$1 $2" >> "$dir/transitions"
    case $1 in
      power) echo "$2" > "$dir/power" ;;
      boot) echo "$2" > "$dir/boot" ;;
    esac
    shift 2
  done
elif [ "$op" = get ]; then
  for name in "$@"; do
    case $name in
      power) echo "power:$(cat "$dir/power")" ;;
      boot) echo "boot:$(cat "$dir/boot")" ;;
    esac
  done
fi
"""

_LAN_CONF = """name "gpufleet-test-bmc"
set_working_mc 0x20
startlan 1
  addr 127.0.0.1 {port}
  priv_limit admin
  allowed_auths_callback md5
  allowed_auths_user md5
  allowed_auths_operator md5
  allowed_auths_admin md5
  guid a123456789abcdefa123456789abcdef
endlan
chassis_control "{script}"
user 2 true "{user}" "{password}" admin 10 md5
"""

_EMU = """mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
mc_enable 0x20
"""


def require_tools() -> None:
    """Fail (never skip) when the IPMI tools are missing: CI installs them."""
    missing = [t for t in ("ipmi_sim", "ipmitool") if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: install the Debian packages openipmi "
            "and ipmitool (.ci/run does)",
            pytrace=False,
        )


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class IpmiSim:
    """One ``ipmi_sim`` BMC on 127.0.0.1, and what it was asked to do."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.port = free_udp_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        script = self.dir / "chassis-control.sh"
        script.write_text(_CHASSIS_SCRIPT.format(dir=self.dir))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        (self.dir / "power").write_text("1\n")
        (self.dir / "boot").write_text("default\n")
        (self.dir / "transitions").write_text("")
        (self.dir / "state").mkdir()
        conf = self.dir / "lan.conf"
        conf.write_text(
            _LAN_CONF.format(port=self.port, script=script, user=BMC_USER, password=BMC_PASSWORD)
        )
        (self.dir / "sim.emu").write_text(_EMU)
        log = (self.dir / "ipmi_sim.log").open("ab")
        argv = ["ipmi_sim", "-n", "-c", str(conf), "-f", str(self.dir / "sim.emu")]
        self.proc = subprocess.Popen(
            [*argv, "-s", str(self.dir / "state")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        target = ["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(self.port)]
        session = ["-U", BMC_USER, "-E", "-N", "1", "-R", "1"]
        argv = ["ipmitool", *target, *session, "chassis", "power", "status"]
        env = {**os.environ, "IPMI_PASSWORD": BMC_PASSWORD}
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = (self.dir / "ipmi_sim.log").read_text()
                pytest.fail(f"ipmi_sim exited {self.proc.returncode}: {log}", pytrace=False)
            done = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=10)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"ipmi_sim not answering: {done.stderr.decode()}", pytrace=False)
            time.sleep(0.1)  # real sleep: a real process starting

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def transitions(self) -> list[str]:
        """Every ``set`` the BMC passed on, in order: "power 0", "reset 1", "boot pxe"."""
        return (self.dir / "transitions").read_text().splitlines()

    def mark(self) -> int:
        return len(self.transitions())

    def transitions_since(self, mark: int) -> list[str]:
        return self.transitions()[mark:]

    def set_power(self, on: bool) -> None:
        """Flip the simulated machine's power behind the driver's back."""
        (self.dir / "power").write_text("1\n" if on else "0\n")

    def access(
        self,
        host_id: str,
        *,
        password: str = BMC_PASSWORD,
        cluster_id: str | None = None,
        port: int | None = None,
    ) -> HostAccess:
        return HostAccess(
            host_id=host_id,
            hostname=f"{host_id}.lab",
            address="127.0.0.1",
            port=port or self.port,
            credential=Credential(username=BMC_USER, secret=password),
            cluster_id=cluster_id,
            serial=f"SN-{host_id}",
            rack="r1",
        )


class SilentBmc:
    """A UDP socket that reads every packet and never answers: a hung BMC."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            self.received += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@dataclass
class MemoryDirectory:
    """An in-memory ``HostDirectory``: hosts by id, each cluster's pool of spares."""

    by_id: dict[str, HostAccess] = field(default_factory=dict)
    spares: dict[str, list[str]] = field(default_factory=dict)  # cluster id -> host ids
    claims: dict[tuple[str, str], str] = field(default_factory=dict)  # (cluster, token)
    released: list[str] = field(default_factory=list)

    def add(self, access: HostAccess, *, spare: bool = False) -> HostAccess:
        self.by_id[access.host_id] = access
        if spare and access.cluster_id is not None:
            self.spares.setdefault(access.cluster_id, []).append(access.host_id)
        return access

    async def host(self, host_id: str) -> HostAccess | None:
        return self.by_id.get(host_id)

    async def hosts(self, cluster_id: str) -> list[HostAccess]:
        return [h for h in self.by_id.values() if h.cluster_id == cluster_id]

    async def claim_spare(self, cluster_id: str, client_token: str) -> HostAccess | None:
        claimed = self.claims.get((cluster_id, client_token))
        if claimed is None:
            pool = self.spares.get(cluster_id, [])
            if not pool:
                return None
            claimed = pool.pop(0)
            self.claims[(cluster_id, client_token)] = claimed
        return self.by_id[claimed]

    async def release(self, host_id: str) -> None:
        if host_id not in self.released:
            self.released.append(host_id)
